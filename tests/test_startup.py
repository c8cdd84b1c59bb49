"""Importing JAX without etils.epath for translate-text (translate/startup.py)."""

import os
import subprocess
import sys

# Prints whether JAX chose etils.epath, then shows that the module is importable afterwards (Orbax
# needs it) and that import_jax() is a no-op once JAX is in.
PROGRAM = """
import sys
import translate.translate_text
import jax
print("epath", jax._src.path.epath_installed)
from translate import startup
startup.import_jax()
from etils import epath
import orbax.checkpoint
print("importable", epath.Path.__name__, "orbax.checkpoint" in sys.modules)
"""


def run(**env: str) -> list[str]:
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=environment, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def test_translate_text_imports_jax_without_etils_epath_and_leaves_it_importable():
    assert run() == ["epath False", "importable Path True"]


def test_a_cache_directory_only_etils_epath_can_reach_keeps_jaxs_usual_import():
    assert run(JAX_COMPILATION_CACHE_DIR="gs://a-bucket/xla")[0] == "epath True"


def test_a_ctrl_c_while_a_command_imports_is_one_line_and_status_130():
    """Ctrl-C during the imports is one line and status 130, not a 22-line traceback (or an
    ImportError from an extension's initialisation)."""
    import signal
    import subprocess
    import sys

    code = (
        "import os, signal, time\n"
        "from translate import startup\n"
        "startup.interrupts_said_in_one_line()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(10)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == 130
    assert done.stderr.strip().splitlines() == ["-c: stopped by SIGINT"]


def test_the_import_time_handler_is_undone_once_the_imports_are_in():
    import signal

    from translate import startup

    before = signal.getsignal(signal.SIGINT)
    undo = startup.interrupts_said_in_one_line()
    assert signal.getsignal(signal.SIGINT) is not before
    undo()
    assert signal.getsignal(signal.SIGINT) is before
