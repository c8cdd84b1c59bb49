"""Test setup: 8 fake CPU devices (set before JAX is imported), a compilation cache, a tiny config.

`pytest -m gpu` (any marker expression that selects gpu tests and no unmarked test) leaves the
platform to JAX, so the gpu tests run on the machine's GPU; every other run forces the CPU.

Most of the suite's time is XLA compiling the same tiny models again: each test builds its own
trainer, and the subprocess tests start fresh interpreters. A persistent compilation cache in a
temporary directory, new for each test session and removed at its end, lets a program compiled
once be loaded by every later test and subprocess that builds the same one (it cut the trainer,
workflow, plots and text-command tests from 285 s to 211 s on 2 cores). A cache directory the
caller sets (JAX_COMPILATION_CACHE_DIR) is used as it is.

With pytest-xdist (the README's `-n 2`), this file configures the main process first, and the
worker processes it starts inherit its environment: one cache for all of them, removed by the
main process when they are done.
"""

import os
import pathlib
import shutil
import sys
import tempfile

import pytest
from _pytest.mark.expression import Expression
from helpers import copy_of_tiny_run, tiny_config

from translate.config import Config


def selects_only_gpu_tests(markexpr: str) -> bool:
    """Whether `-m markexpr` keeps a test marked gpu and drops a test with no marker.

    pytest's own parser evaluates the expression, so `gpu`, `gpu and not slow` or `(gpu)` count
    and `not slow`, `not gpu` or no `-m` do not.
    """
    if not markexpr:
        return False
    expression = Expression.compile(markexpr)

    def matcher(marks):
        return lambda name, **kwargs: name in marks and not kwargs

    return expression.evaluate(matcher({"gpu"})) and not expression.evaluate(matcher(set()))


_CACHE_DIR: str | None = None


def use_a_fresh_compilation_cache() -> None:
    """Points JAX (here and in subprocesses) at a new cache directory, unless one is set."""
    global _CACHE_DIR
    if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    _CACHE_DIR = tempfile.mkdtemp(prefix="translate-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE_DIR
    # Cache every program, however small or quick to compile: the tests' are all small.
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "-1"


def pytest_unconfigure(config: pytest.Config) -> None:
    if _CACHE_DIR is not None:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)


def pytest_configure(config: pytest.Config) -> None:
    # pytest calls this after loading this file and before importing any test module, so the
    # variables below are set before JAX reads them (at its import and at its first backend).
    use_a_fresh_compilation_cache()
    if selects_only_gpu_tests(config.option.markexpr):
        return
    if "jax" in sys.modules:
        raise pytest.UsageError(
            "jax was imported before tests/conftest.py could force the CPU (a pytest plugin?); "
            "the tests need JAX_PLATFORMS=cpu and 8 host devices set before that"
        )
    flag = "--xla_force_host_platform_device_count=8"
    if flag not in os.environ.get("XLA_FLAGS", "").split():  # xdist workers inherit it
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture
def config() -> Config:
    return tiny_config()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """configs/tiny.py trained for its 6 steps (checkpoints at 3 and 6, dev and test decoded),
    once per test session; modules take copies (`copy_of_tiny_run`) and never touch this one."""
    from translate.training.trainer import train_and_evaluate

    path = tmp_path_factory.mktemp("tiny_run")
    train_and_evaluate(tiny_config(), path)
    return path


@pytest.fixture(scope="module")
def workdir(tiny_run, tmp_path_factory) -> pathlib.Path:
    """A tiny model trained for 6 steps (checkpoints at steps 3 and 6, its metrics.jsonl and
    report): this module's copy of the test session's tiny run, which its tests may change."""
    return copy_of_tiny_run(tiny_run, tmp_path_factory)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A 200-piece BPE vocabulary trained on 400 pairs of the synthetic grammar."""
    from translate.data import synthetic
    from translate.data.tokenizer import train_tokenizer

    pairs = synthetic.generate_pairs(400, seed=1)
    texts = [s for pair in pairs for s in pair]
    return train_tokenizer(texts, 200, tmp_path_factory.mktemp("vocab") / "vocab.model")


@pytest.fixture
def varied_outputs(monkeypatch):
    """Makes `load_model` (through which the command loads) give an untrained, peaked model.

    Six steps teach the tiny model to end every sentence at once, so its translations are all
    empty and their order cannot be seen; an untrained model with a larger embedding (as in
    test_decode.py) writes outputs that differ with the source.
    """
    from flax import nnx

    from translate import search_store
    from translate import trained as trained_module
    from translate.models.transformer import Transformer

    load = trained_module.load_model

    def load_untrained(workdir, step=None, average=0, log=print, params="auto", matmul_dtype=""):
        _, _, tokenizer, config, step = load(workdir, step, average, params=params)
        model = Transformer(config.model, tokenizer.vocab_size, rngs=nnx.Rngs(0))
        model.embed.embedding[...] = model.embed.embedding[...] * 8.0
        return trained_module.TrainedModel(*nnx.split(model, nnx.Param), tokenizer, config, step)

    monkeypatch.setattr(trained_module, "load_model", load_untrained)
    # Nor kept as the workdir's saved parameters, which a later command would read.
    monkeypatch.setattr(search_store.SavedEnsemble, "find", lambda *args: None)
