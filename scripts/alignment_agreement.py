r"""How well the model's attention alignments agree with eflomal's, per decoder layer.

    python -m scripts.alignment_agreement --workdir=DIR --train_src=train.en --train_tgt=train.de \
        --src=val.en --tgt=val.de [--out=DIR/alignment] [--matmul_dtype=compute]

eflomal (Östling and Tiedemann 2016, `pip install eflomal`: a Bayesian IBM-model aligner) aligns
the training pairs and the scored set together, lowercased (its words are the whitespace tokens,
so the indices are ours); its two directions are joined by grow-diag-final-and (Koehn et al.
2005), and its target-to-source direction is kept too, which, like ours, links each target word
to one source word. Then every decoder layer's forced alignment of --src/--tgt
(translate/decoding/forced.py, heads averaged) is compared with both: precision, recall and F1
of our links against eflomal's. Writes OUT/agreement.json and prints a table; the layer with the
best F1 against grow-diag-final-and is the one to choose. eflomal's own links are not a gold
standard: the figures say how far the two agree, not which is right.
"""

from __future__ import annotations

import json
import pathlib
import tempfile
import time

from translate import cli, compilation
from translate.cli import Flag, parse_flags
from translate.data.text import read_lines
from translate.decoding import forced
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
    return {
        "precision": round(100 * precision, 2),
        "recall": round(100 * recall, 2),
        "f1": round(100 * f1, 2),
    }


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(
        argv,
        {
            "workdir": Flag("", "Required. A trained encoder-decoder workdir."),
            "train_src": Flag("", "Required. Training sources, for eflomal's statistics."),
            "train_tgt": Flag("", "Required. Training targets."),
            "src": Flag("", "Required. The sources of the set to align (val)."),
            "tgt": Flag("", "Required. Its targets (references)."),
            "out": Flag("", "Where agreement.json goes; default WORKDIR/alignment."),
            "batch_size": Flag(64, "Pairs scored together."),
            **cli.matmul_dtype_flag(),
            **cli.compilation_cache_flag(),
        },
        doc=__doc__,
        sections=(),
    )
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
    report = {
        "workdir": str(flags["workdir"]),
        "pairs": len(sources),
        "eflomal_seconds": round(eflomal_seconds, 1),
        "layers": {},
    }
    for layer in range(ensemble.config.model.num_layers):
        start = time.perf_counter()
        scored = forced.score_pairs(
            ensemble.graphdefs,
            ensemble.params,
            ensemble.tokenizer,
            sources,
            targets,
            flags["batch_size"],
            ensemble.config.data.max_len,
            alignment_layer=layer,
        )
        seconds = time.perf_counter() - start
        ours = [set(pair.links) for pair in scored]
        report["layers"][layer] = {
            "against_grow_diag_final_and": agreement(ours, symmetric),
            "against_target_to_source": agreement(ours, one_each),
            "seconds": round(seconds, 2),
        }
    best = max(
        report["layers"], key=lambda n: report["layers"][n]["against_grow_diag_final_and"]["f1"]
    )
    report["best_layer"] = best
    (out / "agreement.json").write_text(json.dumps(report, indent=2) + "\n")
    pairs = f"{len(train_src)} + {len(sources)}"
    print(f"{len(sources)} pairs; eflomal {eflomal_seconds:.0f} s on {pairs} pairs")
    print("layer  P/R/F1 against eflomal grow-diag-final-and  |  against its target-to-source")
    for layer, row in report["layers"].items():
        g, t = row["against_grow_diag_final_and"], row["against_target_to_source"]
        print(
            f"{layer:5}  {g['precision']:6.2f} {g['recall']:6.2f} {g['f1']:6.2f}"
            f"            |  {t['precision']:6.2f} {t['recall']:6.2f} {t['f1']:6.2f}"
        )
    print(f"best F1 against grow-diag-final-and: layer {best}; written to {out / 'agreement.json'}")


if __name__ == "__main__":
    cli.run(main)
