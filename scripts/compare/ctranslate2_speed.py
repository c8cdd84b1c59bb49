"""CTranslate2's decoding speed on an export, alone in its process (no JAX beside it).

    python -m scripts.compare.ctranslate2_speed --model=DIR --src=test2016.en [--threads=2] \
        [--batch_size=64] [--length_penalty=1.2] [--max_extra_len=50] [--repeats=3] \
        [--num_hypotheses=N --sampling_topk=0,10]

DIR is a `translate-export --format=ctranslate2` directory. The sentences, tokenized with its
`vocab.model` (the export adds `</s>`, as ours end in EOS), sorted by length, are decoded in
batches of `batch_size`, at most (the batch's longest source) + `max_extra_len` tokens, an empty
output allowed; after an untimed pass, beam 4 and greedy are timed `repeats` times (medians).
`--num_hypotheses=N` times sampling of N candidates instead, once per `--sampling_topk` (0: the
whole vocabulary; scripts/compare/sampling_speed.py). scripts/benchmark.py, which times the
engines in its own process after JAX and in groups of equal source length, gave CTranslate2
well under half this speed on 2 cores (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--length_penalty", type=float, default=1.2)
    parser.add_argument("--max_extra_len", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num_hypotheses", type=int, default=0)
    parser.add_argument("--sampling_topk", default="0")
    args = parser.parse_args()

    import ctranslate2
    import sentencepiece

    pieces = sentencepiece.SentencePieceProcessor(model_file=f"{args.model}/vocab.model")
    with open(args.src, encoding="utf-8") as f:
        sources = [pieces.encode(line.rstrip("\n"), out_type=str) for line in f]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    batches = [order[b : b + args.batch_size] for b in range(0, len(order), args.batch_size)]
    translator = ctranslate2.Translator(args.model, intra_threads=args.threads, inter_threads=1)

    def one_pass(beam: int, **sampling) -> float:
        start = time.perf_counter()
        options = dict(beam_size=beam, length_penalty=args.length_penalty, min_decoding_length=0)
        for batch in batches:
            longest = max(len(sources[i]) for i in batch) + args.max_extra_len
            tokens = [sources[i] for i in batch]
            translator.translate_batch(tokens, max_decoding_length=longest, **options, **sampling)
        return time.perf_counter() - start

    n, topks = args.num_hypotheses, args.sampling_topk.split(",")
    runs = [(f"sampling topk={k} x{n}", 1, int(k), n) for k in topks] if n else []
    runs = runs or [("beam4", 4, None, 1), ("greedy", 1, None, 1)]
    for name, beam, topk, n in runs:
        sampling = {} if topk is None else {"sampling_topk": topk, "num_hypotheses": n}
        one_pass(beam, **sampling)
        seconds = [one_pass(beam, **sampling) for _ in range(args.repeats)]
        median = statistics.median(seconds)
        unit = "sentences/s" if topk is None else "candidates/s"
        print(
            f"ctranslate2 {name}: {len(sources) * n / median:.1f} {unit} "
            f"(median of {', '.join(f'{s:.2f}' for s in seconds)} s; {args.threads} threads)"
        )


if __name__ == "__main__":
    main()
