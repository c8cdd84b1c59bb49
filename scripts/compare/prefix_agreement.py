r"""Forced target prefixes: translate-text's outputs against CTranslate2's `target_prefix`.

    python -m scripts.compare.prefix_agreement --workdir=DIR --export=CT2DIR --src=test2016.en \
        --ref=test2016.de [--words=2] [--beam_size=1]

Each line's prefix is the first `--words` words of its reference. Ours: `translate-text
--prefix` with float32 products (`--matmul_dtype=compute`, as the float32 export computes);
CTranslate2: `translate_batch(target_prefix=...)` on the export with the prefix tokenized alone
by the export's vocab.model, the same beam, length penalty and length limit. Prints how many
outputs are identical and how many start with their prefix.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--export", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--words", type=int, default=2)
    parser.add_argument("--beam_size", type=int, default=1)
    parser.add_argument("--length_penalty", type=float, default=1.2)
    parser.add_argument("--max_extra_len", type=int, default=50)
    args = parser.parse_args()

    import ctranslate2
    import sentencepiece

    sources = pathlib.Path(args.src).read_text(encoding="utf-8").splitlines()
    references = pathlib.Path(args.ref).read_text(encoding="utf-8").splitlines()
    prefixes = [" ".join(r.split()[: args.words]) for r in references]
    with tempfile.TemporaryDirectory() as scratch:
        prefix_file, output = pathlib.Path(scratch, "prefix.txt"), pathlib.Path(scratch, "out.txt")
        prefix_file.write_text("".join(p + "\n" for p in prefixes), encoding="utf-8")
        command = [sys.executable, "-m", "translate.translate_text", f"--workdir={args.workdir}"]
        command += [f"--input={args.src}", f"--output={output}", f"--prefix={prefix_file}"]
        command += [f"--beam_size={args.beam_size}", f"--length_penalty={args.length_penalty}"]
        command += [f"--max_extra_len={args.max_extra_len}", "--matmul_dtype=compute"]
        env = {**os.environ, "TRANSLATE_COMPILATION_CACHE": "off"}
        subprocess.run(command, check=True, stderr=subprocess.DEVNULL, env=env)
        ours = output.read_text(encoding="utf-8").splitlines()
    pieces = sentencepiece.SentencePieceProcessor(model_file=f"{args.export}/vocab.model")
    translator = ctranslate2.Translator(args.export, intra_threads=2)
    theirs = []
    for start in range(0, len(sources), 32):
        batch = [pieces.encode(s, out_type=str) for s in sources[start : start + 32]]
        found = translator.translate_batch(
            batch,
            target_prefix=[pieces.encode(p, out_type=str) for p in prefixes[start : start + 32]],
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            min_decoding_length=0,
            max_decoding_length=max(len(b) for b in batch) + args.max_extra_len,
        )
        theirs += [pieces.decode(r.hypotheses[0]) for r in found]
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    kept = sum(o.startswith(p) for o, p in zip(ours, prefixes, strict=True))
    print(f"{len(ours)} lines, prefixes of {args.words} reference words, beam {args.beam_size}:")
    print(f"  identical to CTranslate2's target_prefix outputs: {same}")
    print(f"  ours starting with their prefix: {kept}")
    print(
        f"  CTranslate2's starting with their prefix: "
        f"{sum(t.startswith(p) for t, p in zip(theirs, prefixes, strict=True))}"
    )


if __name__ == "__main__":
    main()
