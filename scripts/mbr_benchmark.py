r"""Beam search against MBR over sampled candidates and over the beam's n-best: BLEU, chrF, time.

    python -m scripts.mbr_benchmark --workdir=DIR --src=val.en --ref=val.de \
        [--sizes=8,16,32] [--epsilon=0.02] [--beams=8] [--seed=0] [--out=DIR]

Each setting is one whole `translate-text` command, timed as a user feels it (start-up, loading,
compiling with the compilation cache off, decoding, the MBR choice); its output is scored with
sacreBLEU (BLEU and chrF, their signatures printed) against the raw references. The settings:
the workdir's own beam search; MBR by sentence chrF over N epsilon samples (Freitag et al. 2023:
epsilon 0.02) for each N of --sizes; MBR by chrF over the n-best of a beam of each width in
--beams. Prints a table and writes `mbr_benchmark.json` (and each output) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time


def settings(args) -> dict[str, list[str]]:
    runs = {"beam (workdir's)": []}
    for n in (int(x) for x in args.sizes.split(",") if x):
        flags = ["--sampling=epsilon", f"--epsilon={args.epsilon}", f"--num_candidates={n}"]
        runs[f"MBR-chrF, {n} epsilon samples"] = [*flags, f"--seed={args.seed}", "--mbr=chrf"]
    for n in (int(x) for x in args.beams.split(",") if x):
        runs[f"MBR-chrF, beam {n} n-best"] = [
            f"--beam_size={n}",
            f"--num_candidates={n}",
            "--mbr=chrf",
        ]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--sizes", default="8,16,32")
    parser.add_argument("--epsilon", type=float, default=0.02)
    parser.add_argument("--beams", default="8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="/tmp/mbr_benchmark")
    args = parser.parse_args()

    import sacrebleu

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    references = pathlib.Path(args.ref).read_text(encoding="utf-8").splitlines()
    environment = {**os.environ, "TRANSLATE_COMPILATION_CACHE": "off"}
    rows = []
    for name, flags in settings(args).items():
        target = out / ("".join(c if c.isalnum() else "_" for c in name) + ".txt")
        command = [sys.executable, "-m", "translate.translate_text", f"--workdir={args.workdir}"]
        command += [f"--input={args.src}", f"--output={target}", *flags]
        start = time.perf_counter()
        subprocess.run(command, check=True, env=environment, stderr=subprocess.DEVNULL)
        seconds = time.perf_counter() - start
        hypotheses = target.read_text(encoding="utf-8").splitlines()
        bleu_metric, chrf_metric = sacrebleu.BLEU(), sacrebleu.CHRF()
        bleu = bleu_metric.corpus_score(hypotheses, [references])
        chrf = chrf_metric.corpus_score(hypotheses, [references])
        row = {"setting": name, "flags": flags, "bleu": round(bleu.score, 2)}
        row.update(chrf=round(chrf.score, 2), seconds=round(seconds, 1))
        row.update(bleu_signature=str(bleu_metric.get_signature()))
        rows.append({**row, "chrf_signature": str(chrf_metric.get_signature())})
        print(f"{name:34s} BLEU {bleu.score:6.2f}  chrF {chrf.score:6.2f}  {seconds:7.1f} s")
    report = {"src": args.src, "ref": args.ref, "runs": rows}
    (out / "mbr_benchmark.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
