r"""Sampling speed, candidates per second: translate-text's sampling against CTranslate2's.

    python -m scripts.compare.sampling_speed --workdir=DIR --export=CT2DIR --src=test2016.en \
        [--num_candidates=8] [--top_k=10] [--batch_size=32] [--repeats=3] [--threads=2]

Ours, in this process: N samples of each sentence, ancestral (the whole vocabulary) and
top-k, `batch_size` sentences (N x batch_size rows) a search; an untimed pass compiles, then
`repeats` timed ones. CTranslate2 right after, in its own process, on the export
(`scripts/compare/ctranslate2_speed.py --num_hypotheses=N --sampling_topk=0,K`) with the same
sentences, batches and length limit. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--export", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--num_candidates", type=int, default=8)
    parser.add_argument("--top_k", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    from translate.decoding.sentences import translate_sentences
    from translate.decoding.settings import decode_settings
    from translate.trained import load_ensemble

    graphdefs, params, tokenizer, config, _ = load_ensemble([args.workdir])
    with open(args.src, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f]
    n = args.num_candidates
    ours = {}
    for name, given in (
        ("ancestral", {"sampling": "ancestral"}),
        (f"topk={args.top_k}", {"sampling": "topk", "top_k": args.top_k}),
    ):
        settings = decode_settings(
            config.decode,
            {**given, "num_candidates": n, "batch_size": args.batch_size, "beam_size": 1},
        )

        def one_pass(settings=settings) -> float:
            start = time.perf_counter()
            translate_sentences(
                graphdefs, params, tokenizer, sentences, settings, config.data.max_len
            )
            return time.perf_counter() - start

        one_pass()  # compiles
        seconds = [one_pass() for _ in range(args.repeats)]
        ours[name] = len(sentences) * n / statistics.median(seconds)
        print(
            f"ours {name} x{n}: {ours[name]:.1f} candidates/s "
            f"(median of {', '.join(f'{s:.2f}' for s in seconds)} s)",
            flush=True,
        )
    command = [sys.executable, "-m", "scripts.compare.ctranslate2_speed", f"--model={args.export}"]
    command += [f"--src={args.src}", f"--threads={args.threads}", f"--batch_size={args.batch_size}"]
    command += [f"--max_extra_len={config.decode.max_extra_len}", f"--repeats={args.repeats}"]
    command += [f"--num_hypotheses={n}", f"--sampling_topk=0,{args.top_k}"]
    found = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    print(found, end="")
    rates = [float(x) for x in re.findall(r": ([\d.]+) candidates/s", found)]
    for (name, rate), theirs in zip(ours.items(), rates, strict=True):
        print(f"{name}: ours / CTranslate2 = {rate / theirs:.2f}")


if __name__ == "__main__":
    main()
