r"""How well the model's attention alignments agree with eflomal's, per decoder layer.

    python -m scripts.compare.alignment_agreement --workdir=DIR --train_src=train.en \
        --train_tgt=train.de --src=val.en --tgt=val.de [--out=DIR/alignment] \
        [--matmul_dtype=compute]

eflomal (Östling and Tiedemann 2016, `pip install eflomal`, a Bayesian IBM-model aligner) aligns
the training pairs and the scored set together, lowercased, on whitespace words as ours; its two
directions joined by grow-diag-final-and (Koehn et al. 2005), and its target-to-source one alone
(each target word linked to one source word, as ours). Each decoder layer's forced alignment of
--src/--tgt (translate/decoding/forced.py, heads averaged) gets its precision, recall and F1
against both, into OUT/agreement.json and a table; choose the layer of the best F1 against
grow-diag-final-and. eflomal's links are no gold standard: this is agreement, not accuracy.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

from translate import cli, compilation
from translate.data.text import read_lines
from translate.decoding import forced
from translate.flags import Flag, compilation_cache_flag, matmul_dtype_flag, parse_flags
from translate.trained import load_ensemble

Links = set[tuple[int, int]]


def read_links(path: pathlib.Path) -> list[Links]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        out.append({tuple(map(int, link.split("-"))) for link in line.split()})
    return out


def grow_diag_final_and(forward: Links, reverse: Links) -> Links:
    """Koehn et al.'s symmetrization of two directions' links (i, j): their intersection,
    grown through neighbours (diagonals included) that either direction has, then each word
    still unaligned on both sides linked where either direction links it."""
    union, links = forward | reverse, set(forward & reverse)
    neighbours = [(-1, 0), (0, -1), (1, 0), (0, 1), (-1, -1), (-1, 1), (1, -1), (1, 1)]
    grown = True
    while grown:
        grown = False
        for i, j in sorted(links):
            for di, dj in neighbours:
                new = (i + di, j + dj)
                src_free = all(link[0] != new[0] for link in links)
                tgt_free = all(link[1] != new[1] for link in links)
                if new in union and new not in links and (src_free or tgt_free):
                    links.add(new)
                    grown = True
    for direction in (forward, reverse):
        for i, j in sorted(direction):
            src_free = all(link[0] != i for link in links)
            tgt_free = all(link[1] != j for link in links)
            if src_free and tgt_free:
                links.add((i, j))
    return links


def run_eflomal(sources: list[str], targets: list[str], directory: pathlib.Path):
    """eflomal's (target-to-source, source-to-target) links of every pair."""
    import eflomal

    fwd, rev = directory / "fwd.links", directory / "rev.links"
    aligner = eflomal.Aligner()
    aligner.align(
        [s.lower() + "\n" for s in sources],
        [t.lower() + "\n" for t in targets],
        links_filename_fwd=str(fwd),
        links_filename_rev=str(rev),
    )
    return read_links(fwd), read_links(rev)


def agreement(ours: list[Links], reference: list[Links]) -> dict[str, float]:
    hits = sum(len(a & b) for a, b in zip(ours, reference))
    found, wanted = sum(map(len, ours)), sum(map(len, reference))
    precision, recall = hits / max(found, 1), hits / max(wanted, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    scores = (round(100 * x, 2) for x in (precision, recall, f1))
    return dict(zip(("precision", "recall", "f1"), scores))


FLAGS = {
    "workdir": Flag("", "Required. A trained encoder-decoder workdir."),
    "train_src": Flag("", "Required. Training sources, for eflomal's statistics."),
    "train_tgt": Flag("", "Required. Training targets."),
    "src": Flag("", "Required. The sources of the set to align (val)."),
    "tgt": Flag("", "Required. Its targets (references)."),
    "out": Flag("", "Where agreement.json goes; default WORKDIR/alignment."),
    "batch_size": Flag(64, "Pairs scored together."),
    **matmul_dtype_flag(),
    **compilation_cache_flag(),
}


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    for name in ("workdir", "train_src", "train_tgt", "src", "tgt"):
        if not flags[name]:
            raise SystemExit(f"--{name} is required\n\n{__doc__}")
    out = pathlib.Path(flags["out"] or pathlib.Path(flags["workdir"]) / "alignment")
    out.mkdir(parents=True, exist_ok=True)
    sources, targets = read_lines(flags["src"]), read_lines(flags["tgt"])
    train_src, train_tgt = read_lines(flags["train_src"]), read_lines(flags["train_tgt"])
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        fwd, rev = run_eflomal(train_src + sources, train_tgt + targets, pathlib.Path(tmp))
    eflomal_seconds = time.perf_counter() - start
    fwd, rev = fwd[len(train_src) :], rev[len(train_src) :]
    symmetric = [grow_diag_final_and(a, b) for a, b in zip(fwd, rev)]
    # The direction that links each target word to at most one source word, as ours do.
    one_each = next(d for d in (fwd, rev) if all(len({j for _, j in s}) == len(s) for s in d))
    compilation.use_persistent_cache(flags["compilation_cache"])
    ensemble = load_ensemble([flags["workdir"]], matmul_dtype=flags["matmul_dtype"])
    report = {"workdir": str(flags["workdir"]), "pairs": len(sources), "layers": {}}
    report["eflomal_seconds"] = round(eflomal_seconds, 1)
    for layer in range(ensemble.config.model.num_layers):
        start = time.perf_counter()
        model = (ensemble.graphdefs, ensemble.params, ensemble.tokenizer)
        sizes = (flags["batch_size"], ensemble.config.data.max_len)
        scored = forced.score_pairs(*model, sources, targets, *sizes, alignment_layer=layer)
        seconds = time.perf_counter() - start
        ours = [set(pair.links) for pair in scored]
        report["layers"][layer] = {
            "against_grow_diag_final_and": agreement(ours, symmetric),
            "against_target_to_source": agreement(ours, one_each),
            "seconds": round(seconds, 2),
        }
    f1 = {n: row["against_grow_diag_final_and"]["f1"] for n, row in report["layers"].items()}
    report["best_layer"] = best = max(f1, key=f1.get)
    (out / "agreement.json").write_text(json.dumps(report, indent=2) + "\n")
    pairs = f"{len(train_src)} + {len(sources)}"
    print(f"{len(sources)} pairs; eflomal {eflomal_seconds:.0f} s on {pairs} pairs")
    print("layer  P/R/F1 against eflomal grow-diag-final-and  |  against its target-to-source")
    for layer, row in report["layers"].items():
        g, t = row["against_grow_diag_final_and"], row["against_target_to_source"]
        g, t = (" ".join(f"{x[k]:6.2f}" for k in ("precision", "recall", "f1")) for x in (g, t))
        print(f"{layer:5}  {g}            |  {t}")
    print(f"best F1 against grow-diag-final-and: layer {best}; written to {out / 'agreement.json'}")


if __name__ == "__main__":
    cli.run(main)
