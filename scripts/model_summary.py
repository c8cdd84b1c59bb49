"""Print a config's parameters per module, counted from shapes alone (nothing is allocated).

    python -m scripts.model_summary --config=configs/base.py --vocab_size=37000

The last line is `total parameters: N`.
"""

from __future__ import annotations

import collections

import jax

from translate import cli
from translate.config import Flag, load_config, parse_flags
from translate.model import abstract_model


def main(argv: list[str]) -> None:
    flags, overrides = parse_flags(
        argv,
        {
            "config": Flag("base", "A config file or an example config's name."),
            "vocab_size": Flag(
                0, "Vocabulary size to count with; 0: the config's data.vocab_size."
            ),
        },
        doc=__doc__,
    )
    config = load_config(flags["config"], overrides)
    vocab_size = flags["vocab_size"] or config.data.vocab_size
    _, shapes = abstract_model(config, vocab_size)  # jax.eval_shape underneath
    per_module: dict[str, int] = collections.Counter()
    per_sublayer: dict[str, int] = collections.Counter()
    for path, leaf in jax.tree_util.tree_leaves_with_path(shapes):
        names = [str(getattr(p, "key", getattr(p, "idx", p))) for p in path]
        # embed | encoder.N | decoder.N, and each layer's sub-layers summed over layers.
        module = ".".join(names[:2]) if names[0] in ("encoder", "decoder") else names[0]
        per_module[module] += leaf.size
        if names[0] in ("encoder", "decoder"):
            per_sublayer[f"{names[0]}.*.{names[2]}"] += leaf.size
    width = max(len(name) for name in per_sublayer)
    print(
        f"{flags['config']}: d_model {config.model.d_model}, {config.model.num_layers}+"
        f"{config.model.num_layers} layers, vocabulary {vocab_size}"
    )
    order = sorted(
        per_module,
        key=lambda n: (
            n.split(".")[0] != "embed",
            n.split(".")[0],
            int(n.split(".")[1]) if "." in n else 0,
        ),
    )
    for name in order:
        print(f"  {name:<{width}}  {per_module[name]:>12,}")
    print("  summed over layers:")
    for name, count in sorted(per_sublayer.items()):
        print(f"  {name:<{width}}  {count:>12,}")
    print(f"total parameters: {sum(per_module.values())}")


if __name__ == "__main__":
    cli.run(main)
