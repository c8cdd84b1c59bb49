"""Plain helpers the tests import (`from helpers import tiny_config`); fixtures live in
conftest.py."""

import contextlib
import os
import pathlib
import shutil
import subprocess

import pytest

from translate.config import Config, load_config


def tiny_config() -> Config:
    """configs/tiny.py: a train step in well under a second on CPU."""
    return load_config(pathlib.Path(__file__).parent.parent / "configs" / "tiny.py")


def copy_of_tiny_run(tiny_run, tmp_path_factory) -> pathlib.Path:
    """A private copy of the test session's tiny run (its files are all small)."""
    path = tmp_path_factory.mktemp("trained") / "run"
    shutil.copytree(tiny_run, path)
    return path


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
