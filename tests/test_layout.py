"""The package's layout: commands on top, the library below in family folders, imports down."""

import ast
import importlib
import pathlib
import re
import tomllib

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
}
# The library's families, one folder each (docs/architecture.md's layout).
FAMILIES = {"models", "data", "decoding", "training", "engines", "pipeline"}


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
                found.add(".".join(parts[1:-1]))  # `from translate.x import name`: module x
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
PROSE_ROOTS = ("README.md", "BENCHMARKS.md", "docs", "configs", "translate", "scripts", "tests")
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
