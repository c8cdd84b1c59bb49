"""The package's layout: commands on top, the library below, every import pointing down."""

import ast
import importlib
import pathlib
import tomllib

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "translate"
# The commands: flags, logging and `main`. Nothing in the library may import them.
COMMANDS = {"train", "evaluate", "translate_text", "translate", "sample", "export"}


def imported_modules(path: pathlib.Path) -> set[str]:
    """The `translate` modules a file imports anywhere: at the top, in functions, in `if`s."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from translate import cli` imports translate.cli; `from translate.x import y`, x.
            if node.module == "translate":
                names = [f"translate.{alias.name}" for alias in node.names]
            else:
                names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "translate" and len(parts) > 1:
                found.add(parts[1])
    return found - {"configs"}


def import_graph() -> dict[str, set[str]]:
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    return {m: imported_modules(PACKAGE / f"{m}.py") & modules for m in sorted(modules)}


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


def test_every_command_module_exists():
    # The test above says nothing if a command is renamed and this list is not.
    assert all((PACKAGE / f"{name}.py").is_file() for name in COMMANDS)


def test_the_walk_finds_imports_inside_functions_and_circles(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from translate import cli\n    import translate.model\n")
    assert imported_modules(source) == {"cli", "model"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_console_scripts_point_at_the_commands_themselves():
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    for script, target in pyproject["project"]["scripts"].items():
        module, _, function = target.partition(":")
        assert module.removeprefix("translate.") in COMMANDS, script
        assert callable(getattr(importlib.import_module(module), function)), script
