r"""Print configs' parameters per module, counted from shapes alone (nothing is allocated).

    python -m scripts.model_summary --config=configs/base.py --vocab_size=37000
    python -m scripts.model_summary --config=configs/multi30k.py \
        --config=configs/multi30k_postnorm.py --config=configs/multi30k_decoder_only.py

Each config's block ends with `total parameters: N`; with several configs, each total after
the first is also given relative to the first's.
"""

from __future__ import annotations

import collections

import jax

from translate import cli
from translate.config import Config, load_config
from translate.flags import Flag, parse_flags
from translate.models.factory import abstract_model

STACKS = ("encoder", "decoder")


def summarize(path: str, config: Config, vocab_size: int) -> int:
    """Prints one config's parameters by module and by sub-layer; returns the total."""
    _, shapes = abstract_model(config, vocab_size)  # jax.eval_shape underneath
    per_module: dict[str, int] = collections.Counter()
    per_sublayer: dict[str, int] = collections.Counter()
    for path_, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        names = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path_]
        # embed | encoder.N | decoder.N | a final norm, and each layer's sub-layers summed.
        module = ".".join(names[:2]) if names[0] in STACKS else names[0]
        per_module[module] += leaf.size
        if names[0] in STACKS:
            per_sublayer[f"{names[0]}.*.{names[2]}"] += leaf.size
    width = max(len(name) for name in [*per_sublayer, *per_module])
    m = config.model
    layers = f"{m.num_layers}+{m.num_layers} layers"
    if m.architecture == "decoder_only":
        layers = f"{m.num_layers} decoder-only layers ({m.prefix_attention} prefix)"
    print(
        f"{path}: d_model {m.d_model}, d_ff {m.d_ff}, {layers}, {m.norm_position}-LayerNorm, "
        f"vocabulary {vocab_size}"
    )

    def place(name: str) -> tuple:  # the embeddings first, then each stack's layers in order
        first, _, number = name.partition(".")
        return first != "embed", first, int(number or 0)

    for name in sorted(per_module, key=place):
        print(f"  {name:<{width}}  {per_module[name]:>12,}")
    print("  summed over layers:")
    for name, count in sorted(per_sublayer.items()):
        print(f"  {name:<{width}}  {count:>12,}")
    total = sum(per_module.values())
    print(f"total parameters: {total}")
    return total


FLAGS = {
    "config": Flag([], "A config file or an example config's name; repeat it to compare totals."),
    "vocab_size": Flag(0, "Vocabulary size to count with; 0: each config's data.vocab_size."),
}


def main(argv: list[str]) -> None:
    flags, overrides = parse_flags(argv, FLAGS, doc=__doc__)
    totals = []
    for path in flags["config"] or ["configs/base.py"]:
        config = load_config(path, overrides)
        totals.append(summarize(path, config, flags["vocab_size"] or config.data.vocab_size))
    for path, total in zip(flags["config"][1:], totals[1:]):
        print(f"{path}: {total:,} parameters, {100 * (total / totals[0] - 1):+.2f}% of the first")


if __name__ == "__main__":
    cli.run(main)
