"""The default models keep their numbers: parameters at init, logits and cached decoding of the
shipped configs, against values stored in tests/default_model.json.

Every switch a config leaves off must leave the model it builds as it was: a change to a
block that moves the paper's model, or a recipe's, fails here. The values are summaries
(each parameter's sum and sum of squares, some logits, a log-sum-exp over the vocabulary) and
compared within a tolerance, not as hashes: another processor rounds float32 otherwise.

A change that means to change these models rewrites the file, and says so in its commit:

    python tests/test_default_model.py --write
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

if __name__ == "__main__":  # as a script: the 8 fake devices of conftest.py
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model import unpacked_batch

from translate.config import load_config
from translate.data.tokenizer import BOS_ID, EOS_ID
from translate.models.factory import make_model

ROOT = pathlib.Path(__file__).resolve().parent.parent
STORED = pathlib.Path(__file__).with_name("default_model.json")
# The paper's base model, the Multi30k recipe (pre-LayerNorm) and its decoder-only variant, each
# at its own vocabulary size. Big is base at other sizes; the quickstart is a two-layer model of
# the paper's blocks, as base is, and building each config costs seconds here.
CONFIGS = ("base", "multi30k", "multi30k_decoder_only")
# Sources of two lengths (the second padded), and the first target tokens; ids below every
# config's vocabulary.
SRC = np.array([[5, 6, 7, 8, 9, 10, EOS_ID, 0], [11, 12, EOS_ID, 0, 0, 0, 0, 0]], np.int32)
TGT = np.array([[BOS_ID, 14, 15, 16, 17, 18], [BOS_ID, 19, 20, 21, 22, 23]], np.int32)
STEPS = 4  # greedy steps of cached decoding
SHOWN = 16  # logits kept per position: the first SHOWN pieces of the vocabulary
# Parameters are drawn by threefry, the same bits on every processor, then scaled; logits pass
# through a few layers of float32 arithmetic that another processor may round otherwise.
PARAMETER_RTOL = 1e-6
LOGITS_TOL = 1e-4


def summary(logits: jax.Array) -> dict[str, list]:
    """The first SHOWN logits and the log-sum-exp over all pieces, at every position."""
    logits = np.asarray(logits, np.float64)
    lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    return {"shown": logits[..., :SHOWN].tolist(), "logsumexp": lse.tolist()}


def measure(name: str) -> dict:
    """What the config's model computes: its parameters at init (seed 0), its teacher-forced
    logits, and STEPS greedy steps of cached decoding."""
    config = load_config(ROOT / "configs" / f"{name}.py")
    model = make_model(config.model, config.data.vocab_size, nnx.Rngs(0))
    parameters = {}
    for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        array = np.asarray(value.get_value(), np.float64)
        parameters[".".join(map(str, path))] = [array.sum(), (array**2).sum()]
    src_segments = jnp.asarray((SRC > 0).astype(np.int32))
    cache = model.prefill(jnp.asarray(SRC), src_segments, 1, STEPS)
    tokens, steps = jnp.full((SRC.shape[0],), BOS_ID), []
    for t in range(STEPS):
        logits, cache = model.decode_step(tokens, jnp.array(t), cache)
        tokens = jnp.argmax(logits, axis=-1)
        steps.append({**summary(logits), "tokens": np.asarray(tokens).tolist()})
    return {
        "parameters": parameters,
        # Compiled whole: op by op, the base model's forward pass took 9 s here, compiled 2 s.
        "logits": summary(nnx.jit(lambda m, b: m(b))(model, unpacked_batch(SRC, TGT))),
        "cached_decoding": steps,
    }


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text())


def close(actual, expected, rtol: float, atol: float, what: str) -> None:
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol, err_msg=what
    )


@pytest.mark.parametrize("name", CONFIGS)
def test_a_default_model_computes_its_stored_numbers(name, stored):
    expected, actual = stored[name], measure(name)
    assert sorted(actual["parameters"]) == sorted(expected["parameters"]), "parameter names"
    for path, sums in expected["parameters"].items():
        close(actual["parameters"][path], sums, PARAMETER_RTOL, 1e-6, f"{name}: {path}")
    for key in ("shown", "logsumexp"):
        close(actual["logits"][key], expected["logits"][key], LOGITS_TOL, LOGITS_TOL, key)
    for t, (got, want) in enumerate(zip(actual["cached_decoding"], expected["cached_decoding"])):
        assert got["tokens"] == want["tokens"], f"{name}: step {t}"
        for key in ("shown", "logsumexp"):
            close(got[key], want[key], LOGITS_TOL, LOGITS_TOL, f"{name}: step {t} {key}")


def test_the_stored_numbers_cover_every_config_checked(stored):
    assert sorted(stored) == sorted(CONFIGS)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_default_model.py --write")
    values = {name: measure(name) for name in CONFIGS}
    STORED.write_text(json.dumps(values, indent=1) + "\n")
    print(f"wrote {STORED}")
