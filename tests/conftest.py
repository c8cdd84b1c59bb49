"""Test setup: 8 fake CPU devices (set before JAX is imported) and a tiny config."""

import os
import pathlib

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from translate.config import Config, load_config  # noqa: E402


def tiny_config() -> Config:
    """configs/tiny.py: a train step in well under a second on CPU."""
    return load_config(pathlib.Path(__file__).parent.parent / "configs" / "tiny.py")


@pytest.fixture
def config() -> Config:
    return tiny_config()
