"""The whole command as a user waits for it: `translate-text` against a CTranslate2 process.

    python -m scripts.compare.command_speed --workdir=W --src=test2016.en [--export=DIR] \
        [--repeats=3] [--threads=2] [--json=speed.json]

The wall time of fresh processes translating (a) the first line of --src and (b) the whole
file, from the command line to the last line written:
  ours, cold   `translate-text --workdir=W` with a new, empty compilation cache;
  ours, warm   the same again with the cache the cold run left (a user's second command;
               translate/compilation.py, translate/decoding/saved_searches.py);
  ctranslate2  a Python process that loads the float32 export of the same checkpoint
               (`translate-export --format=ctranslate2`), tokenizes, translates with the
               workdir's beam, length penalty, length limit and batch size, and writes.
Each runs --repeats times: the medians and ours / ctranslate2 are printed (and --json written);
our cold and warm outputs must be identical. CTranslate2 runs --threads threads, ours the
machine's default.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The CTranslate2 process: everything a user's own script would do, in a fresh interpreter.
CTRANSLATE2 = """
import sys
import ctranslate2, sentencepiece
model, src, out, beam, alpha, extra, batch, threads = sys.argv[1:]
pieces = sentencepiece.SentencePieceProcessor(model_file=model + "/vocab.model")
lines = open(src, encoding="utf-8").read().split("\\n")[:-1]
tokens = [pieces.encode(line, out_type=str) for line in lines]  # the export adds EOS
translator = ctranslate2.Translator(model, intra_threads=int(threads), inter_threads=1)
results = translator.translate_batch(
    tokens, beam_size=int(beam), length_penalty=float(alpha), min_decoding_length=0,
    max_decoding_length=max(len(t) for t in tokens) + int(extra), max_batch_size=int(batch),
)
with open(out, "w", encoding="utf-8") as f:
    for line, result in zip(lines, results):
        f.write((pieces.decode(result.hypotheses[0]) if line.strip() else "") + "\\n")
"""


def wall(command: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--export", default="", help="A CTranslate2 export of --workdir.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit(f"--repeats={args.repeats}: must be >= 1")

    sys.path.insert(0, str(ROOT))
    from translate.workdir import Workdir, read_config

    decode = read_config(Workdir(args.workdir)).decode
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="command-speed-"))
    export = args.export or str(scratch / "ct2")
    if not args.export:
        print(f"exporting {args.workdir} to {export}", file=sys.stderr)
        wall([sys.executable, "-m", "translate.export", f"--workdir={args.workdir}",
              "--format=ctranslate2", f"--output={export}"])  # fmt: skip
    one = scratch / "one.txt"
    with open(args.src, encoding="utf-8") as f:
        one.write_text(f.readline(), encoding="utf-8")
    inputs = {"one sentence": str(one), "the whole file": args.src}
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.pop("TRANSLATE_COMPILATION_CACHE", None)

    def ours(src: str, out: str, cache: str) -> list[str]:
        return [sys.executable, "-m", "translate.translate_text", f"--workdir={args.workdir}",
                f"--input={src}", f"--output={out}", f"--compilation_cache={cache}"]  # fmt: skip

    results = {}
    for what, src in inputs.items():
        times: dict[str, list[float]] = {"ours, cold": [], "ours, warm": [], "ctranslate2": []}
        outputs = set()
        for repeat in range(args.repeats):
            cache = str(scratch / f"cache-{what[:3]}-{repeat}")
            out = scratch / f"out-{repeat}.txt"
            times["ours, cold"].append(wall(ours(src, str(out), cache), env))
            outputs.add(out.read_bytes())
            times["ours, warm"].append(wall(ours(src, str(out), cache), env))
            outputs.add(out.read_bytes())
            times["ctranslate2"].append(wall([sys.executable, "-c", CTRANSLATE2, export, src,
                str(scratch / "ct2.txt"), str(decode.beam_size), str(decode.length_penalty),
                str(decode.max_extra_len), str(decode.batch_size), str(args.threads)]))  # fmt: skip
        medians = {name: statistics.median(seconds) for name, seconds in times.items()}
        results[what] = {
            "seconds": times,
            "median_seconds": medians,
            "cold_over_ctranslate2": medians["ours, cold"] / medians["ctranslate2"],
            "warm_over_ctranslate2": medians["ours, warm"] / medians["ctranslate2"],
            "cold_and_warm_outputs_identical": len(outputs) == 1,
        }
        print(
            f"{what} ({src}): ours cold {medians['ours, cold']:.2f} s, warm "
            f"{medians['ours, warm']:.2f} s; ctranslate2 {medians['ctranslate2']:.2f} s; warm / "
            f"ctranslate2 {results[what]['warm_over_ctranslate2']:.2f}x; outputs identical: "
            f"{len(outputs) == 1} (medians of {args.repeats})"
        )
    report = {"workdir": args.workdir, "src": args.src, "beam_size": decode.beam_size}
    report.update(length_penalty=decode.length_penalty, ctranslate2_threads=args.threads)
    report.update(cpu_count=os.cpu_count(), results=results)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
