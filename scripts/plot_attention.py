r"""Draw where a trained model attends while it translates one sentence, as PNG heatmaps.

    python -m scripts.plot_attention --workdir=/tmp/quickstart \
        --src="the small dog sees the old man ." [--output=DIR] [--layer=L] [--head=H]

writes into DIR (default WORKDIR/attention):
  cross_layerL_headH.png     encoder-decoder attention of one head: target x source pieces
  cross_layerL_mean.png      the same, averaged over the heads
  encoder_layerL_headH.png   encoder self-attention of that layer and head: source x source
  encoder_layerL_mean.png    the same, averaged over the heads
  positions.png              the sinusoidal position encodings (Sec. 3.5)
Layers and heads count from 0 (default: the last layer's head 0). The pictures come from a
teacher-forced pass over the translation (the workdir's decode settings), each target piece's
row being the query that predicted it.
"""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt
from flax import nnx

from translate import cli
from translate.data.batching import Batch, source_batches
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding.search import translate_tokens
from translate.decoding.settings import decode_settings
from translate.flags import Flag, parse_flags
from translate.models.positions import sinusoidal_positions
from translate.trained import load_model
from translate.workdir import Workdir

# Every picture has this size (inches) and resolution, so it is FIGSIZE * DPI pixels.
FIGSIZE = (8.0, 8.0)
DPI = 120


def translate_one(graphdef, params, tokenizer, config, text: str) -> tuple[list[int], list[int]]:
    """Source ids and output ids of one sentence, each ending in EOS."""
    _, tokens = next(source_batches(tokenizer, [text], 1, config.data.max_len))  # [1, S]
    settings = decode_settings(config.decode)
    best = translate_tokens((graphdef,), (params,), jnp.asarray(tokens), settings)
    src = [int(t) for t in tokens[0] if t != PAD_ID]
    out = [int(t) for t in np.asarray(best[0])]
    return src, out[: out.index(EOS_ID) + 1] if EOS_ID in out else out


def attention_maps(graphdef, params, src: list[int], out: list[int]) -> dict[str, np.ndarray]:
    """Every attention's weights [H, Tq, Tk] for a teacher-forced pass, by module path."""
    tgt_in = [BOS_ID] + out[:-1]
    batch = Batch(
        src=jnp.array([src]),
        src_segments=jnp.ones((1, len(src)), jnp.int32),
        src_positions=jnp.arange(len(src))[None],
        tgt_in=jnp.array([tgt_in]),
        tgt_segments=jnp.ones((1, len(tgt_in)), jnp.int32),
        tgt_positions=jnp.arange(len(tgt_in))[None],
    )
    weights = nnx.merge(graphdef, params).attention_weights(batch)
    return {name: np.asarray(w[0]) for name, w in weights.items()}


def draw_heatmap(values, row_labels, col_labels, title, axis_names, path, cmap="viridis") -> None:
    """`values` [rows, cols] as a PNG at `path`, each row and column labelled by its piece."""
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    image = ax.imshow(values, cmap=cmap, aspect="auto", interpolation="nearest")
    # Labels shrink as the sentence grows, so every piece keeps its own tick.
    size = float(np.clip(300 / max(len(row_labels), len(col_labels), 1), 4, 10))
    if col_labels:
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=90, fontsize=size)
    if row_labels:
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=size)
    ax.set_xlabel(axis_names[0])
    ax.set_ylabel(axis_names[1])
    ax.set_title(title)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    # No bbox_inches="tight": the file keeps exactly FIGSIZE * DPI pixels.
    fig.savefig(path)
    plt.close(fig)


FLAGS = {
    "workdir": Flag("", "Required. A trained workdir."),
    "src": Flag("", "Required. The sentence to translate and draw."),
    "output": Flag("", "Directory for the pictures; default WORKDIR/attention."),
    "layer": Flag(-1, "The layer to draw, from 0; -1: the last."),
    "head": Flag(0, "The attention head to draw, from 0."),
}


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    if not flags["workdir"] or not flags["src"].strip():
        raise SystemExit(f"--workdir and --src are required\n\n{__doc__}")
    out_dir = pathlib.Path(flags["output"] or Workdir(flags["workdir"]).attention)
    cli.check_writable(out_dir, f"--output={out_dir}")  # before the model is loaded
    cli.quiet_libraries()
    graphdef, params, tokenizer, config, steps = load_model(flags["workdir"])
    if config.model.architecture != "encoder_decoder":
        raise SystemExit(
            f"--workdir={flags['workdir']}: a {config.model.architecture} model; the pictures "
            "are of the encoder-decoder's encoder and cross-attention"
        )
    step = steps[0] if len(steps) == 1 else f"mean of {steps}"
    num_layers, num_heads = config.model.num_layers, config.model.num_heads
    layer = flags["layer"] % num_layers if flags["layer"] < 0 else flags["layer"]
    head = flags["head"]
    if not 0 <= layer < num_layers:
        raise SystemExit(f"--layer={flags['layer']}: this model has layers 0 to {num_layers - 1}")
    if not 0 <= head < num_heads:
        raise SystemExit(f"--head={head}: this model has heads 0 to {num_heads - 1}")

    out_dir.mkdir(parents=True, exist_ok=True)
    src, out = translate_one(graphdef, params, tokenizer, config, flags["src"])
    src_pieces, out_pieces = tokenizer.pieces(src), tokenizer.pieces(out)
    print(f"step {step}: {flags['src']}  ->  {tokenizer.decode(out)}")
    maps = attention_maps(graphdef, params, src, out)
    cross = maps[f"decoder.{layer}.cross_attention"]  # [H, T, S]
    encoder = maps[f"encoder.{layer}.self_attention"]  # [H, S, S]
    pictures = [
        (cross[head], out_pieces, src_pieces, "cross", f"head{head}", ("source", "target")),
        (cross.mean(0), out_pieces, src_pieces, "cross", "mean", ("source", "target")),
        (encoder[head], src_pieces, src_pieces, "encoder", f"head{head}", ("key", "query")),
        (encoder.mean(0), src_pieces, src_pieces, "encoder", "mean", ("key", "query")),
    ]
    for values, rows, cols, kind, which, axis_names in pictures:
        name = "encoder-decoder " if kind == "cross" else "encoder self-"
        heads = f"head {head}" if which != "mean" else f"mean of {num_heads} heads"
        path = out_dir / f"{kind}_layer{layer}_{which}.png"
        title = f"{name}attention, layer {layer}, {heads} (step {step})"
        draw_heatmap(values, rows, cols, title, axis_names, path)
        print(path)

    d_model, path = config.model.d_model, out_dir / "positions.png"
    positions = np.asarray(sinusoidal_positions(jnp.arange(config.data.max_len), d_model))
    axes = ("channel (even: sin, odd: cos)", "position")
    title = f"sinusoidal position encodings, d_model {d_model}"
    draw_heatmap(positions, [], [], title, axes, path, cmap="RdBu")
    print(path)


if __name__ == "__main__":
    cli.run(main)
