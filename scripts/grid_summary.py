"""Summarises what scripts/gpu_multi30k_grid.sh left in its directory: one JSON and a table.

    python -m scripts.grid_summary GRID_DIR OUT_DIR

For each training: its exit status and wall time, the last step it reached and its training
speed (the median of the logged steps/s), all of val (translate.evaluate) and test2016 (the
training's own report): sacreBLEU, the literature's lowercased tokenized BLEU, chrF. Then the
ensemble's val and test2016, the cold and warm decodings against one compilation cache (their
wall times and compile seconds), and the resumed training's compile times. Val chooses; the
recipe with the best mean val BLEU is marked. Writes OUT_DIR/summary.json and summary.txt and
prints the table. Reads only files; missing ones are reported as missing, never guessed.
"""

from __future__ import annotations

import json
import pathlib
import re
import statistics
import sys

RUNS = ("a_s0", "a_s1", "b_s0", "b_s1")
SCORES = ("bleu", "literature_bleu", "chrf")


def read_json(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def scores(report: dict | None) -> dict | None:
    if report is None:
        return None
    keys = (*SCORES, "step", "compile_seconds", "decode_seconds", "num_sentences")
    return {k: report.get(k) for k in keys}


def train_log(path: pathlib.Path) -> dict:
    """The last step, the median logged steps/s, and the train step's compile seconds."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {"missing": str(path)}
    steps = [int(m) for m in re.findall(r"step (\d+)/\d+", text)]
    rates = [float(m) for m in re.findall(r"([\d.]+) steps/s", text)]
    compiled = re.findall(r"compiled the train step in ([\d.]+) s(?: \((\d+) program)?", text)
    errors = [line for line in text.splitlines() if "Error" in line or "WARNING" in line]
    return {
        "last_step": max(steps) if steps else None,
        "steps_per_s_median": statistics.median(rates) if rates else None,
        "compile_train_step_s": float(compiled[0][0]) if compiled else None,
        "programs_from_cache": int(compiled[0][1] or 0) if compiled else None,
        "warnings": errors[-3:],
    }


def summarise(grid: pathlib.Path) -> dict:
    runs = {}
    for name in RUNS:
        runs[name] = {
            "train": read_json(grid / f"{name}.train.json"),
            "log": train_log(grid / f"{name}.log"),
            "test2016": scores(read_json(grid / name / "report.json")),
            "val": scores(read_json(grid / f"{name}_val" / "report.json")),
            "val_wall": read_json(grid / f"{name}_val.json"),
        }
    recipes = {}
    for recipe in sorted({name[0] for name in RUNS}):
        members = [runs[n] for n in RUNS if n[0] == recipe]
        vals = [m["val"]["bleu"] for m in members if m["val"] and m["val"]["bleu"] is not None]
        tests = [m["test2016"] for m in members if m["test2016"]]
        recipes[recipe] = {
            "val_bleu_mean": round(statistics.mean(vals), 2) if vals else None,
            "val_bleu": vals,
            "test2016_bleu": [t["bleu"] for t in tests],
            "test2016_literature_bleu": [t["literature_bleu"] for t in tests],
        }
    scored = [r for r in recipes if recipes[r]["val_bleu_mean"] is not None]
    chosen = max(scored, key=lambda r: recipes[r]["val_bleu_mean"]) if scored else None
    cache = {
        "val_cold": scores(read_json(grid / "a_s0_val" / "report.json")),
        "val_cold_wall": read_json(grid / "a_s0_val.json"),
        "val_warm": scores(read_json(grid / "a_s0_val_warm" / "report.json")),
        "val_warm_wall": read_json(grid / "a_s0_val_warm.json"),
        "text_cold_wall": read_json(grid / "text_cold.json"),
        "text_warm_wall": read_json(grid / "text_warm.json"),
    }
    for path in sorted(grid.glob("resume_*.log"), key=lambda p: int(p.stem.split("_")[1])):
        cache[path.stem] = train_log(path)
    try:
        cold = (grid / "text_cold.de").read_bytes()
        warm = (grid / "text_warm.de").read_bytes()
        cache["text_outputs_identical"] = cold == warm
    except OSError:
        cache["text_outputs_identical"] = None
    ensembles = {
        pair: {
            split: scores(read_json(grid / f"ensemble_{pair}_{split}" / "report.json"))
            for split in ("val", "test2016")
        }
        for pair in ("a", "b")
    }
    return {
        "runs": runs,
        "recipes": recipes,
        "chosen_on_val": chosen,
        "ensembles": ensembles,
        "cache": cache,
    }


def table(summary: dict) -> str:
    def fmt(x, spec=".2f"):
        return "-" if x is None else format(x, spec)

    lines = ["run   rc  wall_s  step   steps/s  val  val_lit  test  test_lit  test_chrF"]
    for name, run in summary["runs"].items():
        train, log = run["train"] or {}, run["log"]
        val, test = run["val"] or {}, run["test2016"] or {}
        lines.append(
            f"{name:5} {fmt(train.get('rc'), 'd'):>3} {fmt(train.get('wall_s'), '.0f'):>6} "
            f"{fmt(log.get('last_step'), 'd'):>5} {fmt(log.get('steps_per_s_median')):>8} "
            f"{fmt(val.get('bleu')):>5} {fmt(val.get('literature_bleu')):>7} "
            f"{fmt(test.get('bleu')):>5} {fmt(test.get('literature_bleu')):>8} "
            f"{fmt(test.get('chrf')):>8}"
        )
    for recipe, r in summary["recipes"].items():
        lines.append(
            f"recipe {recipe}: val mean {r['val_bleu_mean']}, test {r['test2016_bleu']}, "
            f"literature {r['test2016_literature_bleu']}"
        )
    lines.append(f"chosen on val: {summary['chosen_on_val']}")
    for pair, splits in summary["ensembles"].items():
        for split, s in splits.items():
            lines.append(f"ensemble {pair}_s0+{pair}_s1 {split}: {s}")
    for key, value in summary["cache"].items():
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    grid, out = pathlib.Path(argv[1]), pathlib.Path(argv[2])
    summary = summarise(grid)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    text = table(summary)
    (out / "summary.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main(sys.argv)
