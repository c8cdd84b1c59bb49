"""Searches kept compiled on disk with their parameters (translate/decoding/saved_searches.py)."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from translate import compilation, search_store
from translate.data.batching import source_batches
from translate.decoding import saved_searches
from translate.decoding.sentences import TracedSearches
from translate.decoding.settings import decode_settings
from translate.trained import load_ensemble

ROOT = pathlib.Path(__file__).resolve().parent.parent

LINES = ["the small dog sees the cat .", "a man reads .", "the cat sleeps ."]

# Runs the text command in a fresh process, then says on its last stderr line which of the
# heavy libraries the process imported.
COMMAND = """
import atexit, sys
from translate import translate_text
atexit.register(lambda: sys.stderr.write(
    "imported: " + " ".join(m for m in ("flax", "orbax.checkpoint") if m in sys.modules) + "\\n"
))
translate_text.console_main()
"""


def translate(workdir, cache, *flags) -> tuple[str, str]:
    environment = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    environment.pop(compilation.ENV, None)
    done = subprocess.run(
        [sys.executable, "-c", COMMAND, f"--workdir={workdir}", f"--compilation_cache={cache}"]
        + list(flags),
        input="\n".join(LINES) + "\n",
        capture_output=True,
        text=True,
        env=environment,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def setups(cache) -> list[pathlib.Path]:
    """The setups in `cache` (the folder of shared executables left out)."""
    root = pathlib.Path(cache) / search_store.SUBDIR
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name != search_store.EXECUTABLES)


def test_a_second_command_decodes_from_the_first_ones_programs_without_flax(workdir, tmp_path):
    cache = tmp_path / "cache"
    first, said = translate(workdir, cache)
    assert "imported: flax orbax.checkpoint" in said  # the first loads the model
    (setup,) = setups(cache)
    names = sorted(p.name for p in setup.iterdir())
    assert "params.npz" in names and "setup.json" in names
    assert any(name.endswith(search_store.EXPORTED) for name in names), names
    executables = cache / search_store.SUBDIR / search_store.EXECUTABLES
    assert [p.suffix for p in executables.iterdir()] == [search_store.EXECUTABLE]
    second, said = translate(workdir, cache)
    assert second == first
    assert said.splitlines()[-1] == "imported: ", said  # neither Flax nor Orbax
    assert "decoding with the checkpoint of step 6" in said


def test_the_programs_decode_as_the_search_traced_here(workdir):
    """`SavedSearches`, compiled here or loaded from a setup, gives `TracedSearches`' outputs."""
    graphdefs, params, tokenizer, config, steps = load_ensemble([workdir])
    settings = decode_settings(config.decode, nbest=2)
    batches = [src for _, src in source_batches(tokenizer, LINES, 2, config.data.max_len)]
    traced = TracedSearches(graphdefs, params, settings)
    leaves = jax.tree.leaves(params)
    setup = search_store.SavedEnsemble(workdir / "unused-cache", "a-setup")
    setup.save(leaves, steps, [])
    made = saved_searches.SavedSearches(setup, leaves, lambda: (graphdefs, params), settings)

    def model_not_needed():
        raise AssertionError("the program was saved: no model should be loaded")

    loaded_leaves, _, _ = setup.load()
    loaded = saved_searches.SavedSearches(setup, loaded_leaves, model_not_needed, settings)
    for src in batches:
        expected = jax.device_get(traced(src))
        for searches in (made, loaded):
            found = jax.device_get(searches(src))
            for a, b in zip(expected, found, strict=True):
                np.testing.assert_array_equal(a, b)


def test_a_search_jax_export_cannot_save_runs_unsaved_and_says_so(workdir, monkeypatch, capsys):
    """A search that jax.export refuses (a custom call it cannot promise to keep) still decodes,
    compiled in the process, as the search traced here; nothing is saved, and it is said once."""
    graphdefs, params, tokenizer, config, steps = load_ensemble([workdir])
    settings = decode_settings(config.decode, nbest=2)
    batches = [src for _, src in source_batches(tokenizer, LINES, 2, config.data.max_len)]
    leaves = jax.tree.leaves(params)
    setup = search_store.SavedEnsemble(workdir / "refused-cache", "a-setup")
    setup.save(leaves, steps, [])

    def refuse(*args, **kwargs):
        raise ValueError("Cannot serialize code with custom calls whose targets ...\nmore")

    monkeypatch.setattr(jax.export, "export", refuse)
    searches = saved_searches.SavedSearches(setup, leaves, lambda: (graphdefs, params), settings)
    traced = TracedSearches(graphdefs, params, settings)
    capsys.readouterr()
    for src in batches:
        for a, b in zip(jax.device_get(traced(src)), jax.device_get(searches(src)), strict=True):
            np.testing.assert_array_equal(a, b)
    said = capsys.readouterr().err
    assert said.count("cannot be kept (Cannot serialize code") == 1, said
    assert len(searches.unsaved) == len({src.shape for src in batches}) >= 1
    assert not [p for p in setup.directory.iterdir() if p.name.endswith(search_store.EXPORTED)]


def test_the_unchecked_calls_are_jaxs_cudnn_attention_targets():
    """The custom calls a saved search may hold are cuDNN's forward attention, by JAX's names."""
    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    tables = [v for v in vars(fused).values() if isinstance(v, dict)]
    targets = {name for table in tables for name in table.values() if isinstance(name, str)}
    for check in saved_searches.UNCHECKED_CALLS:
        assert check.is_custom_call() in targets, check


def test_a_new_checkpoint_or_another_choice_is_another_setup(workdir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    name = search_store.setup_name([str(run)], None, 0)
    assert search_store.setup_name([str(run)], None, 0) == name
    assert search_store.setup_name([str(run)], 3, 0) != name
    assert search_store.setup_name([str(run)], None, 2) != name
    (run / "checkpoints" / "6" / "added").write_text("x")
    assert search_store.setup_name([str(run)], None, 0) != name


@pytest.mark.slow  # 22 s on 2 cores: five fresh commands
def test_a_damaged_search_executable_or_parameters_file_is_made_again_and_said_once(
    workdir, tmp_path
):
    cache = tmp_path / "cache"
    expected, _ = translate(workdir, cache)
    (setup,) = setups(cache)
    (search,) = setup.glob("*" + search_store.EXPORTED)
    search.write_bytes(search.read_bytes()[:-100])  # cut short, as a full disk would
    found, said = translate(workdir, cache)
    assert found == expected
    assert said.count("could not be used") == 1, said
    assert "imported: flax" in said  # the model was loaded to trace it again
    found, said = translate(workdir, cache)  # and it was kept whole this time
    assert found == expected and said.splitlines()[-1] == "imported: "
    (executable,) = (cache / search_store.SUBDIR / search_store.EXECUTABLES).iterdir()
    executable.write_bytes(b"garbage")
    found, said = translate(workdir, cache)
    assert found == expected
    assert said.count("could not be used") == 1, said
    (setup / "params.npz").write_bytes(b"not an archive")
    found, said = translate(workdir, cache)
    assert found == expected
    assert said.count("could not be used") == 1, said
    json.loads((setup / "setup.json").read_text())  # written again, whole


@pytest.mark.slow  # 15 s on 2 cores: three fresh commands
def test_a_lost_executable_is_compiled_and_kept_again_though_jaxs_cache_stays(workdir, tmp_path):
    """Searches are compiled for real and kept as executables, never read from JAX's cache
    (where one could not be kept again, and every later command would lower and read it)."""
    cache = tmp_path / "cache"
    expected, _ = translate(workdir, cache)
    shutil.rmtree(cache / search_store.SUBDIR)  # the setups and executables; JAX's entries stay
    found, said = translate(workdir, cache)
    assert found == expected and "imported: flax" in said
    assert [
        p.suffix for p in (cache / search_store.SUBDIR / search_store.EXECUTABLES).iterdir()
    ] == [search_store.EXECUTABLE]
    found, said = translate(workdir, cache)
    assert found == expected and said.splitlines()[-1] == "imported: "


def load(path):
    """A new function object `f` from the Python file `path`."""
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace["f"]


def test_a_saved_search_is_the_same_from_any_checkout(tmp_path):
    """Traced from two copies of the same source file, at other paths and lines, a search's
    saved form is the same bytes, so its executable's name is too."""
    source = "import jax.numpy as jnp\n\n\ndef f(x):\n    return jnp.cumsum(jnp.sin(x) * 2)\n"
    payloads = []
    for where, padding in (("a", ""), ("b", "\n\n# moved down\n")):
        (tmp_path / where).mkdir()
        path = tmp_path / where / f"copy_{where}.py"
        path.write_text(padding + source)
        spec = jax.ShapeDtypeStruct((4,), np.float32)
        with search_store.source_lines_left_out():
            payloads.append(bytes(jax.export.export(jax.jit(load(path)))(spec).serialize()))
        # Without it the locations name the file (a function of its own: JAX keeps traces).
        assert str(path) in jax.export.export(jax.jit(load(path)))(spec).mlir_module()
    assert payloads[0] == payloads[1]


@pytest.mark.slow  # 9.5 s on 2 cores: a fresh command; out of the default run
def test_with_the_cache_off_nothing_is_kept(workdir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found, _ = translate(workdir, "off")
    assert found.count("\n") == len(LINES)
    assert not any(tmp_path.rglob(search_store.SUBDIR))


def test_the_least_recently_used_setups_go_past_the_bound(tmp_path, monkeypatch, caplog):
    leaves = [np.zeros(1000, np.float32)]
    old, new = (
        search_store.SavedEnsemble(tmp_path, "0" * 32),
        search_store.SavedEnsemble(tmp_path, "1" * 32),
    )
    old.save(leaves, [[1]], [])
    os.utime(old.record, (1, 1))  # used long ago
    monkeypatch.setattr(search_store, "PROGRAMS_MAX_BYTES", 6000)
    with caplog.at_level(logging.WARNING):
        new.save(leaves, [[1]], [])
    assert not old.directory.exists()
    assert new.load() is not None


def test_a_step_that_is_a_link_is_followed_into_the_setups_name(workdir, tmp_path):
    """A step under checkpoints/ that links to another run's is followed, not left out."""
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    other = tmp_path / "other"
    for name in ("a", "b"):
        shutil.copytree(run / "checkpoints" / "6", other / name)
    shutil.rmtree(run / "checkpoints" / "6")
    (run / "checkpoints" / "6").symlink_to(other / "a", target_is_directory=True)
    name = search_store.setup_name([str(run)], None, 0)
    (run / "checkpoints" / "6").unlink()
    (run / "checkpoints" / "6").symlink_to(other / "b", target_is_directory=True)
    assert search_store.setup_name([str(run)], None, 0) != name  # the same files, elsewhere


def test_a_file_replaced_in_place_or_chmodded_is_another_setup(workdir, tmp_path):
    """A step made unreadable for one run (then readable again, its size and time unchanged)
    does not keep every later run on the older step its fallback chose."""
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    file = next(p for p in (run / "checkpoints" / "6").rglob("*") if p.is_file())
    names = [search_store.setup_name([str(run)], None, 0)]
    status = file.stat()
    file.chmod(0)
    names.append(search_store.setup_name([str(run)], None, 0))
    file.chmod(status.st_mode)
    names.append(search_store.setup_name([str(run)], None, 0))
    data = file.read_bytes()
    file.unlink()
    file.write_bytes(data)  # another inode, the same bytes
    os.utime(file, ns=(status.st_atime_ns, status.st_mtime_ns))
    names.append(search_store.setup_name([str(run)], None, 0))
    assert len(set(names)) == len(names)


def test_a_fallback_to_an_older_step_is_not_kept_for_the_next_command(workdir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(workdir, run)
    assert not saved_searches.passed_over([str(run)], None, 0, [[6]])
    assert saved_searches.passed_over([str(run)], None, 0, [[3]])  # step 6 was passed over
    assert not saved_searches.passed_over([str(run)], 3, 0, [[3]])  # asked for


def test_a_users_own_searches_folder_is_neither_used_nor_cleaned(tmp_path, caplog):
    """A cache directory of the user's own holding searches/ keeps its subfolders."""
    cache = tmp_path / "mine"
    own = cache / search_store.SUBDIR / "holiday-photos"
    own.mkdir(parents=True)
    (own / "a.jpg").write_bytes(b"x" * 10_000)
    with caplog.at_level(logging.WARNING):
        assert search_store.SavedEnsemble.find(str(cache), [str(tmp_path)], None, 0) is None
    assert "holds files that translate did not write" in caplog.text
    assert (own / "a.jpg").read_bytes() == b"x" * 10_000


def test_a_gpu_decodes_through_jaxs_cache_alone_and_keeps_no_saved_searches(
    workdir, tmp_path, monkeypatch
):
    """Saved searches crashed translate-text on an H200 (search_store.SAVED_SEARCH_PLATFORMS):
    off the CPU the text command opens no setup, writes nothing under searches/, and decodes
    with the searches evaluation traces, to the same translations."""
    settings = decode_settings(load_ensemble([str(workdir)]).config.decode)
    cache = tmp_path / "cache"
    on_cpu = saved_searches.OpenedModels([str(workdir)], None, 0, "auto", str(cache))
    assert on_cpu.setup is not None
    expected = on_cpu.translate(LINES, settings)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    other = tmp_path / "other-cache"
    on_gpu = saved_searches.OpenedModels([str(workdir)], None, 0, "auto", str(other))
    assert on_gpu.setup is None
    assert isinstance(on_gpu.searches(settings), TracedSearches)
    assert on_gpu.translate(LINES, settings) == expected
    assert not (other / search_store.SUBDIR).exists()


def test_the_store_deletes_only_what_it_made(tmp_path, monkeypatch):
    leaves = [np.zeros(1000, np.float32)]
    assert search_store.claim_store(tmp_path / search_store.SUBDIR)
    stranger = tmp_path / search_store.SUBDIR / "not-a-setup"
    stranger.mkdir()
    (stranger / "big").write_bytes(b"x" * 20_000)
    old, new = (
        search_store.SavedEnsemble(tmp_path, "0" * 32),
        search_store.SavedEnsemble(tmp_path, "1" * 32),
    )
    old.save(leaves, [[1]], [])
    os.utime(old.record, (1, 1))
    monkeypatch.setattr(search_store, "PROGRAMS_MAX_BYTES", 6000)
    new.save(leaves, [[1]], [])
    assert not old.directory.exists() and new.load() is not None
    assert (stranger / "big").stat().st_size == 20_000


@pytest.mark.parametrize("damage", ["cut short", "other leaves", "empty"])
def test_damaged_saved_parameters_are_made_again(tmp_path, damage, caplog):
    setup = search_store.SavedEnsemble(tmp_path, "2" * 32)
    setup.save([np.ones(3, np.float32), np.zeros(2, np.float32)], [[6]], [])
    if damage == "cut short":
        setup.params.write_bytes(setup.params.read_bytes()[:-20])
    elif damage == "other leaves":
        record = json.loads(setup.record.read_text())
        setup.record.write_text(json.dumps({**record, "leaves": 1}))
    else:
        setup.params.write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert setup.load() is None
    assert caplog.text.count("could not be used") == 1


def test_a_saved_search_of_another_shape_is_traced_again(workdir):
    """A saved search copied over another's name is not run: the search is traced again and
    decodes as the plain one does, without a traceback."""
    graphdefs, params, tokenizer, config, steps = load_ensemble([workdir])
    settings = decode_settings(config.decode)
    leaves = jax.tree.leaves(params)
    setup = search_store.SavedEnsemble(workdir / "unused-cache-2", "3" * 32)
    setup.save(leaves, steps, [])
    made = saved_searches.SavedSearches(setup, leaves, lambda: (graphdefs, params), settings)
    small, large = np.zeros((1, 8), np.int32), np.zeros((2, 16), np.int32)
    made.compile(small.shape)
    source = setup.directory / (settings.program_name(small.shape) + search_store.EXPORTED)
    target = setup.directory / (settings.program_name(large.shape) + search_store.EXPORTED)
    shutil.copyfile(source, target)
    again = saved_searches.SavedSearches(setup, leaves, lambda: (graphdefs, params), settings)
    expected = TracedSearches(graphdefs, params, settings)(large)
    for a, b in zip(jax.device_get(again(large)), jax.device_get(expected), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_remade_file_does_not_inherit_an_unreadable_mode(tmp_path):
    """An executable made unreadable is remade readable, not with mode 000 on every run."""
    setup = search_store.SavedEnsemble(tmp_path, "4" * 32)
    path = setup.executables / ("x" + search_store.EXECUTABLE)
    setup.write(path, b"payload")
    path.chmod(0)
    setup.write(path, b"payload")
    assert path.stat().st_mode & 0o444 == 0o444 & ~current_umask()
    assert setup.read(path, "an executable") == b"payload"


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
