"""Test setup: 8 fake CPU devices (set before JAX is imported) and a tiny config.

`pytest -m gpu` (any marker expression that selects gpu tests and no unmarked test) leaves the
platform to JAX, so the gpu tests run on the machine's GPU; every other run forces the CPU.
"""

import contextlib
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
from _pytest.mark.expression import Expression

from translate.config import Config, load_config


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


def pytest_configure(config: pytest.Config) -> None:
    # pytest calls this after loading this file and before importing any test module, so the
    # variables below are set before JAX reads them (at its import and at its first backend).
    if selects_only_gpu_tests(config.option.markexpr):
        return
    if "jax" in sys.modules:
        raise pytest.UsageError(
            "jax was imported before tests/conftest.py could force the CPU (a pytest plugin?); "
            "the tests need JAX_PLATFORMS=cpu and 8 host devices set before that"
        )
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def tiny_config() -> Config:
    """configs/tiny.py: a train step in well under a second on CPU."""
    return load_config(pathlib.Path(__file__).parent.parent / "configs" / "tiny.py")


@pytest.fixture
def config() -> Config:
    return tiny_config()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A 200-piece BPE vocabulary trained on 400 pairs of the synthetic grammar."""
    from translate import synthetic
    from translate.tokenizer import train_tokenizer

    pairs = synthetic.generate_pairs(400, seed=1)
    texts = [s for pair in pairs for s in pair]
    return train_tokenizer(texts, 200, tmp_path_factory.mktemp("vocab") / "vocab.model")


@contextlib.contextmanager
def read_only(path: pathlib.Path):
    """`path` as a directory in which nothing can be created, whoever runs the test."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    # root writes through permissions; an immutable directory stops even root.
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], capture_output=True).returncode:
        pytest.skip("cannot make a directory read-only for root here (chattr +i)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)
