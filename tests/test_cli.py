"""The command line (translate/cli.py: flags, help, errors, exit codes) and the install."""

import dataclasses
import gc
import importlib
import io
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import typing

import numpy as np
import pytest

from translate import cli, config, translate_text, workdir
from translate.config import field_descriptions, find_config, load_config
from translate.flags import Flag, parse_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Every entry point that reads its flags with parse_flags.
ENTRY_POINTS = [
    "translate.train",
    "translate.evaluate",
    "translate.translate_text",
    "translate.sample",
    "translate.export",
    "scripts.average_checkpoints",
    "scripts.benchmark",
    "scripts.benchmark_batcher",
    "scripts.compare.benchmark_flax_wmt",
    "scripts.fault_injection",
    "scripts.model_summary",
    "scripts.plot_attention",
    "scripts.plot_metrics",
]


def help_of(module: str, capsys) -> str:
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(module).main(["--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


def test_every_config_field_has_a_description():
    for section in dataclasses.fields(config.Config):
        kind = typing.get_type_hints(config.Config)[section.name]
        described = field_descriptions(kind)
        for name in typing.get_type_hints(kind):
            assert described.get(name), f"config.{section.name}.{name} has no # comment above it"


def test_field_descriptions_come_from_the_comment_above_and_are_shared_by_a_group():
    described = field_descriptions(config.TrainConfig)
    assert described["warmup_steps"] == (
        "Linear warm-up steps of the learning-rate schedule (Sec. 5.3)."
    )
    assert described["adam_eps"] == described["adam_beta1"] == "Adam hyper-parameters (Sec. 5.3)."
    # A comment of two lines is one description.
    assert described["on_nonfinite"].startswith("A step whose loss or gradient is not finite")
    assert described["on_nonfinite"].endswith('"skip" carries on and counts such steps in the log.')


def test_help_lists_a_known_field_with_its_default_and_description(capsys):
    text = help_of("translate.train", capsys)
    assert "--config.train.warmup_steps=INT  (default 4000)" in text
    assert "Linear warm-up steps of the learning-rate schedule (Sec. 5.3)." in text
    assert "--config.model.dropout_rate=FLOAT  (default 0.1)" in text
    assert "--workdir=STR" in text and "--force=BOOL  (default False)" in text


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_help_describes_every_flag(module, capsys):
    text = help_of(module, capsys)
    assert "(no description)" not in text
    assert "-h, --help" in text


def test_evaluate_help_lists_only_the_decode_fields_it_takes(capsys):
    text = help_of("translate.evaluate", capsys)
    assert "--config.decode.beam_size=INT  (default 4)" in text
    assert "--config.model." not in text and "--config.train." not in text


def test_flags_take_their_value_after_a_space_or_an_equals_sign():
    known = {"workdir": Flag("", "w"), "step": Flag(-1, "s"), "scale": Flag(1.0, "x")}
    spaced = parse_flags(["--workdir", "/tmp/x", "--step", "-3", "--config.train.seed", "4"], known)
    joined = parse_flags(["--workdir=/tmp/x", "--step=-3", "--config.train.seed=4"], known)
    assert (
        spaced == joined == ({"workdir": "/tmp/x", "step": -3, "scale": 1.0}, {"train.seed": "4"})
    )


def test_a_bool_flag_alone_is_true_and_takes_a_following_true_or_false():
    known = {"force": Flag(False, "f"), "workdir": Flag("", "w")}
    assert parse_flags(["--force", "--workdir", "w"], known)[0]["force"] is True
    assert parse_flags(["--force", "false", "--workdir", "w"], known)[0]["force"] is False
    assert parse_flags(["--force=0"], known)[0]["force"] is False
    assert parse_flags(["--workdir", "w", "--force"], known)[0] == {"force": True, "workdir": "w"}


def test_a_flag_without_its_value_is_an_error_naming_it():
    with pytest.raises(ValueError, match="--workdir needs a value"):
        parse_flags(["--workdir"], {"workdir": Flag("", "w")})
    with pytest.raises(ValueError, match="--workdir needs a value"):
        parse_flags(["--workdir", "--force"], {"workdir": Flag("", "w"), "force": Flag(False, "")})
    with pytest.raises(ValueError, match="--config.train.seed needs a value"):
        parse_flags(["--config.train.seed"], {})


def test_config_flags_outside_the_commands_sections_are_refused():
    with pytest.raises(ValueError, match="only --config.decode"):
        parse_flags(["--config.train.seed=1"], {}, sections=("decode",))
    with pytest.raises(ValueError, match="no --config"):
        parse_flags(["--config.decode.beam_size=1"], {}, sections=())
    with pytest.raises(ValueError, match="unknown field 'beam'"):
        parse_flags(["--config.decode.beam", "1"], {})


def test_example_configs_are_found_by_name_and_files_by_path():
    assert find_config("tiny") == ROOT / "configs" / "tiny.py"
    assert load_config("tiny") == load_config(ROOT / "configs" / "tiny.py")
    with pytest.raises(FileNotFoundError, match="--config=tyni: .*examples: base, big"):
        find_config("tyni")


def test_bad_flag_exits_2_with_one_line_and_no_traceback(monkeypatch, capsys):
    # What `python -m translate.train` gives the command: its file as argv[0], and a __main__
    # whose spec names the module (the line names the command so).
    train = importlib.import_module("translate.train")
    monkeypatch.setattr(sys, "argv", [train.__file__])
    monkeypatch.setitem(sys.modules, "__main__", train)
    with pytest.raises(SystemExit) as stopped:
        cli.run(train.main, ["--config=tiny", "--wrkdir=/tmp/x"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("python -m translate.train: error: unknown flag --wrkdir")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config=tiny", "--workdir=W", "--config.train.seed=-1"], "must be in [0, 2**63)"),
        (["--config=tiny", "--workdir=W", "--config.model.d_model=wide"], "cannot parse 'wide'"),
        (["--config=nothing/here.py", "--workdir=W"], "no config file at nothing/here.py"),
        (["--workdir=W"], "--config is required"),
    ],
)
def test_user_errors_of_train_are_one_line_with_status_2(argv, message, tmp_path, capsys):
    argv = [a.replace("=W", f"={tmp_path / 'run'}") for a in argv]
    with pytest.raises(SystemExit) as stopped:
        cli.run(importlib.import_module("translate.train").main, argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_busy_workdir_is_a_user_error(tmp_path, capsys):
    with workdir.lock(workdir.Workdir(tmp_path)), pytest.raises(SystemExit) as stopped:
        cli.run(
            importlib.import_module("translate.train").main,
            ["--config=tiny", "--workdir", str(tmp_path)],
        )
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is in use by translate.train (pid" in err


def test_a_bug_keeps_its_traceback():
    def library_error(argv):
        np.zeros(4).reshape(3)  # numpy raises this ValueError: a bug, not a user's mistake

    def own_bug(argv):
        return {}["missing"]

    with pytest.raises(ValueError, match="cannot reshape"):
        cli.run(library_error, [])
    with pytest.raises(KeyError):
        cli.run(own_bug, [])


def test_pyproject_declares_requirements_txt():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    pins = [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]
    assert sorted(project["dependencies"] + project["optional-dependencies"]["test"]) == sorted(
        pins
    )
    assert "absl-py>=1.4" in project["dependencies"]
    assert set(project["scripts"]) == {
        "translate-train",
        "translate-evaluate",
        "translate-text",
        "translate-score",
        "translate-sample",
        "translate-export",
        "translate-data",
        "translate-distill",
        "translate-import",
    }


@pytest.mark.slow
def test_pip_install_into_a_fresh_venv_exposes_the_console_scripts(tmp_path):
    """`pip install .` of a clean copy of the checkout into a new venv, then the commands.

    The venv sees this interpreter's site-packages through a .pth file, so pip finds every
    dependency installed and downloads none; the build backend (setuptools) comes from the
    package index or pip's cache, as in any `pip install .`.
    """
    clone = tmp_path / "clone"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if (ROOT / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, clone / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "outer.pth").write_text(
        "\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n"
    )
    python = venv / "bin" / "python"
    done = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", str(clone)], capture_output=True, text=True
    )
    offline = ("NewConnectionError", "Max retries", "Temporary failure in name resolution")
    if done.returncode != 0 and any(sign in done.stderr for sign in offline):
        pytest.skip(f"pip could not fetch the build backend: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"  # no checkout on the path: the installed package runs
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": ""}
    commands = ("train", "evaluate", "text", "sample", "export")
    for command in (f"translate-{name}" for name in commands):
        shown = subprocess.run(
            [venv / "bin" / command, "--help"],
            capture_output=True,
            text=True,
            cwd=elsewhere,
            env=env,
        )
        assert shown.returncode == 0, shown.stderr
        assert "-h, --help" in shown.stdout
    where = subprocess.run(
        [python, "-c", "import translate.config as c; print(c.__file__, c.find_config('tiny'))"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
        check=True,
    ).stdout.split()
    assert all(pathlib.Path(p).is_relative_to(site / "translate") for p in where), where
    refused = subprocess.run(
        [venv / "bin" / "translate-train", "--config=tiny", "--workdir=w", "--config.x.y=1"],
        capture_output=True,
        text=True,
        cwd=elsewhere,
        env=env,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr


def test_parse_flags_separates_overrides():
    flags, overrides = parse_flags(
        ["--workdir=/tmp/x", "--config.train.seed=3", "--force"], {"workdir": "", "force": False}
    )
    assert flags == {"workdir": "/tmp/x", "force": True}
    assert overrides == {"train.seed": "3"}


def test_unknown_flag_is_an_error():
    with pytest.raises(ValueError, match="unknown flag --wrkdir"):
        parse_flags(["--wrkdir=/tmp/x"], {"workdir": ""})


# A command that a signal interrupts while XLA compiles (in threads of its own, which JAX stops
# waiting for): the process must end with one line and 128 + the signal, not a traceback or a
# segmentation fault from tearing the interpreter down under the compile.
SIGNAL_DURING_COMPILE = """
import os, signal, sys, threading
import jax, jax.numpy as jnp
from translate import cli

def main(argv):
    signum = getattr(signal, argv[0])
    # Python's own SIGINT handler, as in a foreground shell: a job started in the background
    # (`cmd &`, nohup) inherits SIGINT ignored, and Python then leaves it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signum)).start()
    def slow(x):
        for i in range(400):
            x = jnp.sin(x) @ x + i
        return x
    jax.jit(slow)(jnp.ones((8, 8))).block_until_ready()
    raise AssertionError("the signal did not stop the command")

cli.run(main, sys.argv[1:])
"""


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_during_a_command_exits_with_one_line_and_128_plus_the_signal(name):
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_DURING_COMPILE, name],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 128 + getattr(signal, name), done.stderr[-2000:]
    assert done.stderr == f"-c: stopped by {name}\n"


def test_a_signal_runs_the_commands_cleanup_before_it_exits(monkeypatch, capsys):
    cleaned = []

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)

    def main(argv):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        finally:
            cleaned.append(True)

    with pytest.raises(SystemExit) as stopped:
        cli.run(main, [])
    assert cleaned and stopped.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.endswith("stopped by SIGTERM\n")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after the command


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_signal_that_python_swallows_in_a_gc_callback_still_stops_the_command(
    name, monkeypatch, capsys
):
    """Seen in CI under load: the signal's exception raised inside JAX's garbage-collector
    callback was printed as "Exception ignored" and the command ran on. Here a callback of our
    own is where the handler runs; the command must still stop, with the one line."""
    signum = getattr(signal, name)

    def exit_now(status):
        raise SystemExit(status)

    monkeypatch.setattr(os, "_exit", exit_now)
    hook_before = sys.unraisablehook
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    swallowed = []

    def in_collection(phase, info):
        if phase == "start" and not swallowed:
            swallowed.append(True)
            os.kill(os.getpid(), signum)  # the handler runs at this callback's next bytecode
            time.sleep(0.01)

    def main(argv):
        gc.callbacks.append(in_collection)
        try:
            gc.collect()
        finally:
            gc.callbacks.remove(in_collection)
        assert swallowed
        time.sleep(5)
        raise AssertionError("the signal was lost")

    try:
        with pytest.raises(SystemExit) as stopped:
            cli.run(main, [])
    finally:
        signal.signal(signal.SIGINT, previous_int)
    assert stopped.value.code == 128 + signum
    assert capsys.readouterr().err.endswith(f"stopped by {name}\n")
    assert sys.unraisablehook is hook_before  # put back after the command


def test_a_flag_given_twice_with_two_values_is_an_error_naming_both():
    known = {"workdir": Flag("", "A directory."), "step": Flag(-1, "A step.")}
    with pytest.raises(ValueError, match=r"--workdir is given twice, as 'a' and 'b'"):
        parse_flags(["--workdir=a", "--workdir", "b"], known)
    with pytest.raises(ValueError, match=r"--config.train.seed is given twice"):
        parse_flags(["--config.train.seed=1", "--config.train.seed=2"], known)
    flags, _ = parse_flags(["--step=3", "--step=3"], known)  # the same value: no doubt
    assert flags["step"] == 3


def test_the_text_commands_help_gives_its_chunk_size_in_words_not_a_constants_name(capsys):
    text = help_of("translate.translate_text", capsys)
    assert f"up to {translate_text.LINES_PER_CHUNK:,} lines" in text
    assert "LINES_PER_CHUNK" not in text


@pytest.mark.parametrize("platforms", ["CPU", "cpux"])
def test_a_platform_jax_cannot_start_is_one_line_naming_jax_platforms(platforms):
    code = "import jax; from translate import cli; cli.run(lambda argv: jax.devices())"
    env = {**os.environ, "JAX_PLATFORMS": platforms}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and f"JAX_PLATFORMS={platforms}:" in done.stderr
    assert "lowercase" in done.stderr


def test_text_the_console_cannot_spell_is_escaped_not_an_error(monkeypatch):
    """PYTHONIOENCODING=ascii: a command escapes what it prints rather than fail after its work."""
    console = io.TextIOWrapper(io.BytesIO(), encoding="ascii")  # what that variable gives
    monkeypatch.setattr(sys, "stdout", console)
    with pytest.raises(SystemExit) as stopped:
        cli.run(lambda argv: print("Größe → Maß"), [])
    assert stopped.value.code == 0
    console.flush()
    assert console.buffer.getvalue() == b"Gr\\xf6\\xdfe \\u2192 Ma\\xdf\n"


TEARDOWN_SKIPPED = """
import atexit, logging, sys
from translate import cli
def main(argv):
    atexit.register(lambda: open(argv[0], "w").write("atexit ran"))
    logging.getLogger("translate").warning("a logged line")
    sys.stdout.write("buffered, not flushed")
    return int(argv[1])
cli.run(main, teardown=False)
"""


@pytest.mark.parametrize("status", [0, 3])
def test_a_command_ended_without_teardown_flushes_runs_atexit_and_keeps_its_status(
    tmp_path, status
):
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-c", TEARDOWN_SKIPPED, str(marker), str(status)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == status, done.stderr
    assert done.stdout == "buffered, not flushed"
    assert "a logged line" in done.stderr
    assert marker.read_text() == "atexit ran"


def test_a_command_ended_without_teardown_fails_when_its_output_cannot_be_written(tmp_path):
    # A pipe whose reader is gone: the buffered line fails at the flush the exit does.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-c", TEARDOWN_SKIPPED, str(tmp_path / "marker"), "0"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
    finally:
        os.close(write)
    assert done.returncode == 120, done.stderr
    assert "error: <stdout>: Broken pipe" in done.stderr


def test_orbax_thread_tracebacks_of_a_failed_write_are_dropped():
    """A full disk during an asynchronous save gives the command's one line, without the
    hundreds of lines of Orbax's thread tracebacks before it."""
    import logging

    cli.quiet_libraries()
    absl = logging.getLogger("absl")

    def record(error):
        try:
            raise error
        except Exception:
            info = sys.exc_info()
        return logging.LogRecord("absl", logging.ERROR, __file__, 1, "save failed", None, info)

    try:
        try:
            raise OSError(28, "No space left on device")
        except OSError as e:
            raise ValueError("commit failed") from e
    except ValueError as e:
        chained = e
    assert not absl.filter(record(OSError(28, "No space left on device")))
    assert not absl.filter(record(chained))
    assert absl.filter(record(ValueError("something else")))


@pytest.mark.parametrize(
    "value, ok",
    [
        ("", True),
        ("--xla_force_host_platform_device_count=8", True),
        ("--xla_cpu_enable_fast_math=false --xla_dump_to=/tmp/x", True),
        ("foo", False),
        ("xla_force_host_platform_device_count=8", False),
        ("--xla_cpu_enable_fast_math=false xla_dump_to", False),
    ],
)
def test_xla_flags_that_xla_would_abort_on_are_named(value, ok):
    assert (cli.xla_flags_error(value) is None) == ok


def test_a_malformed_xla_flags_is_one_line_not_an_abort(monkeypatch, capsys):
    """A malformed XLA_FLAGS is one line of error, not XLA ending the process in C++: the
    command is refused before its main runs, where XLA would first read the variable."""
    monkeypatch.setenv("XLA_FLAGS", "force_host_platform_device_count=8")
    ran = []
    with pytest.raises(SystemExit) as stopped:
        cli.run(ran.append, [])
    assert stopped.value.code == 2 and not ran
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "XLA_FLAGS=force_host_platform" in err


@pytest.mark.skipif(
    importlib.util.find_spec("jax_cuda13_plugin") is not None
    or importlib.util.find_spec("jax_cuda12_plugin") is not None,
    reason="a CUDA plugin is installed here",
)
def test_a_platform_without_its_plugin_is_one_line_naming_jax_platforms():
    """JAX_PLATFORMS=cuda on a machine without CUDA's plugin is one line naming the variable,
    not JAX's bare AssertionError (a new user's try)."""
    program = "import jax; from translate import cli; cli.run(lambda argv: print(jax.devices()))"
    env = {**os.environ, "JAX_PLATFORMS": "cuda"}
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=ROOT
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "JAX_PLATFORMS=cuda: JAX could not start" in done.stderr


def test_a_libraries_first_log_line_does_not_prefix_ours():
    """No "WARNING:translate: WARNING: ..." after absl (Orbax's logger) has logged a line:
    absl's first call configures the root logger with Python's default format."""
    code = (
        "import logging\n"
        "from absl import logging as absl_logging\n"
        "from translate import cli\n"
        "cli.quiet_libraries()\n"
        "absl_logging.error('a library line')\n"
        "logging.getLogger('translate').warning('WARNING: ours')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "WARNING: ours", done.stderr
