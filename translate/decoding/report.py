"""A test-set report: decode and score, record what produced it, write it for people to read.

`translate_and_score` decodes a set of sentences and scores them (translate/decoding/metrics.py)
into a report dict that also records the decoding settings and speed and its provenance: the git
commit, package versions, device, config and model size. `write_report` writes report.json,
report.txt (a person reads this one first) and hypotheses.txt. The trainer's final evaluation,
`translate-evaluate` and the scripts all report through this module.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from translate import atomic
from translate.config import Config
from translate.data.tokenizer import Tokenizer
from translate.decoding import metrics
from translate.decoding.sentences import DecodeTimes, translate_sentences
from translate.decoding.settings import DecodeSettings
from translate.provenance import git_commit, host, package_versions
from translate.workdir import Workdir


def sha256_of_lines(lines: Sequence[str]) -> str:
    """The sha256 of the text as a file of these lines, each ended by "\\n"."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def sha256_of_file(path: str | pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def provenance(config: Config, params: tuple) -> dict[str, Any]:
    """What produced a report: code, packages, devices, host, config and model size."""
    return {
        "git": git_commit(),
        "packages": package_versions(),
        "platform": jax.default_backend(),
        "num_devices": jax.device_count(),
        "host": host(),
        "config": config.to_dict(),
        # Per model of an ensemble.
        "num_parameters": [
            int(sum(np.size(x) for x in jax.tree.leaves(model))) for model in params
        ],
    }


def translate_and_score(
    graphdefs: tuple,
    params: tuple,
    tokenizer: Tokenizer,
    config: Config,
    settings: DecodeSettings,
    sources: Sequence[str],
    references: Sequence[str],
    step: int,
    averaged_steps: Sequence[int] = (),
    lowercase: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Decodes `sources` and scores against `references`; returns (report, hypotheses).

    `graphdefs` and `params` are an ensemble's tuples (trained.Ensemble), one model or more;
    `settings` how to decode (`decoding.settings.decode_settings` of `config.decode`, or a
    command's flags over it).
    `step` is the checkpoint's training step; `averaged_steps`, when the parameters are a
    checkpoint average, the steps averaged (recorded in the report). `lowercase` adds the
    case-insensitive BLEU beside the cased one.
    """
    times = DecodeTimes()
    translations = translate_sentences(
        graphdefs, params, tokenizer, sources, settings, config.data.max_len, times=times
    )
    hypotheses = [best[0][1] for best in translations]
    seconds = times.decode_seconds
    max_len = config.data.max_len
    report = metrics.score(hypotheses, references, config.data.tgt_lang, lowercase)
    report.update(
        {
            "num_sentences": len(sources),
            # Searching alone; the first call of each batch shape is `compile_seconds`.
            "decode_seconds": round(seconds, 3),
            "compile_seconds": round(times.compile_seconds, 3),
            "num_batch_shapes": len(times.shapes),
            # Programs read from JAX's persistent compilation cache rather than compiled.
            "num_programs_from_cache": times.from_cache,
            "sentences_per_second": round(len(sources) / max(seconds, 1e-9), 2),
            # Sources longer than the model was trained on are decoded from their first
            # max_len - 1 tokens (batching.source_batches): a score of other sentences.
            "num_sources_cut": num_sources_cut(tokenizer, sources, max_len),
            "max_len": max_len,
            **settings.described(),
            "step": int(step),
            "checkpoint_steps": [int(s) for s in averaged_steps] or [int(step)],
            "device": jax.local_devices()[0].device_kind,
            "test_set": {
                "source_sha256": sha256_of_lines(sources),
                "reference_sha256": sha256_of_lines(references),
            },
        }
    )
    report.update(provenance(config, params))
    return report, hypotheses


def num_sources_cut(tokenizer: Tokenizer, sources: Sequence[str], max_len: int) -> int:
    """How many of `sources` decoding cuts to their first `max_len` - 1 tokens (with EOS, a
    source holds at most `max_len`); blank ones are not decoded."""
    lengths = [len(ids) for ids in tokenizer.encode_source(list(sources))]
    return sum(1 for n, text in zip(lengths, sources) if n + 1 > max_len and text.strip())


def example_indices(num_sentences: int, num_examples: int) -> list[int]:
    """Evenly spaced line indices, so the examples are not all from the start of the test set."""
    if num_sentences <= num_examples:
        return list(range(num_sentences))
    return [i * num_sentences // num_examples for i in range(num_examples)]


def host_text(facts: dict[str, Any] | None) -> str:
    """`` (Intel(R) Xeon(R) Processor, 2 CPUs)`` for report.txt; nothing for an older report."""
    if not facts:
        return ""
    return f" ({facts['cpu']}, {facts['cpus']} CPU{'' if facts['cpus'] == 1 else 's'})"


def write_report(
    out_dir: str | pathlib.Path,
    report: dict[str, Any],
    sources: Sequence[str],
    references: Sequence[str],
    hypotheses: Sequence[str],
    num_examples: int = 5,
    plots_dir: str | pathlib.Path | None = None,
) -> None:
    """Writes report.json, report.txt (for a person to read first) and hypotheses.txt.

    report.txt (`report_lines`) gives the scores with their signatures, how the test set was
    decoded and how fast, the training-curve pictures found in `plots_dir` (default `out_dir`;
    drawn by scripts/plot_metrics.py), and a few translations beside their references.
    """
    out = Workdir(out_dir)
    plots_dir = out.path if plots_dir is None else pathlib.Path(plots_dir)
    out.path.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out.hypotheses, "".join(h + "\n" for h in hypotheses))
    atomic.write_text(out.report_json, json.dumps(report, indent=2) + "\n")
    lines = score_lines(report) + comparison_lines(report.get("comparison"))
    lines += ["", *run_lines(report, plots_dir)]
    lines += example_lines(sources, references, hypotheses, num_examples)
    atomic.write_text(out.report_txt, "\n".join(lines) + "\n")


def score_lines(report: dict[str, Any]) -> list[str]:
    """report.txt's scores, each with its signature or recipe."""
    lines = [
        f"sacreBLEU       {report['bleu']:.2f}   {report['signature']}",
        "                (detokenized, against the raw references; report.json key `bleu`)",
        f"                {report['bleu_detail']}",
        f"tokenized BLEU  {report['tokenized_bleu']:.2f}   (the paper's metric; key "
        "`tokenized_bleu`; not comparable with sacreBLEU)",
        f"                {report['tokenized_bleu_recipe']}",
        f"chrF            {report['chrf']:.2f}   {report['chrf_signature']}",
    ]
    if "literature_bleu" in report:  # reports written before it was recorded lack it
        lines[5:5] = [
            f"lc tok BLEU     {report['literature_bleu']:.2f}   (the Multi30k papers' metric; key "
            "`literature_bleu`; not comparable with sacreBLEU)",
            f"                {report['literature_bleu_recipe']}",
        ]
    if "bleu_lowercase" in report:
        lines.insert(
            3, f"lowercased      {report['bleu_lowercase']:.2f}   {report['signature_lowercase']}"
        )
    return lines


def run_lines(report: dict[str, Any], plots_dir: pathlib.Path) -> list[str]:
    """report.txt's lines on the run: the model, the decoding, its speed, the code, curves."""
    models = report.get("ensemble") or [f"checkpoint step {report['step']}"]
    steps = report["checkpoint_steps"]
    if len(steps) > 1:
        models = [f"mean parameters of the {len(steps)} checkpoints at steps {steps}"]
    lines = [
        f"model     {models[0]}",
        *(f"          {m}" for m in models[1:]),
        f"decoding  beam {report['beam_size']}, length penalty {report['length_penalty']}, "
        # A report written before beam_stop was recorded stopped the exact way.
        + (f"stop {report.get('beam_stop', 'exact')}, " if report["beam_size"] > 1 else "")
        + f"at most source length + {report['max_extra_len']} tokens"
        # The products' dtype, when a command chose it over the model's (--matmul_dtype).
        + (f"; --matmul_dtype={report['matmul_dtype']}" if report.get("matmul_dtype") else ""),
        f"speed     {report['sentences_per_second']:.1f} sentences/s: "
        f"{report['num_sentences']} sentences in {report['decode_seconds']:.1f} s on "
        f"{report['device']}{host_text(report.get('host'))}; compiling "
        f"{report['num_batch_shapes']} batch "
        f"shape{'' if report['num_batch_shapes'] == 1 else 's'} took "
        f"{report['compile_seconds']:.1f} s more"
        # Reports written before the count was kept say nothing of the cache.
        + (
            f" ({report['num_programs_from_cache']} program(s) read from the persistent "
            "compilation cache)"
            if report.get("num_programs_from_cache")
            else ""
        ),
    ]
    if report.get("num_sources_cut"):  # reports written before it was counted lack it
        cut, max_len = report["num_sources_cut"], report["max_len"]
        lines.append(
            f"cut       {cut} source{'' if cut == 1 else 's'} longer than data.max_len={max_len} "
            f"tokens: translated from {'its' if cut == 1 else 'their'} first {max_len - 1} "
            "tokens only"
        )
    git = report.get("git")
    if "packages" in report:
        versions = report["packages"]
        code = "not a git checkout"  # an installed package (`pip install .`), a copy
        if git:
            code = f"commit {git['commit'][:12]}" + (" (modified)" if git["modified"] else "")
        lines.append(
            f"code      {code}; "
            + ", ".join(f"{k} {versions[k]}" for k in ("jax", "flax", "sacrebleu") if k in versions)
            + f"; {report['num_parameters'][0]:,} parameters"
        )
    plots = [p.name for p in Workdir(plots_dir).metric_plots()]
    if plots:
        lines.append(f"curves    {plots_dir}: {', '.join(plots)}")
    return lines


def example_lines(
    sources: Sequence[str], references: Sequence[str], hypotheses: Sequence[str], num: int
) -> list[str]:
    """report.txt's examples: a few sources beside their references and hypotheses."""
    indices = example_indices(len(sources), num)
    lines = ["", "Examples (line: source, reference, hypothesis)"] if indices else []
    for i in indices:
        lines += ["", f"{i + 1:>6}  SRC {sources[i]}", f"        REF {references[i]}"]
        lines += [f"        HYP {hypotheses[i]}"]
    return lines


def comparison_lines(comparison: dict[str, Any] | None) -> list[str]:
    """report.txt's lines on the paired bootstrap test, if one was run."""
    if not comparison:
        return []
    c = comparison
    if c["identical"]:
        return ["", f"compared  with {c['other']}: identical hypotheses, BLEU {c['bleu']:.2f}"]
    verdict = "significant" if c["significant"] else "not significant"
    return [
        "",
        f"compared  with {c['other']}: BLEU {c['bleu']:.2f} (95% CI +-{c['bleu_ci95']:.2f}) vs "
        f"{c['other_bleu']:.2f} (+-{c['other_bleu_ci95']:.2f}), difference "
        f"{c['bleu'] - c['other_bleu']:+.2f}",
        f"          p = {c['p_value']:.4f}: {verdict} at p < 0.05 (paired bootstrap resampling, "
        f"{c['signature']})",
    ]
