"""A pipeline's report: every input, each stage's time, the ensemble's and students' scores."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

from translate.pipeline.directory import PipelineDir, StageRecords, duration, sha256_of
from translate.pipeline.plan import ORIGINAL, Plan
from translate.workdir import Workdir


def teacher_record(path: str) -> dict[str, Any]:
    """A teacher as the report names it: its workdir, the step it decoded and its code's commit
    (from its own report, when it wrote one)."""
    workdir = Workdir(path)
    record: dict[str, Any] = {"workdir": str(pathlib.Path(path).resolve())}
    if workdir.report_json.is_file():
        report = json.loads(workdir.report_json.read_text())
        record["commit"] = (report.get("git") or {}).get("commit")
        record["step"] = report.get("step")
        record["test_bleu"] = report.get("bleu")
    record["config_sha256"] = sha256_of(workdir.config)
    return record


def pipeline_report(
    pipe: PipelineDir, plan: Plan, teachers: Sequence[str], names: Sequence[str]
) -> dict[str, Any]:
    """The report of a finished pipeline.

    Args:
      pipe: the pipeline's directory, every stage in it done.
      plan: the pipeline's plan.
      teachers: the teachers' workdirs.
      names: the stages that ran, in order: the names of the list that ran them
        (stages.plan_stages), so that the report times every stage the run recorded.
    """
    finished = StageRecords(pipe)
    records = {name: finished.done(name) for name in names}
    students = plan.students[0].data.train_corpora
    corpora = []
    for corpus in students:
        made = (
            records["corpus"]["outputs"]
            if corpus.prefix == ORIGINAL
            else (records[corpus.prefix]["outputs"])
        )
        src, tgt = pipe.corpus_files(corpus.prefix, plan.teacher_config)
        corpora.append(
            {
                "corpus": corpus.prefix,
                "weight": corpus.weight,
                "tag": corpus.tag,
                "pairs": made[src.name]["lines"],
                "sha256": {src.name: made[src.name]["sha256"], tgt.name: made[tgt.name]["sha256"]},
            }
        )
    scores = records["evaluations"]["outputs"]
    student_scores = [scores[f"student-{i}"] for i in range(len(plan.students))]
    mean = {}
    for split in ("dev", "test"):
        values = [s[split] for s in student_scores if split in s]
        if values:
            mean[split] = {
                key: round(sum(v[key] for v in values) / len(values), 2)
                for key in values[0]
                if values[0][key] is not None
            }
    return {
        "teachers": [teacher_record(p) for p in teachers],
        "reverse": teacher_record(str(pipe.reverse)) if plan.reverse is not None else None,
        "data": records["corpus"]["outputs"],
        "corpora": corpora,
        "decode": plan.decode.described() | {"nbest": plan.decode.nbest},
        "stages": {name: records[name]["seconds"] for name in names},
        "scores": scores,
        "student_mean": mean,
        "seconds": round(sum(r["seconds"] for r in records.values()), 1),
    }


def report_text(report: dict[str, Any]) -> str:
    lines = ["stage times:"]
    lines += [f"  {name:<16} {duration(s)}" for name, s in report["stages"].items()]
    lines += [f"  {'all':<16} {duration(report['seconds'])}", "", "corpora of the student:"]
    for c in report["corpora"]:
        tag = f", tag {c['tag']}" if c["tag"] else ""
        lines.append(f"  {c['corpus']:<16} {c['pairs']} pairs, weight {c['weight']:g}{tag}")
    lines += ["", "sacreBLEU (lowercased tokenized BLEU, the Multi30k papers' metric):"]
    for system, splits in report["scores"].items():
        row = "  ".join(
            f"{split} {s['bleu']:.2f} ({s['literature_bleu']:.2f})" for split, s in splits.items()
        )
        lines.append(f"  {system:<16} {row}")
    for split, s in report["student_mean"].items():
        lines.append(f"  students' mean {split}: {s['bleu']:.2f} ({s['literature_bleu']:.2f})")
    return "\n".join(lines) + "\n"
