"""Decode a test set with a trained workdir (or an ensemble) and write the BLEU report.

    python -m translate.evaluate --workdir=DIR --src=test.en --ref=test.de [--output=OUT] \
        [--step=N | --average=5]

writes OUT/report.json, OUT/report.txt and OUT/hypotheses.txt (OUT defaults to DIR).
Repeating --workdir decodes with the ensemble of those models (they must share a vocabulary).
`--average=N` decodes with the mean parameters of the newest N checkpoints (Sec. 6.1: 5 for
base, 20 for big). The report holds two BLEU scores that must not be confused:
- `bleu`: sacreBLEU's default, cased, 13a tokenization, on detokenized output against the raw
  reference; comparable across papers that report sacreBLEU with the same signature.
- `tokenized_bleu`: the recipe behind the paper's numbers (tensor2tensor's get_ende_bleu.sh):
  Moses tokenization of hypotheses and references, hyphenated compounds split, BLEU on the
  tokens. Compare it with the paper's Table 2 only.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import pathlib
import re
import sys
from collections.abc import Sequence
from typing import Any

import jax
import sacrebleu
from absl import logging as absl_logging
from sacremoses import MosesTokenizer

from translate.config import Config, apply_override, parse_flags
from translate.decode import DecodeTimes, translate_sentences
from translate.text import read_lines
from translate.tokenizer import Tokenizer
from translate.workdir import Workdir, load_ensemble


def local_copy(params):
    """This host's full copy of replicated parameters, on its first device (for decoding)."""
    return jax.tree.map(lambda x: x.addressable_data(0), params)


def split_compounds(text: str) -> str:
    """Splits hyphenated compounds as get_ende_bleu.sh does: `a-b` -> `a ##AT##-##AT## b`.

    This is the script's `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`. Its matches do
    not overlap, so in `a-b-c` only the first hyphen is split; we keep that quirk, since the
    point is to match the paper's numbers. ASCII whitespace, like perl on bytes.
    """
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text, flags=re.ASCII)


def tokenize_for_bleu(lines: Sequence[str], lang: str) -> list[str]:
    """Moses tokenization (tokenizer.perl -l lang, escaping on) and compound splitting."""
    moses = MosesTokenizer(lang=lang)
    return [split_compounds(moses.tokenize(line, return_str=True, escape=True)) for line in lines]


def tokenized_bleu_recipe(lang: str) -> str:
    return (
        f"Moses tokenizer -l {lang} (sacremoses {importlib.metadata.version('sacremoses')}) on "
        "hypotheses and references, compounds split a-b -> a ##AT##-##AT## b, BLEU on the tokens "
        "(sacreBLEU tokenize=none, no smoothing, as multi-bleu.perl): tensor2tensor's "
        "get_ende_bleu.sh, the paper's Table 2 metric; not comparable with sacreBLEU"
    )


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
    """Corpus BLEU on Moses-tokenized, compound-split text: the recipe of the paper's numbers."""
    # No smoothing: multi-bleu.perl scores 0 when an n-gram order has no match, and so does this.
    bleu = sacrebleu.BLEU(tokenize="none", smooth_method="none")
    # sacreBLEU warns that the input looks tokenized: here that is the point.
    sacrebleu_log = logging.getLogger("sacrebleu")
    level = sacrebleu_log.level
    sacrebleu_log.setLevel(logging.ERROR)
    try:
        result = bleu.corpus_score(
            tokenize_for_bleu(hypotheses, lang), [tokenize_for_bleu(references, lang)]
        )
    finally:
        sacrebleu_log.setLevel(level)
    return result.score


def score(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> dict[str, Any]:
    """sacreBLEU (cased, 13a) and chrF with their signatures, and the paper's tokenized BLEU.

    Args:
      hypotheses: detokenized system output, one sentence each.
      references: the raw references, aligned with `hypotheses`.
      lang: the target language, for the Moses tokenizer of the tokenized BLEU.
    """
    bleu = sacrebleu.BLEU()
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    return {
        "bleu": round(bleu_score.score, 2),
        "signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": round(tokenized_bleu(hypotheses, references, lang), 2),
        "tokenized_bleu_recipe": tokenized_bleu_recipe(lang),
    }


def evaluate(
    graphdefs: tuple,
    params: tuple,
    tokenizer: Tokenizer,
    config: Config,
    sources: Sequence[str],
    references: Sequence[str],
    step: int,
    averaged_steps: Sequence[int] = (),
) -> tuple[dict[str, Any], list[str]]:
    """Decodes `sources` and scores against `references`; returns (report, hypotheses).

    `graphdefs` and `params` are an ensemble's tuples (translate.decode), one model or more.
    `step` is the checkpoint's training step; `averaged_steps`, when the parameters are a
    checkpoint average, the steps averaged (recorded in the report).
    """
    times = DecodeTimes()
    translations = translate_sentences(
        graphdefs, params, tokenizer, sources, config.decode, config.data.max_len, times=times
    )
    hypotheses = [best[0][1] for best in translations]
    seconds = times.decode_seconds
    report = score(hypotheses, references, config.data.tgt_lang)
    report.update(
        {
            "num_sentences": len(sources),
            # Searching alone; the first call of each batch shape is `compile_seconds`.
            "decode_seconds": round(seconds, 3),
            "compile_seconds": round(times.compile_seconds, 3),
            "num_batch_shapes": len(times.shapes),
            "sentences_per_second": round(len(sources) / max(seconds, 1e-9), 2),
            "beam_size": config.decode.beam_size,
            "length_penalty": config.decode.length_penalty,
            "max_extra_len": config.decode.max_extra_len,
            "step": int(step),
            "checkpoint_steps": [int(s) for s in averaged_steps] or [int(step)],
            "device": jax.local_devices()[0].device_kind,
        }
    )
    return report, hypotheses


def example_indices(num_sentences: int, num_examples: int) -> list[int]:
    """Evenly spaced line indices, so the examples are not all from the start of the test set."""
    if num_sentences <= num_examples:
        return list(range(num_sentences))
    return [i * num_sentences // num_examples for i in range(num_examples)]


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

    report.txt gives the scores with their signatures, how the test set was decoded and how
    fast, the training-curve pictures found in `plots_dir` (default `out_dir`; drawn by
    scripts/plot_metrics.py), and a few translations beside their references.
    """
    out = Workdir(out_dir)
    plots_dir = out.path if plots_dir is None else pathlib.Path(plots_dir)
    out.path.mkdir(parents=True, exist_ok=True)
    out.hypotheses.write_text("".join(h + "\n" for h in hypotheses), encoding="utf-8")
    out.report_json.write_text(json.dumps(report, indent=2) + "\n")
    models = report.get("ensemble") or [f"checkpoint step {report['step']}"]
    steps = report["checkpoint_steps"]
    if len(steps) > 1:
        models = [f"mean parameters of the {len(steps)} checkpoints at steps {steps}"]
    lines = [
        f"sacreBLEU       {report['bleu']:.2f}   {report['signature']}",
        "                (detokenized, against the raw references; report.json key `bleu`)",
        f"                {report['bleu_detail']}",
        f"tokenized BLEU  {report['tokenized_bleu']:.2f}   (the paper's metric; key "
        "`tokenized_bleu`; not comparable with sacreBLEU)",
        f"                {report['tokenized_bleu_recipe']}",
        f"chrF            {report['chrf']:.2f}   {report['chrf_signature']}",
        "",
        f"model     {models[0]}",
        *(f"          {m}" for m in models[1:]),
        f"decoding  beam {report['beam_size']}, length penalty {report['length_penalty']}, "
        f"at most source length + {report['max_extra_len']} tokens",
        f"speed     {report['sentences_per_second']:.1f} sentences/s: "
        f"{report['num_sentences']} sentences in {report['decode_seconds']:.1f} s on "
        f"{report['device']}; compiling {report['num_batch_shapes']} batch "
        f"shape{'' if report['num_batch_shapes'] == 1 else 's'} took "
        f"{report['compile_seconds']:.1f} s more",
    ]
    plots = [p.name for p in Workdir(plots_dir).metric_plots()]
    if plots:
        lines.append(f"curves    {plots_dir}: {', '.join(plots)}")
    indices = example_indices(len(sources), num_examples)
    if indices:
        lines += ["", "Examples (line: source, reference, hypothesis)"]
    for i in indices:
        lines += ["", f"{i + 1:>6}  SRC {sources[i]}", f"        REF {references[i]}"]
        lines += [f"        HYP {hypotheses[i]}"]
    out.report_txt.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: Sequence[str]) -> None:
    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's read-only manager warnings
    flags, overrides = parse_flags(
        list(argv),
        {"workdir": [], "src": "", "ref": "", "output": "", "step": -1, "average": 0},
    )
    for name in ("workdir", "src", "ref"):
        if not flags[name]:
            raise SystemExit(f"--{name} is required")
    workdirs = flags["workdir"]
    step = None if flags["step"] == -1 else flags["step"]
    graphdef, params, tokenizer, config, members = load_ensemble(workdirs, step, flags["average"])
    steps = members[0]
    for dotted, text in overrides.items():
        if not dotted.startswith("decode."):
            raise SystemExit(f"--config.{dotted}: only decode.* can be changed at evaluation")
        apply_override(config, dotted, text)
    sources = read_lines(flags["src"])
    references = read_lines(flags["ref"])
    if len(sources) != len(references):
        raise SystemExit(
            f"--src {flags['src']} has {len(sources)} lines but --ref "
            f"{flags['ref']} has {len(references)}"
        )
    report, hypotheses = evaluate(
        graphdef, params, tokenizer, config, sources, references, steps[-1], steps
    )
    if len(members) > 1:
        report["ensemble"] = [f"{w} step {s}" for w, s in zip(workdirs, members)]
    out_dir = flags["output"] or workdirs[0]
    write_report(out_dir, report, sources, references, hypotheses, plots_dir=workdirs[0])
    print(Workdir(out_dir).report_txt.read_text(), end="")


if __name__ == "__main__":
    main(sys.argv[1:])
