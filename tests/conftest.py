"""Test setup: 8 fake CPU devices (set before JAX is imported) and a tiny config."""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from translate.config import Config  # noqa: E402


def tiny_config() -> Config:
    """A model and data small enough for a train step in well under a second on CPU."""
    config = Config()
    config.model.num_layers = 2
    config.model.d_model = 32
    config.model.num_heads = 4
    config.model.d_ff = 64
    config.data.source = "synthetic"
    config.data.vocab_size = 200
    config.data.max_len = 32
    config.data.row_len = 32
    config.data.tokens_per_batch = 32 * 16
    config.data.synthetic_num_train = 400
    config.data.synthetic_num_dev = 16
    config.data.synthetic_num_test = 16
    config.train.num_train_steps = 6
    config.train.warmup_steps = 10
    config.train.log_every_steps = 2
    config.train.checkpoint_every_steps = 3
    config.train.eval_every_steps = 100
    config.decode.batch_size = 8
    config.decode.eval_num_sentences = 8
    config.decode.max_extra_len = 8
    return config.validate()


@pytest.fixture
def config() -> Config:
    return tiny_config()
