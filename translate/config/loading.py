"""Config files and the override language: how a `Config` is made from text.

A config file is Python with a `get_config()` that returns a `Config`. Entry points load it
with `load_config(path_or_name, overrides)` (a file, or an example config of configs/ by name),
where overrides come from `--config.<section>.<field>=value` flags; an unknown section or field,
or a value that does not parse as the field's type, is an error that names the flag. A
workdir's config.json is read back through the same overrides (`config_from_dict`), and
`--help` reads each field's description from its comment in sections.py
(`field_descriptions`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import inspect
import io
import json
import pathlib
import textwrap
import tokenize
import traceback
import typing
from typing import Any

from translate.config.choices import choices
from translate.config.schema import Config, unknown_field


def parse_value(text: str, kind: Any, flag: str) -> Any:
    if choices(kind):
        return text  # the choice itself is checked by validate, naming its values
    if typing.get_origin(kind) is tuple:
        return parse_dataclasses(text, typing.get_args(kind)[0], flag)
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return lowered in ("true", "1")
        if kind is int:
            if "e" not in text.lower():
                return int(text)
            # "1e3" is a thousand; "1e999" (infinite) and "1.5e0" name no int.
            number = float(text)
            if not number.is_integer():
                raise ValueError(text)
            return int(number)
        if kind is float:
            return float(text)
        if kind is str:
            return text
    except ValueError:
        pass
    raise ValueError(f"{flag}: cannot parse {text!r} as {kind.__name__}")


def parse_dataclasses(text: str, item: type, flag: str) -> tuple:
    """A JSON list of objects as a tuple of the dataclass `item`, each key one of its fields.

    The values' types and ranges are `Config.validate`'s to check, naming the entry.
    """
    names = [f.name for f in dataclasses.fields(item)]
    form = f"a JSON list of objects with keys {', '.join(names)}"
    try:
        values = json.loads(text)
    except ValueError:
        raise ValueError(f"{flag}: cannot parse {text!r} as {form}") from None
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        raise ValueError(f"{flag}: cannot parse {text!r} as {form}")
    for value in values:
        for key in value:
            if key not in names:
                raise ValueError(f"{flag}: {key!r} is not a key of {form}")
    return tuple(item(**value) for value in values)


def apply_override(config: Config, dotted: str, text: str) -> None:
    """Sets `config.<section>.<field>` from its command-line text, checking name and type."""
    kind = config_field_type(dotted)
    section, name = dotted.split(".")
    setattr(getattr(config, section), name, parse_value(text, kind, f"--config.{dotted}"))


def packaged_configs_dir() -> pathlib.Path:
    """The example configs: `translate/configs/` once installed, `configs/` in a checkout.

    pyproject.toml installs the checkout's top-level `configs/` as the package
    `translate.configs`; an editable install and a plain checkout read it where it is.
    """
    package = pathlib.Path(__file__).parent.parent  # translate/
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


def packaged_config_names() -> list[str]:
    return sorted(p.stem for p in packaged_configs_dir().glob("*.py") if p.stem != "__init__")


def find_config(name_or_path: str | pathlib.Path) -> pathlib.Path:
    """A config file by path (`configs/base.py`), or an example config by name (`base`).

    Raises FileNotFoundError naming --config and the example configs when neither exists.
    """
    path = pathlib.Path(name_or_path)
    if path.is_file():
        return path
    text = str(name_or_path)
    if text and path.name == text and not path.suffix:
        packaged = packaged_configs_dir() / f"{text}.py"
        if packaged.is_file():
            return packaged
    raise FileNotFoundError(
        f"--config={text}: no config file at {path}, and no example config of that name "
        f"(examples: {', '.join(packaged_config_names())})"
    )


def load_config(path: str | pathlib.Path, overrides: dict[str, str] | None = None) -> Config:
    """Loads `get_config()` from a Python config file and applies dotted overrides.

    Args:
      path: a config file, or the name of an example config (`base`, `multi30k`, ...).
      overrides: `SECTION.FIELD -> text`, as `--config.SECTION.FIELD=text` flags give them.
    """
    path = find_config(path)
    if path.resolve() in _LOADING:  # get_config() loads its own file
        raise ValueError(f"--config={path}: loads itself, without end")
    _LOADING.add(path.resolve())
    try:
        return _load_config_file(path, overrides)
    finally:
        _LOADING.discard(path.resolve())


# The config files being loaded now (one builds on another through load_config).
_LOADING: set[pathlib.Path] = set()


def _load_config_file(path: pathlib.Path, overrides: dict[str, str] | None) -> Config:
    spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    with _errors_named_by_line(path):
        try:
            spec.loader.exec_module(module)
        except ValueError as e:  # NUL bytes or not UTF-8, raised reading it: not Python
            innermost = traceback.extract_tb(e.__traceback__)[-1].filename
            if pathlib.Path(innermost).resolve() == path.resolve():
                raise  # the file's own code raised it: named by line below
            raise ValueError(f"--config={path}: not a Python file ({e})") from None
        if not hasattr(module, "get_config"):
            raise ValueError(f"--config: {path} defines no get_config()")
        required = [
            p.name
            for p in inspect.signature(module.get_config).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
        if required:
            raise ValueError(
                f"--config={path}: get_config() must take no arguments (it needs "
                f"{', '.join(required)}); change a field with --config.section.field=value"
            )
        config = module.get_config()
    if not isinstance(config, Config):
        raise ValueError(f"--config: get_config() in {path} must return translate.config.Config")
    if unknown := unknown_field(config):
        raise ValueError(f"--config={path}: {unknown}")
    for dotted, text in (overrides or {}).items():
        apply_override(config, dotted, text)
    return config.validate()


@contextlib.contextmanager
def _errors_named_by_line(path: pathlib.Path):
    """Turns an error raised by a config file's own code into one naming the file and line.

    A syntax error, or any exception whose innermost frame in `path` is the user's own code
    (a NameError, a bad import), becomes `ValueError("--config=PATH:LINE: ...")`; an error
    raised inside this package while the file runs keeps its traceback.
    """
    try:
        yield
    except RecursionError:
        raise ValueError(f"--config={path}: loads itself, without end") from None
    except SystemExit as e:  # sys.exit() in the file: otherwise a command that did nothing
        lines = [f.lineno for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        where = f"{path}:{lines[-1]}" if lines else str(path)
        raise ValueError(
            f"--config={where}: the config file exits (sys.exit({e.code!r})) while it is read; a "
            "config file defines get_config() and leaves the exiting to the command"
        ) from None
    except SyntaxError as e:
        if e.filename is None:  # raised before a line was read: NUL bytes, say
            raise ValueError(f"--config={path}: not a Python file ({e.msg})") from None
        if pathlib.Path(e.filename).resolve() != path.resolve():
            raise
        raise ValueError(
            f"--config={path}:{e.lineno}: {e.msg} ({(e.text or '').strip()})"
        ) from None
    except Exception as e:
        frames = traceback.extract_tb(e.__traceback__)
        if not frames or pathlib.Path(frames[-1].filename).resolve() != path.resolve():
            raise
        hint = ""
        if isinstance(e, ModuleNotFoundError) and "configs" in str(e):
            hint = (
                "; to build on a shipped config, call translate.config.load_config('tiny') "
                "(a name or a path) in get_config() and change what you need"
            )
        raise ValueError(
            f"--config={path}:{frames[-1].lineno}: {type(e).__name__}: {e}{hint}"
        ) from None


def config_from_dict(values: dict[str, Any]) -> Config:
    """Rebuilds a Config from `to_dict()` output (e.g. the copy saved in a workdir)."""
    config = Config()
    for section, fields in values.items():
        for name, value in fields.items():
            # Strings as they are: JSON's quoting would double every backslash (C:\\data).
            text = value if isinstance(value, str) else json.dumps(value)
            apply_override(config, f"{section}.{name}", text)
    return config


def field_descriptions(section: type) -> dict[str, str]:
    """Each field's description: the `#` comment above it in sections.py, its one source.

    A comment describes the field below it and the fields right after that have none of their
    own (`adam_beta1`, `adam_beta2`, `adam_eps` share "Adam hyper-parameters"); a comment at
    the end of a field's line describes that field alone. Read with `tokenize`, so a string
    that holds `#` or `:` is never taken for a comment or a field.
    """
    source = textwrap.dedent(inspect.getsource(section))
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    body = next(t.end[1] for t in tokens if t.type == tokenize.INDENT)
    descriptions: dict[str, str] = {}
    comment: list[str] = []  # the comment lines above the next field
    shared, last_field, last_row = "", "", -2
    for i, token in enumerate(tokens):
        at_body = token.start[1] == body
        text = token.string.lstrip("#").strip()
        if token.type == tokenize.COMMENT and token.line.lstrip().startswith("#"):
            if at_body:
                comment.append(text)
        elif token.type == tokenize.COMMENT and token.start[0] == last_row:
            descriptions[last_field] = text
        elif at_body and token.type == tokenize.OP and token.string == "@":
            break
        elif at_body and token.type == tokenize.NAME:
            if token.string in ("def", "class"):
                break
            if tokens[i + 1].string != ":":
                continue
            if comment:
                shared, comment = " ".join(comment), []
            elif token.start[0] != last_row + 1:
                shared = ""
            descriptions[token.string] = shared
            last_field, last_row = token.string, token.start[0]
    return descriptions


def config_field_type(dotted: str) -> Any:
    """The type of `Config.<section>.<field>`; ValueError naming the flag when there is none."""
    flag = f"--config.{dotted}"
    parts = dotted.split(".")
    sections = {f.name: f.type for f in dataclasses.fields(Config)}
    if len(parts) != 2 or parts[0] not in sections:
        raise ValueError(f"{flag}: unknown config section; sections are {sorted(sections)}")
    hints = typing.get_type_hints(typing.get_type_hints(Config)[parts[0]])
    if parts[1] not in hints:
        raise ValueError(
            f"{flag}: unknown field {parts[1]!r} of config.{parts[0]}; fields are {sorted(hints)}"
        )
    return hints[parts[1]]
