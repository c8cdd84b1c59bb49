"""The persistent compilation cache every command uses (translate/compilation.py)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
from helpers import read_only

from translate import compilation

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A fresh process that turns the cache on as a command does, compiles one small program, and
# prints how many programs it found in the cache. With a second argument "lean" it imports JAX
# as translate-text does, without etils.epath (translate/startup.py).
PROGRAM = """
import sys
if sys.argv[2:] == ["lean"]:
    from translate import startup
    startup.import_jax()
import jax
print("epath", jax._src.path.epath_installed)
import jax.numpy as jnp
from jax import monitoring
from translate import compilation
hits = []
monitoring.register_event_listener(
    lambda event, **kw: hits.append(event) if event.endswith("cache_hits") else None
)
print("dir", compilation.use_persistent_cache(sys.argv[1]))
print("value", float(jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())(jnp.arange(4.0)).sum()))
print("hits", len(hits))
"""


def run_program(flag: str, lean: bool = False, **env: str) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environment.pop(compilation.ENV, None)
    environment.update(env)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, flag, *(["lean"] if lean else [])],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    return {**lines, "stderr": done.stderr}


@pytest.mark.parametrize("first_lean", [False, True])
def test_a_second_process_finds_the_first_ones_programs(tmp_path, first_lean):
    # translate-text imports JAX without etils.epath (pathlib paths), the other commands with it:
    # each finds what the other kept.
    cache = tmp_path / "cache"
    first = run_program(str(cache), lean=first_lean)
    assert first["dir"] == str(cache) and first["hits"] == "0"
    assert any(p.name.endswith("-cache") for p in cache.iterdir())
    second = run_program(str(cache), lean=not first_lean)
    assert (first["epath"], second["epath"]) == (str(not first_lean), str(first_lean))
    assert int(second["hits"]) >= 1 and second["value"] == first["value"]


def test_the_environment_chooses_the_directory_and_off_turns_it_off(tmp_path):
    cache = tmp_path / "from_env"
    assert run_program("", TRANSLATE_COMPILATION_CACHE=str(cache))["dir"] == str(cache)
    assert run_program("off", TRANSLATE_COMPILATION_CACHE=str(cache))["dir"] == "None"
    if sys.platform.startswith("linux"):
        default = run_program("", XDG_CACHE_HOME=str(tmp_path / "xdg"))["dir"]
        assert default == str(tmp_path / "xdg" / "translate" / "xla")


def test_a_users_own_jax_cache_directory_is_left_alone(tmp_path):
    own = tmp_path / "own"
    result = run_program(str(tmp_path / "ours"), JAX_COMPILATION_CACHE_DIR=str(own))
    assert result["dir"] == str(own)
    assert not (tmp_path / "ours").exists()


def test_a_directory_that_cannot_be_made_is_said_once_and_compiling_goes_on(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory\n")
    result = run_program(str(blocker / "cache"))
    assert result["dir"] == "None" and result["value"]
    assert result["stderr"].count("not keeping compiled programs") == 1


def test_corrupt_entries_are_compiled_again_and_said_once(tmp_path):
    cache = tmp_path / "cache"
    good = run_program(str(cache))
    for entry in cache.iterdir():
        if entry.name.endswith("-cache"):
            entry.write_bytes(b"\x00 not a compiled program " * 10)
    result = run_program(str(cache))
    assert result["value"] == good["value"] and result["hits"] == "0"
    assert result["stderr"].count("could not be used for a program") == 1


@pytest.mark.parametrize("flag", ["off", "OFF", "none", "0"])
def test_off_in_any_spelling_means_no_cache(flag, monkeypatch):
    monkeypatch.delenv(compilation.ENV, raising=False)
    assert compilation.chosen_dir(flag) is None


def test_the_flag_wins_over_the_environment_and_the_default_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv(compilation.ENV, str(tmp_path / "env"))
    assert compilation.chosen_dir(str(tmp_path / "flag")) == tmp_path / "flag"
    assert compilation.chosen_dir("") == tmp_path / "env"
    monkeypatch.delenv(compilation.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(sys, "platform", "linux")
    assert compilation.chosen_dir("") == tmp_path / "xdg" / "translate" / "xla"


def test_processes_that_share_a_new_cache_at_once_all_finish(tmp_path):
    cache = tmp_path / "cache"
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, str(cache)],
            env=environment,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0], [err for _, err in outputs]
    values = {dict(line.split(" ", 1) for line in out.splitlines())["value"] for out, _ in outputs}
    assert len(values) == 1
    assert run_program(str(cache))["hits"] != "0"


def test_a_read_only_cache_is_not_used_and_said_once(tmp_path):
    cache = tmp_path / "cache"
    good = run_program(str(cache))
    with read_only(cache):
        result = run_program(str(cache))
    assert result["dir"] == "None" and result["value"] == good["value"]
    assert result["stderr"].count("not keeping compiled programs") == 1


def evaluate_in_a_process(workdir, data, cache, output) -> dict:
    """translate-evaluate in a fresh process against `cache`; its report.json."""
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environment.pop(compilation.ENV, None)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "translate.evaluate",
            f"--workdir={workdir}",
            f"--src={data / 'test.en'}",
            f"--ref={data / 'test.de'}",
            f"--output={output}",
            f"--compilation_cache={cache}",
            "--config.decode.max_extra_len=3",
        ],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads((output / "report.json").read_text())


def test_a_second_evaluation_reads_every_search_from_the_cache_and_says_so(tiny_run, tmp_path):
    """Warm decoding: the second run of the same evaluation compiles no program
    (each batch shape's search is read from the persistent cache), decodes the same text, and
    its report says how many programs it read."""
    from translate.data import synthetic

    pairs = synthetic.generate_pairs(40, seed=3)
    (tmp_path / "test.en").write_text("".join(en + "\n" for en, _ in pairs))
    (tmp_path / "test.de").write_text("".join(de + "\n" for _, de in pairs))
    cache = tmp_path / "cache"
    cold = evaluate_in_a_process(tiny_run, tmp_path, cache, tmp_path / "cold")
    warm = evaluate_in_a_process(tiny_run, tmp_path, cache, tmp_path / "warm")
    assert cold["num_programs_from_cache"] == 0
    assert warm["num_batch_shapes"] == cold["num_batch_shapes"] >= 2
    assert warm["num_programs_from_cache"] == warm["num_batch_shapes"]
    hypotheses = [(tmp_path / run / "hypotheses.txt").read_bytes() for run in ("cold", "warm")]
    assert hypotheses[0] == hypotheses[1]
    said = (tmp_path / "warm" / "report.txt").read_text()
    assert f"({warm['num_batch_shapes']} program(s) read from the persistent" in said
    assert "read from the persistent" not in (tmp_path / "cold" / "report.txt").read_text()
