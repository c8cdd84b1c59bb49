r"""Sample text from a trained model with temperature and top-k: the sample command.

    python -m translate.sample --workdir=/tmp/lm --prompt="Ein Hund" [--num_samples=5] \
        [--temperature=0.8] [--top_k=40] [--max_new_tokens=50] [--seed=0] \
        [--step=N | --average=N] [--source=TEXT]

Prints each sample on its own line, the likeliest first: the prompt and its continuation, up to
EOS or --max_new_tokens; the draws are translate-text's sampler's (`--sampling=topk` or
`ancestral`), each sample from its own stream of --seed. Made for a language model (a
decoder-only model trained with data.source=monolingual, whose source is empty); with a
translation model, --source gives the sentence whose translation is sampled (starting with
--prompt). """

from __future__ import annotations

from collections.abc import Sequence

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

import numpy as np

from translate import cli, compilation
from translate.config import MAX_EXTRA_LEN
from translate.data.tokenizer import EOS_ID
from translate.decoding.search import sample_search
from translate.decoding.settings import check_values
from translate.flags import (
    Flag,
    checkpoint_choice,
    checkpoint_flags,
    compilation_cache_flag,
    parse_flags,
)
from translate.streams import say, unknown_characters_warning
from translate.trained import load_ensemble

_imports_done()


def main(argv: Sequence[str]) -> None:
    cli.quiet_libraries()
    flags, _ = parse_flags(
        list(argv),
        {
            "workdir": Flag("", "Required. A training workdir (a language model's, usually)."),
            **checkpoint_flags("sample from"),
            "prompt": Flag("", "The text each sample starts with."),
            "source": Flag(
                "", "For a translation model: the sentence whose translation is sampled."
            ),
            "num_samples": Flag(1, "How many samples to draw."),
            "temperature": Flag(1.0, "Divides the logits; lower is closer to arg-max."),
            "top_k": Flag(0, "Draw from the k most likely pieces only; 0: the whole vocabulary."),
            "max_new_tokens": Flag(50, "The most pieces added after the prompt."),
            "seed": Flag(0, "Seed of the random draws."),
            **compilation_cache_flag(),
        },
        doc=__doc__,
        sections=(),
    )
    if not flags["workdir"]:
        raise SystemExit("--workdir is required: python -m translate.sample --workdir=DIR ...")
    # translate-text's rules for the same settings (an infinite temperature drew from the
    # whole vocabulary, the length limit's and the prompt's masks divided away), then this
    # command's own; --max_new_tokens at most what the search allows past its source, since
    # the search allocates its cache for the longest output (1e9 asked for 1.3 TB).
    check_values({name: flags[name] for name in ("temperature", "top_k", "seed")})
    for name, ok, rule in [
        ("num_samples", flags["num_samples"] >= 1, ">= 1"),
        (
            "max_new_tokens",
            1 <= flags["max_new_tokens"] <= MAX_EXTRA_LEN,
            f"in [1, {MAX_EXTRA_LEN}]",
        ),
    ]:
        if not ok:
            raise SystemExit(f"--{name}={flags[name]}: must be {rule}")
    step, average = checkpoint_choice(flags)
    compilation.use_persistent_cache(flags["compilation_cache"])
    graphdefs, params, tokenizer, _, _ = load_ensemble(
        [flags["workdir"]], step, average, params=flags["params"]
    )
    if flags["top_k"] > tokenizer.vocab_size:
        raise SystemExit(
            f"--top_k={flags['top_k']}: the vocabulary has only {tokenizer.vocab_size} pieces"
        )
    source = tokenizer.encode_source([flags["source"]])[0] + [EOS_ID]
    prompt = tokenizer.encode_target([flags["prompt"]])[0]
    if warning := unknown_characters_warning(prompt, f"--prompt={flags['prompt']!r}"):
        say(warning)
    # The search lets an output run to (source pieces) + max_extra_len pieces before EOS; the
    # prompt is forced as the output's first pieces and counts among them.
    max_extra_len = len(prompt) + flags["max_new_tokens"] - (len(source) - 1)
    tokens, _ = sample_search(
        graphdefs,
        params,
        np.asarray([source], np.int32),  # [1, S]
        np.asarray([[flags["seed"], 0]], np.uint32),  # the stream: seed, line 0
        np.asarray([prompt], np.int32),  # [1, P], forced
        method="topk" if flags["top_k"] else "ancestral",
        temperature=flags["temperature"],
        top_k=flags["top_k"],
        num_candidates=flags["num_samples"],
        max_extra_len=max_extra_len,
    )  # [1, N, L], likeliest first
    for row in np.asarray(tokens)[0]:
        # Flushed here, so that a reader gone (`| head -1`) is met while `cli.run` watches.
        print(tokenizer.decode(row), flush=True)


def console_main() -> None:
    """`translate-sample`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
