"""requirements-gpu.txt installs JAX's CUDA build inside requirements.txt's pins."""

import json
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def requirement_lines(name: str) -> list[str]:
    lines = (ROOT / name).read_text().splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def jax_range(lines: list[str]) -> str:
    (line,) = [line for line in lines if re.match(r"jax(\[[^\]]*\])?\s*[<>=]", line)]
    return re.sub(r"^jax(\[[^\]]*\])?", "", line).replace(" ", "")


def test_gpu_requirements_add_the_cuda_build_within_the_cpu_pins():
    cpu, gpu = requirement_lines("requirements.txt"), requirement_lines("requirements-gpu.txt")
    assert "-r requirements.txt" in gpu
    assert any(line.startswith("jax[cuda13]") for line in gpu)
    assert jax_range(gpu) == jax_range(cpu)


@pytest.mark.slow
def test_pip_resolves_gpu_requirements_to_one_matching_jax_and_cuda_plugin(tmp_path):
    """pip's resolver (a dry run, nothing installed): every JAX piece at one version in range."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
         "--report", str(report), "-r", str(ROOT / "requirements-gpu.txt")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    offline = ("NewConnectionError", "Max retries", "Temporary failure in name resolution")
    if done.returncode != 0 and any(sign in done.stderr for sign in offline):
        pytest.skip(f"pip could not reach the package index: {done.stderr[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    versions = {
        item["metadata"]["name"].lower(): item["metadata"]["version"]
        for item in json.loads(report.read_text())["install"]
    }
    pieces = ["jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt"]
    assert len({versions[name] for name in pieces}) == 1, versions
    major, minor = map(int, versions["jax"].split(".")[:2])
    low, high = re.match(
        r">=(\d+\.\d+),<(\d+\.\d+)", jax_range(requirement_lines("requirements.txt"))
    ).groups()
    assert tuple(map(int, low.split("."))) <= (major, minor) < tuple(map(int, high.split(".")))
