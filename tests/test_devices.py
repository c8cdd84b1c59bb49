"""The kernel choice, the CPU warning and the malloc settings of translate/devices.py."""

import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import pytest

from translate import devices
from translate.devices import DeviceFacts, cpu_warning, published_peak, resolve_attention

ROOT = pathlib.Path(__file__).resolve().parent.parent
CPU = DeviceFacts("cpu", kind="cpu")
H100 = DeviceFacts("gpu", "cuda", (9, 0), "NVIDIA H100 80GB HBM3")
A100 = DeviceFacts("gpu", "cuda", (8, 0), "NVIDIA A100-SXM4-40GB")
V100 = DeviceFacts("gpu", "cuda", (7, 0), "Tesla V100-SXM2-16GB")
T4 = DeviceFacts("gpu", "cuda", (7, 5), "Tesla T4")
MI300 = DeviceFacts("gpu", "rocm", None, "AMD Instinct MI300X")


def test_auto_attention_picks_cudnn_only_on_nvidia_gpus_of_compute_capability_8_or_more():
    for facts in (H100, A100):
        assert resolve_attention("auto", jnp.bfloat16, 64, facts) == "cudnn"
        assert resolve_attention("auto", jnp.float16, 128, facts) == "cudnn"
    for facts in (CPU, V100, T4, MI300):
        assert resolve_attention("auto", jnp.bfloat16, 64, facts) == "xla"


def test_auto_attention_uses_xla_where_dtype_or_head_size_do_not_fit_cudnn():
    assert resolve_attention("auto", jnp.float32, 64, H100) == "xla"  # cuDNN's kernel is 16-bit
    assert resolve_attention("auto", jnp.bfloat16, 256, H100) == "xla"  # head too large
    assert resolve_attention("auto", jnp.bfloat16, 36, H100) == "xla"  # not a multiple of 8


def test_explicit_xla_is_kept_everywhere():
    for facts in (CPU, H100, V100, MI300):
        assert resolve_attention("xla", jnp.bfloat16, 64, facts) == "xla"


def test_explicit_cudnn_where_it_cannot_run_is_an_error_naming_the_device():
    assert resolve_attention("cudnn", jnp.bfloat16, 64, H100) == "cudnn"
    for facts, named in [(V100, "Tesla V100"), (T4, "7.5"), (MI300, "MI300X"), (CPU, "cpu")]:
        with pytest.raises(ValueError, match="model.attention=cudnn") as error:
            resolve_attention("cudnn", jnp.bfloat16, 64, facts)
        assert named in str(error.value)
    with pytest.raises(ValueError, match="float32"):
        resolve_attention("cudnn", jnp.float32, 64, H100)


def test_device_facts_of_this_machine_are_the_cpu():
    facts = DeviceFacts.of()
    assert facts.platform == "cpu" and facts.runtime == "" and facts.compute_capability is None


def test_gpu_sized_config_on_cpu_warns(config):
    assert cpu_warning(config, CPU) is None  # the tiny config is meant for a CPU
    config.data.tokens_per_batch = 25_000
    assert "25,000" in cpu_warning(config, CPU)
    assert cpu_warning(config, H100) is None
    config.data.tokens_per_batch = 2048
    config.data.source = "tfds"
    assert "wmt14_translate/de-en" in cpu_warning(config, CPU)


def test_published_peaks_are_dense_tensor_core_figures_and_unknown_elsewhere():
    assert published_peak(H100.kind, "bfloat16") == 989.4e12  # 1,979 sparse / 2
    assert published_peak(A100.kind, "bfloat16") == 312e12
    assert published_peak(V100.kind, "bfloat16") is None  # Volta has no bf16 tensor cores
    assert published_peak(V100.kind, "float16") == 125e12
    assert published_peak(H100.kind, "float32") is None
    assert published_peak(CPU.kind, "float32") is None
    assert published_peak(MI300.kind, "bfloat16") is None


class FakeLibc:
    """Stands in for glibc: records mallopt's (parameter, value) calls, accepts them all."""

    def __init__(self, name):
        self.calls = []

        def mallopt(param, value):
            self.calls.append((param, value))
            return 1

        self.mallopt = mallopt


def test_keep_freed_memory_sets_one_arena_and_high_thresholds(monkeypatch):
    for name in devices._MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    made = []
    monkeypatch.setattr(
        devices.ctypes, "CDLL", lambda name: made.append(FakeLibc(name)) or made[-1]
    )
    assert devices.keep_freed_memory()
    most = 2**31 - 1
    assert dict(made[0].calls) == {
        devices._M_ARENA_MAX: 1,
        devices._M_MMAP_THRESHOLD: most,
        devices._M_TRIM_THRESHOLD: most,
    }


@pytest.mark.parametrize("name", ["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"])
def test_keep_freed_memory_leaves_a_users_own_malloc_settings_alone(name, monkeypatch):
    monkeypatch.setenv(name, "8" if name == "MALLOC_ARENA_MAX" else "glibc.malloc.arena_max=8")
    monkeypatch.setattr(sys, "platform", "linux")
    made = []
    monkeypatch.setattr(
        devices.ctypes, "CDLL", lambda name: made.append(FakeLibc(name)) or made[-1]
    )
    assert not devices.keep_freed_memory()
    assert made == []  # glibc was not even opened


def test_keep_freed_memory_is_a_no_op_without_glibc(monkeypatch):
    for name in devices._MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")

    def no_glibc(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(devices.ctypes, "CDLL", no_glibc)
    assert not devices.keep_freed_memory()
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not devices.keep_freed_memory()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux's")
def test_glibc_accepts_the_settings():
    env = {k: v for k, v in os.environ.items() if k not in devices._MALLOC_SETTINGS}
    code = "from translate import devices; print(devices.keep_freed_memory())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    libc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else ""
    if not libc.startswith("glibc"):
        pytest.skip("not glibc")
    assert out.strip() == "True"


@pytest.mark.parametrize("platforms, expected", [("cpu", True), ("cuda", False), ("tpu", False)])
def test_malloc_is_left_alone_where_jax_may_run_on_an_accelerator(platforms, expected, monkeypatch):
    for name in devices._MALLOC_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("JAX_PLATFORMS", platforms)
    made = []
    monkeypatch.setattr(
        devices.ctypes, "CDLL", lambda name: made.append(FakeLibc(name)) or made[-1]
    )
    assert devices.cpu_only() == expected
    assert devices.keep_freed_memory() == expected
    assert len(made) == int(expected)


def test_an_installed_gpu_plugin_means_not_cpu_only(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(
        devices.importlib.metadata, "entry_points", lambda group: ["jax_cuda13_plugin"]
    )
    assert not devices.cpu_only()
    monkeypatch.setattr(devices.importlib.metadata, "entry_points", lambda group: [])
    monkeypatch.setattr(devices.importlib.util, "find_spec", lambda name: None)
    assert devices.cpu_only()


def test_the_memory_bound_is_within_the_process_address_space_limit():
    """Under `prlimit --as` the bound is what the limit leaves, and a refusal names the limit
    (it read 12.6 GB free from MemAvailable under a 3 GB limit)."""
    script = (
        "import resource\n"
        "import jax\n"
        "from translate.decoding import memory\n"
        "jax.local_devices()  # the backend's threads mapped before the limit is set\n"
        "mapped = [int(line.split()[1]) * 1024 for line in open('/proc/self/status')\n"
        "          if line.startswith('VmSize:')][0]\n"
        "resource.setrlimit(resource.RLIMIT_AS, (mapped + 2**30, resource.RLIM_INFINITY))\n"
        "print(memory.memory_bound())\n"
        "print(memory.over_bound(2**40))\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    bound, message = out.stdout.splitlines()
    assert 0 <= int(bound) <= 0.8 * 2**30
    assert "RLIMIT_AS" in message


def write_tree(root: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


MEMINFO = "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n"  # 64 GiB, 32 GiB available


@pytest.mark.parametrize(
    "files, free, named",
    [
        # cgroup v2: the process's own group and its parents; the tightest counts, less what it
        # uses, its reclaimable page cache (inactive_file) left out of the use.
        (
            {
                "proc/self/cgroup": "0::/jobs/one\n",
                "sys/fs/cgroup/memory.max": "max\n",
                "sys/fs/cgroup/jobs/memory.max": str(8 << 30),
                "sys/fs/cgroup/jobs/memory.current": str(2 << 30),
                "sys/fs/cgroup/jobs/memory.stat": f"anon 1\ninactive_file {1 << 30}\n",
                "sys/fs/cgroup/jobs/one/memory.max": "max\n",
                "sys/fs/cgroup/jobs/one/memory.current": str(1 << 30),
            },
            7 << 30,
            "memory.max",
        ),
        # cgroup v1: the memory controller's hierarchy; "unlimited" is a huge number.
        (
            {
                "proc/self/cgroup": "5:cpu:/\n4:memory:/batch/job\n0::/\n",
                "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                "sys/fs/cgroup/memory/batch/job/memory.limit_in_bytes": str(3 << 30),
                "sys/fs/cgroup/memory/batch/job/memory.usage_in_bytes": str(1 << 30),
                "sys/fs/cgroup/memory/batch/job/memory.stat": "total_inactive_file 0\n",
            },
            2 << 30,
            "memory.limit_in_bytes",
        ),
        # Inside a container the group's path may not be under the mount: its root is read.
        (
            {
                "proc/self/cgroup": "4:memory:/docker/abc\n",
                "sys/fs/cgroup/memory/memory.limit_in_bytes": str(4 << 30),
                "sys/fs/cgroup/memory/memory.usage_in_bytes": str(1 << 30),
            },
            3 << 30,
            "memory.limit_in_bytes",
        ),
        # No limit: MemAvailable.
        ({"proc/self/cgroup": "0::/\n", "sys/fs/cgroup/memory.max": "max\n"}, 32 << 30, "Mem"),
    ],
)
def test_host_memory_is_the_tightest_of_meminfo_and_the_cgroup_limits(
    files, free, named, tmp_path, monkeypatch
):
    root = write_tree(tmp_path, {"proc/meminfo": MEMINFO, **files})
    monkeypatch.setattr(devices.resource, "getrlimit", lambda _: (-1, -1))
    found = devices.host_memory(root)
    assert (found.free, named in found.limit) == (free, True), found


def test_host_memory_reads_the_address_space_and_data_limits(tmp_path, monkeypatch):
    status = "VmSize:\t 2097152 kB\nVmData:\t 524288 kB\n"  # 2 GiB mapped, 0.5 GiB of data
    root = write_tree(tmp_path, {"proc/meminfo": MEMINFO, "proc/self/status": status})
    limits = {devices.resource.RLIMIT_AS: 5 << 30, devices.resource.RLIMIT_DATA: -1}
    monkeypatch.setattr(devices.resource, "getrlimit", lambda which: (limits[which], -1))
    found = devices.host_memory(root)
    assert found.free == 3 << 30 and "RLIMIT_AS" in found.limit
    limits[devices.resource.RLIMIT_DATA] = 2 << 30
    found = devices.host_memory(root)
    assert found.free == (3 << 30) // 2 and "RLIMIT_DATA" in found.limit
    limits[devices.resource.RLIMIT_AS] = 1 << 30  # less than is mapped already: nothing free
    assert devices.host_memory(root).free == 0
