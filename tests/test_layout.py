"""The package's layout: commands on top, the library below in family folders, imports down."""

import ast
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import inspect
import io
import pathlib
import re
import tokenize
import tomllib
from collections.abc import Collection

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "translate"
# The commands: flags, logging and `main`. Nothing in the library may import them.
COMMANDS = {
    "train",
    "evaluate",
    "translate_text",
    "score",
    "sample",
    "export",
    "translate_data",
    "distill",
    "import_model",
}
# The library's families, one folder each (docs/architecture.md's layout).
FAMILIES = {"models", "data", "decoding", "training", "engines", "pipeline", "pretrained"}


def module_names(package: pathlib.Path = PACKAGE) -> set[str]:
    """Every module of the package, dotted below `translate`: "cli", "models.factory", and a
    folder's `__init__` by the folder's name ("models")."""
    names = set()
    for path in package.rglob("*.py"):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and parts[0] != "configs":
            names.add(".".join(parts))
    return names


def imported_modules(path: pathlib.Path, modules: set[str] | None = None) -> set[str]:
    """The `translate` modules a file imports anywhere: at the top, in functions, in `if`s.

    `from translate.data import synthetic` imports the module "data.synthetic" when there is
    one (`modules`), else names from the package "data".
    """
    modules = module_names() if modules is None else modules
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "translate" or len(parts) < 2:
                continue
            dotted = ".".join(parts[1:])
            if dotted in modules:
                found.add(dotted)
            elif ".".join(parts[1:-1]) in modules:
                found.add(".".join(parts[1:-1]))  # `from translate.NAME import name`: module NAME
    return found - {"configs"}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    graph = {}
    for name in sorted(modules):
        path = PACKAGE.joinpath(*name.split("."))
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        # A module's own package (its __init__) runs first anyway: not an edge of its own.
        graph[name] = imported_modules(path, modules) - {name, name.rpartition(".")[0]}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, str] = {}  # "open" while on the path, "done" after

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[module] = "done"
        return None

    for module in graph:
        if module not in state and (cycle := visit(module, [module])):
            return cycle
    return None


def test_no_module_of_the_package_imports_itself_in_a_circle():
    assert find_cycle(import_graph()) is None, " -> ".join(find_cycle(import_graph()))


def test_no_library_module_imports_a_command():
    offenders = {
        module: sorted(imports & COMMANDS)
        for module, imports in import_graph().items()
        if module not in COMMANDS and imports & COMMANDS
    }
    assert not offenders


def test_the_walk_covers_the_family_folders():
    graph = import_graph()
    for family in FAMILIES:
        assert (PACKAGE / family / "__init__.py").is_file(), family
        assert any(m.startswith(f"{family}.") for m in graph), family
    # The walk sees imports of family modules: the trainer reads data, builds models, decodes.
    assert {"data.sources", "models.factory", "decoding.report"} <= graph["training.trainer"]


def test_commands_are_at_the_top_and_the_families_are_folders():
    top = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert COMMANDS <= top
    assert all((PACKAGE / f"{name}.py").is_file() for name in COMMANDS)
    assert not top & FAMILIES


def test_nothing_in_models_asks_the_hardware():
    # The factory resolves the dtype and the attention kernel once (translate/devices.py) and
    # passes them in; the models themselves never ask which device they run on.
    asks = ("default_backend", "devices", "local_devices", "DeviceFacts", "device_kind")
    for path in (PACKAGE / "models").glob("*.py"):
        if path.stem == "factory":
            continue
        tree = ast.parse(path.read_text(), str(path))
        names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not names & set(asks), (path.name, sorted(names & set(asks)))
        assert "devices" not in imported_modules(path), path.name


def test_the_walk_finds_imports_inside_functions_and_circles(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "def f():\n    from translate import cli\n    import translate.models.transformer\n"
        "from translate.data import synthetic\nfrom translate.models.factory import make_model\n"
    )
    assert imported_modules(source) == {
        "cli",
        "models.transformer",
        "data.synthetic",
        "models.factory",
    }
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_console_scripts_point_at_the_commands_themselves():
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    for script, target in pyproject["project"]["scripts"].items():
        module, _, function = target.partition(":")
        assert module.removeprefix("translate.") in COMMANDS, script
        assert callable(getattr(importlib.import_module(module), function)), script


def test_every_family_folder_is_an_installed_package():
    # A folder missing from pyproject's packages would be left out of a non-editable install.
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    packages = set(pyproject["tool"]["setuptools"]["packages"])
    assert {f"translate.{family}" for family in FAMILIES} <= packages


def mutual_core_family_imports(
    graph: dict[str, set[str]], families: set[str] = FAMILIES
) -> list[tuple[str, str]]:
    """(core module, family) pairs that import each other: the core module imports a module
    of the family, and a module of the family imports the core module."""
    core = {m for m in graph if "." not in m and m not in COMMANDS and m not in families}
    pairs = []
    for module in sorted(core):
        for family in sorted(families):
            members = {m for m in graph if m.startswith(f"{family}.")}
            down = graph[module] & members
            up = {m for m in members if module in graph[m]}
            if down and up:
                pairs.append((module, family))
    return pairs


def test_no_core_module_and_family_import_each_other():
    # The core is the ground the families stand on: a core module may use a family (the
    # tokenizer, the model factory) only where no module of that family needs it back, so the
    # family stays a layer above or below it, never both (workdir.py and data/ once were).
    assert mutual_core_family_imports(import_graph()) == []
    circle = {"a": {"f.x"}, "f.x": {"a"}, "f": set(), "b": {"f.x"}}
    assert mutual_core_family_imports(circle, {"f"}) == [("a", "f")]


def test_the_data_family_takes_paths_not_a_workdir():
    graph = import_graph()
    assert not any("workdir" in graph[m] for m in graph if m.startswith("data."))


# What the repository's prose may not hold: it describes the code, not the work that made it.
# One letter of each word sits in brackets (s[e]ssion), the grep idiom by which a pattern does
# not match its own source, so this file is scanned like any other.
ORDINALS = (
    "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
    "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
    "last|next|earlier|previous|later"
)
SITTINGS = "r[o]und|s[e]ssion|v[i]sit|s[i]tting"
HISTORY = {
    "a tracker number": r"\biss[u]es? ?#?\d+",
    "an ordinal of the work's sittings": rf"\b({ORDINALS})[- ]({SITTINGS})s?\b",
    "a word of borrowing the GPU": r"\b(le[n]t|le[a]sed?|lo[a]n|device t[o]ol|device t[i]me)\b",
    "a path outside the clone": r"\.\./s[h]ared",
}
# pytest's own uses of the word stay: a fixture's scope="session", "test session" and
# "pytest session" for one run of the suite, `request.session`, and the parameter of a
# `pytest_session*` hook. Any other is the work's, not the code's.
THE_WORD = r"\bs[e]ssions?\b"
PYTESTS_USES = (
    r"""scope=["']s[e]ssion["']|\b(py)?test s[e]ssion\b|\brequest\.s[e]ssion\b"""
    r"|\bdef pytest_\w+\(s[e]ssion\b"
)
PROSE_ROOTS = (
    "README.md",
    "BENCHMARKS.md",
    "pyproject.toml",
    "requirements.txt",
    "requirements-gpu.txt",
    "docs",
    "configs",
    "translate",
    "scripts",
    "tests",
)
PROSE_SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt"}


def history_words(line: str) -> list[str]:
    """The names of what a line holds of HISTORY, and of THE_WORD outside pytest's uses."""
    found = [name for name, pattern in HISTORY.items() if re.search(pattern, line, re.I)]
    if re.search(THE_WORD, re.sub(PYTESTS_USES, "", line, flags=re.I), re.I):
        found.append("the word of a sitting, not pytest's")
    return found


def prose_files(root: pathlib.Path = PACKAGE.parent) -> list[pathlib.Path]:
    files = []
    for name in PROSE_ROOTS:
        path = root / name
        found = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        files += [
            p
            for p in found
            if p.is_file()
            and p.suffix in PROSE_SUFFIXES
            and not any(part.startswith(".") or part == "__pycache__" for part in p.parts)
        ]
    return files


def test_the_repository_speaks_of_the_code_not_of_how_it_was_made():
    root = PACKAGE.parent
    offenders = []
    for path in prose_files(root):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for what in history_words(line):
                offenders.append(f"{path.relative_to(root)}:{number}: {what}")
    assert not offenders, "\n".join(offenders)


def test_the_history_patterns_catch_the_work_and_spare_pytest():
    word = "ses" + "sion"
    caught = [
        "see iss" + "ue 58",
        "Iss" + "ues #40",
        "the thirteenth " + word,
        "the next vis" + "it",
        "an earlier rou" + "nd",
        "while the GPU was le" + "nt",
        "ask the device to" + "ol",
        "../" + "shared/data/multi30k",
        f"a {word} of measurements",
    ]
    spared = [
        f'@pytest.fixture(scope="{word}")',
        f"this module's copy of the test {word}'s tiny run",
        f"def pytest_{word}finish({word}, exitstatus):",
        f"request.{word}.config",
        f"subprocess.Popen(args, start_new_{word}=True)",
        "round to the nearest even; the first visitor; lentil",
    ]
    assert [line for line in caught if not history_words(line)] == []
    assert [(line, history_words(line)) for line in spared if history_words(line)] == []


# Pointers in the prose: each file path and dotted name that a docstring, a comment, a flag's
# help or a Markdown page writes names something that exists. A path resolves against the
# folder of the file that writes it, the repository's root, the package, or a folder the same
# text named before it (`translate/models/` and then `attention.py`, `layers.py`); a path
# followed by 's and an identifier (`models/dropout.py`'s `hashed_words`) names an attribute of
# that module. A dotted name resolves as a module here and its attributes (`translate.cli`,
# `losses.projected_cross_entropy`: a short head is any module of that name, in the package or
# in scripts/; a module's functions and classes are those it defines, not those it imports),
# or as a config field (`config.model.d_model`, `train.init_from`). Not pointers: other
# packages' names (`jax.nn`), files of data and outputs (`train.en`, `report.json`), URLs, a
# commit's file (`git show COMMIT:PATH`), placeholders (`scripts.NAME`), the parameters of the
# function a docstring describes, and ELSEWHERE.
FILE = r"(?:[\w.-]+/)*[\w-]+\.(?:py|md|sh|toml)\b"
FOLDER = r"(?:[\w.-]+/)+(?![\w.-])"
# A dotted name may break at a line's end before a name holding an underscore, unless that name
# opens an argument's entry (`on_batch: ...`).
NAME = r"[A-Za-z_]\w*(?:\.(?:\s*\n\s*(?=[a-z]\w*_\w*\b(?!:)))?[A-Za-z_]\w*)+"
POINTER = re.compile(
    rf"(?<![\w/.:-])(?:(?P<file>{FILE})|(?P<folder>{FOLDER}))|(?<![\w.])(?<!\w-)(?P<name>{NAME})"
)
ATTRIBUTE = re.compile(r"`?'s (?:`(\w+)`|(\w*_\w*|[A-Z][a-z]+[A-Z]\w*)\b)")
# The last part of a file name of data or outputs (`train.en`, `report.json`), not a module.
FILE_SUFFIXES = {"json", "jsonl", "txt", "png", "bin", "safetensors", "lock", "perl", "en", "de"}
PLACEHOLDERS = re.compile(r"(?<![A-Za-z])(?:NAME|SECTION|FIELD)(?![A-Za-z])")
ELSEWHERE = {
    # Other projects' files and names that share a name with a module here.
    "get_ende_bleu.sh",  # tensor2tensor's
    "task1-tokenize.sh",  # Multi30k's
    "scripts/task1-tokenize.sh",
    "models.py",  # Flax's examples/wmt
    "memory.max",  # cgroup v2's
    "memory.limit_in_bytes",  # cgroup v1's
    "loop.call_soon_threadsafe",  # asyncio's
    "model.generate",  # transformers'
    # The reader's own files in examples, and the misspelt field that a refusal names.
    "mine.py",
    "configs/my_student.py",
    "config.model.d_modle",
}
ROOT = PACKAGE.parent
INSTALLED_AS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"
]


def prose_of(path: pathlib.Path) -> list[tuple[int, str, set[str]]]:
    """(first line, text, names of values) of what a file says to its reader: a Markdown page
    whole; each run of `#` comment lines; each docstring, with its function's parameters as
    the names of values; and each `Flag`'s help, which --help prints."""
    text = path.read_text()
    if path.suffix == ".md":
        return [(1, text, set())]
    if path.suffix == ".py":
        tokens = tokenize.generate_tokens(io.StringIO(text).readline)
        comments = [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    else:
        lines = enumerate(text.splitlines(), 1)
        comments = [(n, line.strip()) for n, line in lines if line.strip().startswith("#")]
    found: list[tuple[int, str, set[str]]] = []
    for number, comment in comments:
        if found and number == found[-1][0] + found[-1][1].count("\n") + 1:
            found[-1] = (found[-1][0], found[-1][1] + "\n" + comment.lstrip("#"), set())
        else:
            found.append((number, comment.lstrip("#"), set()))
    if path.suffix != ".py":
        return found
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if (doc := ast.get_docstring(node, clean=False)) is not None:
                args = node.args if hasattr(node, "args") else ast.arguments()
                values = {a.arg for a in ast.walk(args) if isinstance(a, ast.arg)}
                found.append((node.body[0].lineno, doc, values))
        elif isinstance(node, ast.Call) and "Flag" in (
            getattr(node.func, n, "") for n in ("id", "attr")
        ):
            for arg in [*node.args, *(keyword.value for keyword in node.keywords)]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((arg.lineno, arg.value, set()))
    return found


@functools.cache
def modules_named(short: str) -> tuple[str, ...]:
    """The modules here whose dotted name ends in `short`; none when another installed package
    takes the name (`ctranslate2`)."""
    if short in ("translate", "scripts", *INSTALLED_AS.values()):
        return (short,)
    names = [f"translate.{m}" for m in module_names()]
    names += [
        ".".join(p.relative_to(ROOT).with_suffix("").parts) for p in ROOT.glob("scripts/**/*.py")
    ]
    found = tuple(sorted(n for n in names if n.rpartition(".")[2] == short))
    return found if found and importlib.util.find_spec(short) is None else ()


def resolves(obj: object, names: list[str]) -> bool:
    """Whether `names` are attributes one of the next, from `obj`; submodules are imported."""
    for name in names:
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            if name in {f.name for f in dataclasses.fields(obj)}:
                return True  # a field without a default is no class attribute
        if not hasattr(obj, name) and hasattr(obj, "__path__"):
            with contextlib.suppress(ModuleNotFoundError):
                importlib.import_module(f"{obj.__name__}.{name}")
        if not hasattr(obj, name):
            return False
        value = getattr(obj, name)
        if inspect.ismodule(obj) and not hasattr(obj, "__path__"):
            if inspect.isfunction(value) or inspect.isclass(value):
                if value.__module__ != obj.__name__:
                    return False  # imported there: a module's names are those it defines
        obj = value
    return True


def stale_pointers(
    path: pathlib.Path, text: str, values: Collection[str] = ()
) -> list[tuple[int, str]]:
    """(offset, pointer) of each pointer in `text` that names nothing; `path` is the file that
    writes it, `values` the names of values there (the parameters of a docstring's function)."""
    from translate.config import Config

    config = Config()
    sections = {field.name for field in dataclasses.fields(config)}
    text = re.sub(r"https?://\S+", lambda url: " " * len(url[0]), text)
    folders, stale = [path.parent, ROOT, PACKAGE], []
    for match in POINTER.finditer(text):
        pointer = re.sub(r"\s", "", match[0])
        if match["folder"]:
            folders += [f / pointer for f in folders if (f / pointer).is_dir()][:1]
        elif pointer in ELSEWHERE or PLACEHOLDERS.search(pointer):
            continue
        elif match["file"]:
            found = [(f / pointer).resolve() for f in folders if (f / pointer).is_file()]
            if not found:
                stale.append((match.start(), pointer))
                continue
            folders.append(found[0].parent)
            module = found[0].relative_to(ROOT).with_suffix("").parts
            named = ATTRIBUTE.match(text, match.end())
            if named and module[0] in ("translate", "scripts", *INSTALLED_AS.values()):
                if not resolves(importlib.import_module(".".join(module)), [named[1] or named[2]]):
                    stale.append((match.start(), f"{pointer}'s {named[1] or named[2]}"))
        else:
            for package, folder in INSTALLED_AS.items():
                pointer = re.sub(rf"^{re.escape(package)}\b", folder, pointer)
            head, *names = pointer.split(".")
            if head in values or set(names[-1:]) & FILE_SUFFIXES:
                continue
            roots: list[object] = [importlib.import_module(m) for m in modules_named(head)]
            roots += [config] if head == "config" else []
            roots += [getattr(config, head)] if head in sections else []
            if roots and not any(resolves(root, names) for root in roots):
                stale.append((match.start(), pointer))
    return stale


def test_every_path_and_dotted_name_in_the_prose_names_what_exists():
    offenders = []
    for path in prose_files(ROOT):
        for line, text, values in prose_of(path):
            for start, pointer in stale_pointers(path, text, values):
                number = line + text[:start].count("\n")
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {pointer}")
    assert not offenders, "\n".join(offenders)


def test_the_pointer_matcher_catches_stale_names_and_spares_prose():
    here = PACKAGE / "cli.py"
    caught = [
        "resolved once, by translate.factory, so",
        "see `layers.dropout`",
        "(a counter hash, models/layers.py's hashed_words)",
        "(translate/model/attention.py)",
        "as ours interleaves them (layers.\nsinusoidal_positions)",
        "`--config.decode.samplng=topk`",
        "(losses.py, projected_cross_entropy)",
    ]
    spared = [
        "e.g. jax 0.10, i.e. Sec. 3.4, et al. 2018, ctranslate2.Translator, jax.nn.relu",
        "train.en, report.json and metrics.jsonl, https://github.com/google/flax/blob/main/x.py",
        "`config.model.d_model`, data.max_len and `--config.train.init_from=W`",
        "translate.models.factory, `attention.MultiHeadAttention`, losses.projected_cross_entropy",
        "(translate/training/trainer.py, steps.py) and translate/decoding/\nmemory.py",
        "docs/variants.md, ../README.md, test_NAME.py, --config.SECTION.FIELD=VALUE",
        "git show 64aab04:docs/gone.md; translate.configs.tiny; python -m scripts.benchmark",
        "Args:\n  times: the seconds of the decoding.\n  on_batch: called after every batch.",
        "`config/rules.py`'s `SEARCH_RULES`",
    ]
    assert [text for text in caught if not stale_pointers(here, text)] == []
    assert [
        (text, stale_pointers(here, text)) for text in spared if stale_pointers(here, text)
    ] == []
