r"""What a decoding step's output projection and softmax cost, and what the fast paths would save.

    python -m scripts.benchmark_projection [--config=configs/multi30k.py] [--batch=32] \
        [--beam=4] [--steps=100] [--repeats=15] [--json=PATH]

A search step ends in the projection of each hypothesis's state onto the vocabulary and its
log-softmax: [rows, D] x [D, V] with rows = batch x beam. For the Multi30k recipe (D 128,
V 8,000) that is 61% of a step's multiply-adds. This times, in a loop of `steps` compiled
steps (each feeding the next, as a search does), the projection as the model computes it and
the candidates for computing less (docs/speed.md):

  full             every piece of the vocabulary (what the searches do today)
  union C          a shortlist of C pieces shared by the batch: one [D, C] matrix gathered
                   once per batch (Marian's and CTranslate2's vocabulary shortlists)
  per-sentence C   C pieces of each sentence's own: a batched product over [B, C, D]
  int8             int8 x int8 -> int32 products over the whole vocabulary, per-row scales

The shortlists' pieces are drawn at random here: the cost does not depend on which they are.
Prints one line per variant (median milliseconds per step over `repeats` calls) and, with
--json, writes them. Random weights; the figures are the products' and the softmax's alone,
not a search's.
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from translate.config import load_config
from translate.flags import Flag, parse_flags

FLAGS = {
    "config": Flag("configs/multi30k.py", "The config whose d_model and vocab_size to use."),
    "batch": Flag(32, "Sentences per batch (the decode batch size)."),
    "beam": Flag(4, "Hypotheses per sentence (1: greedy)."),
    "steps": Flag(100, "Steps in one compiled loop."),
    "repeats": Flag(15, "Calls of each loop; the median is printed."),
    "json": Flag("", "Where to write the figures as JSON."),
}
SHORTLISTS = (512, 1024, 2048, 4096)


def loop(step, steps: int):
    """`steps` applications of `step` (state, log-probs of a row) feeding each other."""

    def run(h, *weights):
        def body(_, c):
            lp = step(c, *weights)  # [rows, C]
            return c + lp[:, : c.shape[1]] * 1e-3  # the next state depends on this step's

        return jax.lax.fori_loop(0, steps, body, h)

    return run


def full(h, table):
    return jax.nn.log_softmax(h @ table.T)  # [rows, V]


def union(h, table_c):
    return jax.nn.log_softmax(h @ table_c.T)  # [rows, C]


def per_sentence(batch: int, beam: int):
    def step(h, table_bc):  # table_bc [B, C, D]
        x = h.reshape(batch, beam, -1)
        return jax.nn.log_softmax(jnp.einsum("bwd,bcd->bwc", x, table_bc)).reshape(batch * beam, -1)

    return step


def int8(h, table_q, scale):
    row_scale = jnp.max(jnp.abs(h), axis=1, keepdims=True) / 127.0  # [rows, 1]
    hq = jnp.round(h / row_scale).astype(jnp.int8)
    products = jax.lax.dot_general(
        hq, table_q, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )  # [rows, V]
    return jax.nn.log_softmax(products.astype(jnp.float32) * row_scale * scale[None])


def timed(run, args, steps: int, repeats: int) -> float:
    """Median milliseconds per step of the compiled loop `run(*args)`."""
    compiled = jax.jit(run)
    compiled(*args).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        compiled(*args).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3 / steps


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    config = load_config(flags["config"])
    d, vocab = config.model.d_model, config.data.vocab_size
    batch, beam, steps = flags["batch"], flags["beam"], flags["steps"]
    for name in ("batch", "beam", "steps", "repeats"):
        if flags[name] < 1:
            raise SystemExit(f"--{name}={flags[name]}: must be >= 1")
    rows = batch * beam
    keys = jax.random.split(jax.random.key(0), 2)
    h = jax.random.normal(keys[0], (rows, d))
    table = jax.random.normal(keys[1], (vocab, d))
    rng = np.random.default_rng(0)
    results = {"full": timed(loop(full, steps), (h, table), steps, flags["repeats"])}
    for c in (c for c in SHORTLISTS if c < vocab):
        chosen = table[rng.choice(vocab, c, replace=False)]  # [C, D]
        results[f"union_{c}"] = timed(loop(union, steps), (h, chosen), steps, flags["repeats"])
        own = table[rng.integers(0, vocab, (batch, c))]  # [B, C, D]
        step = per_sentence(batch, beam)
        results[f"per_sentence_{c}"] = timed(loop(step, steps), (h, own), steps, flags["repeats"])
    scale = jnp.max(jnp.abs(table), axis=1) / 127.0
    table_q = jnp.round(table / scale[:, None]).astype(jnp.int8)
    results["int8"] = timed(loop(int8, steps), (h, table_q, scale), steps, flags["repeats"])
    print(f"rows {rows} ({batch} x {beam}), d_model {d}, vocabulary {vocab}; ms per step:")
    for name, ms in results.items():
        print(f"  {name:<20} {ms:8.4f}   {results['full'] / ms:5.2f}x of full")
    if flags["json"]:
        record = {"rows": rows, "d_model": d, "vocab_size": vocab, "ms_per_step": results}
        pathlib.Path(flags["json"]).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
