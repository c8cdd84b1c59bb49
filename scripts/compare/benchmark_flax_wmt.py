r"""Times Flax's own examples/wmt train step on the batches scripts/benchmark.py uses.

    pip download flax==0.12.8 --no-binary :all: --no-deps && tar xzf flax-0.12.8.tar.gz
    python -m scripts.compare.benchmark_flax_wmt --flax_wmt=flax-0.12.8/examples/wmt \
        --config=configs/small.py --src=... --tgt=... --batch_tokens=2048 [--vocab=SPM_MODEL] \
        [--steps=20] [--attention_dropout=0.1] [--json=PATH]

BENCHMARKS.md's reference point, run on the same machine right beside ours. Flax's `models.py`
and `train.py` are imported from the directory given (the sdist on PyPI carries the examples),
nothing copied; what its train.py imports only for input, logging and BLEU (TensorFlow, clu,
ml_collections) is replaced by empty stand-ins, which `train_step` never uses.

The model is the config's (layers, d_model, heads, d_ff, dropout, vocabulary) in float32, built
as the example builds it (shared embeddings, logits via the embedding, Xavier initialisation);
`--attention_dropout` is the example's dropout on attention probabilities (0.1 by default; the
paper's model, and ours, has none). Its `train_step` runs under `jax.pmap` with its AdamW and
warm-up, as its train.py runs it, on scripts/benchmark.py's packed rows under the example's
feature names; each step is timed until its metrics are ready; the figure is the median.
"""

from __future__ import annotations

import functools
import json
import pathlib
import statistics
import sys
import tempfile
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

from scripts.benchmark import environment, get_tokenizer
from translate import cli
from translate.config import load_config
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import tokenize_parallel
from translate.data.text import read_parallel
from translate.flags import Flag, parse_flags

FLAGS = {
    "flax_wmt": Flag("", "Required. The examples/wmt directory of Flax's source distribution."),
    "config": Flag("", "Required. A config file or an example config's name."),
    "src": Flag("", "Required. Source side of the parallel text that batches are packed from."),
    "tgt": Flag("", "Required. Target side, aligned with --src."),
    "batch_tokens": Flag(2048, "Target token slots per batch (and as many source slots)."),
    "vocab": Flag("", "A SentencePiece model to use instead of training one on --src/--tgt."),
    "steps": Flag(20, "Timed training steps (after --warmup); the figure is the median."),
    "warmup": Flag(3, "Untimed training steps first (compilation)."),
    "attention_dropout": Flag(0.1, "The example's dropout on attention probabilities."),
    "json": Flag("", "Write the figures to this JSON file."),
}


class StandIn(types.ModuleType):
    """A module whose every attribute is another stand-in (for annotations such as tf.data)."""

    def __getattr__(self, name: str) -> StandIn:
        if name.startswith("__"):
            raise AttributeError(name)
        return StandIn(f"{self.__name__}.{name}")


def stub_modules() -> None:
    """Empty stand-ins for what the example's train.py imports but train_step never uses."""
    # Flax's own modules look for TensorFlow when imported: import them before the stand-in.
    import flax.io  # noqa: F401
    import flax.training.checkpoints  # noqa: F401

    names = "tensorflow clu clu.metric_writers clu.periodic_actions ml_collections bleu decode"
    for name in [*names.split(), "input_pipeline"]:
        try:
            __import__(name)
        except ImportError:
            sys.modules[name] = StandIn(name)
    try:
        import absl.logging  # noqa: F401
    except ImportError:
        sys.modules["absl"], sys.modules["absl.logging"] = StandIn("absl"), StandIn("absl.logging")


def main(argv: list[str]) -> None:
    flags, overrides = parse_flags(argv, FLAGS, doc=__doc__)
    for name in ("flax_wmt", "config", "src", "tgt"):
        if not flags[name]:
            raise SystemExit(f"--{name} is required")
    stub_modules()
    sys.path.insert(0, str(pathlib.Path(flags["flax_wmt"]).resolve()))
    import models  # the example's
    import optax
    import train
    from flax import jax_utils
    from flax import linen as nn

    config = load_config(flags["config"], overrides)
    m = config.model
    with tempfile.TemporaryDirectory() as tmp:
        src, tgt = read_parallel(flags["src"], flags["tgt"])
        tokenizer = get_tokenizer(flags, config, pathlib.Path(tmp))
    corpus, _ = tokenize_parallel(tokenizer, src, tgt, config.data.max_len)
    layout = BatchLayout.from_config(flags["batch_tokens"], config.data.row_len, 1, 1)
    needed = flags["warmup"] + flags["steps"]
    plan = plan_epoch(corpus, layout, seed=0, epoch=0)
    plan = (plan * -(-needed // len(plan)))[:needed]
    vocab_size = max(config.data.vocab_size, tokenizer.vocab_size)
    devices = jax.local_devices()

    sizes = dict(vocab_size=vocab_size, output_vocab_size=vocab_size, emb_dim=m.d_model)
    sizes.update(num_heads=m.num_heads, num_layers=m.num_layers, qkv_dim=m.d_model, mlp_dim=m.d_ff)
    sizes.update(max_len=config.data.row_len, dropout_rate=m.dropout_rate)
    init = dict(
        kernel_init=nn.initializers.xavier_uniform(), bias_init=nn.initializers.normal(1e-6)
    )
    flax_config = models.TransformerConfig(
        share_embeddings=True, logits_via_embedding=True, dtype=jnp.float32,
        attention_dropout_rate=flags["attention_dropout"], deterministic=False, decode=False,
        **sizes, **init,
    )  # fmt: skip
    shape = (layout.rows // len(devices), layout.row_len)
    init_model = models.Transformer(flax_config.replace(deterministic=True))
    params = jax.jit(init_model.init)(
        jax.random.key(0), jnp.ones(shape, jnp.float32), jnp.ones(shape, jnp.float32)
    )["params"]
    schedule = train.create_learning_rate_schedule(learning_rate=0.002, warmup_steps=1000)
    adamw = optax.adamw(learning_rate=schedule, b1=0.9, b2=0.98, eps=1e-9, weight_decay=0.0)
    state = train.TrainState.create(
        apply_fn=init_model.apply, params=params, tx=adamw, dynamic_scale=None
    )
    state = jax_utils.replicate(state)
    smoothing = config.train.label_smoothing
    step_fn = functools.partial(train.train_step, config=flax_config, learning_rate_fn=schedule)
    step_fn = functools.partial(step_fn, label_smoothing=smoothing)
    p_train_step = jax.pmap(step_fn, axis_name="batch", donate_argnums=(0,))
    dropout_rngs = jax.random.split(jax.random.key(1), len(devices))

    def to_flax(batch):  # our packed rows under the example's feature names, per device
        names = {"inputs": "src", "targets": "tgt_out", "inputs_position": "src_positions"}
        names.update(targets_position="tgt_positions", inputs_segmentation="src_segments")
        names.update(targets_segmentation="tgt_segments")
        return {k: getattr(batch, v)[0].reshape(len(devices), *shape) for k, v in names.items()}

    batches = [make_batch(corpus, rows, layout) for rows in plan]
    times = []
    for step, batch in enumerate(batches):
        start = time.perf_counter()
        state, metrics = p_train_step(state, to_flax(batch), dropout_rng=dropout_rngs)
        jax.block_until_ready(metrics)
        if step >= flags["warmup"]:
            times.append(time.perf_counter() - start)
    real_tgt = np.median([(b.tgt_segments > 0).sum() for b in batches[flags["warmup"] :]])
    step_s = statistics.median(times)
    result = {
        "implementation": f"flax examples/wmt ({flags['flax_wmt']})",
        "config": flags["config"],
        "attention_dropout": flags["attention_dropout"],
        **environment(),
        "batch_layout": f"{layout.rows} rows x {layout.row_len} slots",
        "step_seconds_median": step_s,
        "train_tgt_tokens_per_sec": float(real_tgt) / step_s,
        "timed_steps": len(times),
    }
    print(
        f"flax examples/wmt, {flags['config']}, attention dropout {flags['attention_dropout']}: "
        f"median step {step_s * 1e3:.1f} ms over {len(times)} steps, "
        f"{result['train_tgt_tokens_per_sec']:.0f} non-pad target tokens/s"
    )
    if flags["json"]:
        pathlib.Path(flags["json"]).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    cli.run(main)
