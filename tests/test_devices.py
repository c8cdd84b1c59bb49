"""The attention-kernel choice and the CPU warning (translate/devices.py), given device facts."""

import jax.numpy as jnp
import pytest

from translate.devices import DeviceFacts, cpu_warning, published_peak, resolve_attention

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
