r"""translate-score against the search's own scores and against CTranslate2's score_batch.

    python -m scripts.compare.score_agreement --workdir=DIR --src=test2016.en [--out=DIR/scoring] \
        [--batch_size=64] [--threads=2]

Three measurements on one test set:
  (a) each best output of the workdir's beam is scored by forced decoding
      (translate/decoding/forced.py), as the pieces the search wrote and as its text (which may
      encode to other pieces: counted); the total must equal the search's own score before the
      length penalty (score * ((5 + N) / 6) ** alpha, N pieces with EOS). With the model's
      products and with float32 products (`--matmul_dtype=compute`).
  (b) CTranslate2's `Translator.score_batch` on the float32 export scores the same pairs,
      against ours with float32 products: the per-pair totals compared relatively.
  (c) pairs/s of our scoring (compiled, second pass) and of score_batch, and the wall time of
      the whole `translate-score` command on the file.
Writes OUT/agreement.json and prints it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from translate import cli, compilation
from translate.data.batching import source_batches
from translate.data.text import read_lines
from translate.data.tokenizer import EOS_ID
from translate.decoding import forced
from translate.decoding.search import search
from translate.decoding.settings import decode_settings
from translate.engines.shared import source_pieces
from translate.engines.writer import export
from translate.flags import Flag, checkpoint_flags, compilation_cache_flag, parse_flags
from translate.trained import load_ensemble


def search_agreement(ensemble, sources, batch_size) -> tuple[dict, list[str]]:
    """(a): the beam's best outputs scored against its own scores; returns (figures, texts).

    Scored twice: as the pieces the search wrote, and as the text it gives (encoded again,
    which for some outputs gives other pieces: those are counted)."""
    settings = decode_settings(ensemble.config.decode, nbest=1)
    tokenizer, max_len = ensemble.tokenizer, ensemble.config.data.max_len
    pieces, normalised = [None] * len(sources), [0.0] * len(sources)
    for indices, src in source_batches(tokenizer, sources, settings.batch_size, max_len):
        tokens, scores = jax.device_get(search(ensemble.graphdefs, ensemble.params, src, settings))
        for row, i in enumerate(indices):
            if i >= 0:
                best = [int(t) for t in tokens[row, 0]]
                pieces[i] = best[: best.index(EOS_ID)] if EOS_ID in best else best
                normalised[i] = float(scores[row, 0])
    texts = [tokenizer.decode(ids) for ids in pieces]

    def differences(targets) -> dict:
        model = (ensemble.graphdefs, ensemble.params, tokenizer)
        scored = forced.score_pairs(*model, sources, targets, batch_size, max_len, cut_sources=True)
        alpha = settings.length_penalty
        lengths = np.array([len(pair.log_probs) for pair in scored])
        totals = np.array([pair.total for pair in scored])
        diffs = np.abs(totals - np.array(normalised) * ((5 + lengths) / 6) ** alpha)
        return {
            "max_abs_difference": float(diffs.max()),
            "median_abs_difference": float(np.median(diffs)),
            "within_1e-4": int((diffs <= 1e-4).sum()),
        }

    same = sum(tokenizer.encode([t])[0] == ids for t, ids in zip(texts, pieces))
    return {
        "pairs": len(sources),
        "beam_size": settings.beam_size,
        "length_penalty": settings.length_penalty,
        "matmul_dtype": ensemble.config.model.matmul_dtype,
        "the_searchs_pieces": differences(pieces),
        "the_output_text": {**differences(texts), "encodes_to_the_same_pieces": int(same)},
    }, texts


def ctranslate2_agreement(flags, ensemble32, sources, outputs, tmp: pathlib.Path) -> dict:
    """(b) and CTranslate2's speed: score_batch of the float32 export against ours."""
    import ctranslate2

    directory = tmp / "ct2"
    export(flags["workdir"], str(directory), "ctranslate2", params=flags["params"])
    threads = flags["threads"]
    translator = ctranslate2.Translator(str(directory), inter_threads=1, intra_threads=threads)
    tokenizer, max_len = ensemble32.tokenizer, ensemble32.config.data.max_len
    src_pieces = source_pieces(tokenizer, sources, max_len)
    tgt_pieces = [tokenizer.pieces(ids) for ids in tokenizer.encode(outputs)]
    start = time.perf_counter()
    results = translator.score_batch(src_pieces, tgt_pieces, max_batch_size=flags["batch_size"])
    ct2_seconds = time.perf_counter() - start
    theirs = np.array([sum(r.log_probs) for r in results])
    model = (ensemble32.graphdefs, ensemble32.params, tokenizer)
    batch = flags["batch_size"]  # cut_sources: as the export's source pieces are cut
    ours_scored = forced.score_pairs(*model, sources, outputs, batch, max_len, cut_sources=True)
    ours = np.array([pair.total for pair in ours_scored])
    lengths_agree = sum(len(r.log_probs) == len(p.log_probs) for r, p in zip(results, ours_scored))
    relative = np.abs(ours - theirs) / np.maximum(np.abs(theirs), 1e-9)
    return {
        "pairs": len(sources),
        "pieces_counted_alike": int(lengths_agree),
        "max_relative_difference": float(relative.max()),
        "median_relative_difference": float(np.median(relative)),
        "within_1e-3_relative": int((relative <= 1e-3).sum()),
        "ctranslate2_score_batch_pairs_per_second": round(len(sources) / ct2_seconds, 1),
        "ctranslate2_threads": flags["threads"],
    }


def our_speed(ensemble, sources, outputs, batch_size) -> dict:
    """Pairs/s of forced scoring: the first pass compiles, the second is the steady state."""
    times = []
    for _ in range(2):
        start = time.perf_counter()
        model = (ensemble.graphdefs, ensemble.params, ensemble.tokenizer)
        forced.score_pairs(*model, sources, outputs, batch_size, ensemble.config.data.max_len)
        times.append(time.perf_counter() - start)
    rate = round(len(sources) / times[1], 1)
    return {"first_pass_seconds": round(times[0], 2), "pairs_per_second": rate}


def command_wall_time(flags, src: str, tgt: pathlib.Path, out: pathlib.Path) -> float:
    """Seconds of the whole `translate-score` command on the file, as a user runs it."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "translate.score", f"--workdir={flags['workdir']}"]
    command += [f"--src={src}", f"--tgt={tgt}", f"--output={out}"]
    command.append(f"--batch_size={flags['batch_size']}")
    subprocess.run(command, check=True, capture_output=True)
    return round(time.perf_counter() - start, 2)


FLAGS = {
    "workdir": Flag("", "Required. A trained encoder-decoder workdir."),
    "src": Flag("", "Required. The test set's sources."),
    "out": Flag("", "Where agreement.json goes; default WORKDIR/scoring."),
    "batch_size": Flag(64, "Pairs scored together (ours and CTranslate2's)."),
    "threads": Flag(2, "CTranslate2's intra_threads."),
    "params": checkpoint_flags("score with")["params"],
    **compilation_cache_flag(),
}


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    if not flags["workdir"] or not flags["src"]:
        raise SystemExit(__doc__)
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # CTranslate2's threads on shared cores
    out = pathlib.Path(flags["out"] or pathlib.Path(flags["workdir"]) / "scoring")
    out.mkdir(parents=True, exist_ok=True)
    compilation.use_persistent_cache(flags["compilation_cache"])
    sources = read_lines(flags["src"])
    ensemble = load_ensemble([flags["workdir"]], params=flags["params"])
    report = {"workdir": str(flags["workdir"]), "src": flags["src"]}
    report["search"], outputs = search_agreement(ensemble, sources, flags["batch_size"])
    report["speed"] = our_speed(ensemble, sources, outputs, flags["batch_size"])
    float32 = load_ensemble([flags["workdir"]], params=flags["params"], matmul_dtype="compute")
    report["search_float32_products"], _ = search_agreement(float32, sources, flags["batch_size"])
    with tempfile.TemporaryDirectory() as tmp:
        report["ctranslate2"] = ctranslate2_agreement(
            flags, float32, sources, outputs, pathlib.Path(tmp)
        )
        hypotheses = pathlib.Path(tmp) / "hypotheses.txt"
        hypotheses.write_text("".join(line + "\n" for line in outputs), encoding="utf-8")
        report["speed"]["command_wall_seconds"] = command_wall_time(
            flags, flags["src"], hypotheses, pathlib.Path(tmp) / "scores.tsv"
        )
    (out / "agreement.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    cli.run(main)
