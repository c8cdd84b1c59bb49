"""Decode a test set with a trained workdir (or an ensemble) and write the BLEU report.

    translate-evaluate --workdir=DIR --src=test.en --ref=test.de [--output=OUT] \\
        [--step=N | --average=5] [--lowercase] [--compare=OTHER_HYPOTHESES]

(or `python -m translate.evaluate ...`) writes OUT/report.json, OUT/report.txt and
OUT/hypotheses.txt. OUT defaults to a new directory DIR/evaluations/SRC.stepN (.2, .3, ... when
that exists), so the training run's own report is never overwritten; an --output that holds a
report already, or is a training workdir, is refused.
Repeating --workdir decodes with the ensemble of those models (they must share a vocabulary).
`--average=N` decodes with the mean parameters of the newest N checkpoints (Sec. 6.1: 5 for
base, 20 for big). The report holds two BLEU scores that must not be confused:
- `bleu`: sacreBLEU's default, cased, 13a tokenization (or the target language's own tokenizer
  for Chinese, Japanese, Korean: `trg_lang` comes from data.tgt_lang), on detokenized output
  against the raw reference; comparable across papers that report sacreBLEU with the same
  signature. `--lowercase` adds the case-insensitive `bleu_lowercase` beside it.
- `tokenized_bleu`: the recipe behind the paper's numbers (tensor2tensor's get_ende_bleu.sh):
  Moses tokenization of hypotheses and references, hyphenated compounds split, BLEU on the
  tokens. Compare it with the paper's Table 2 only.
`--compare=FILE` runs sacreBLEU's paired bootstrap resampling test (1,000 resamples) of these
hypotheses against another system's (FILE, one line per source line) and says whether the BLEU
difference is significant at p < 0.05. report.json also records what produced it: the git
commit, package versions, device, config, parameter count and the test files' sha256.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import pathlib
import platform
import re
import subprocess
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import sacrebleu
from absl import logging as absl_logging
from sacrebleu.significance import PairedTest
from sacremoses import MosesTokenizer

from translate import cli
from translate.config import Config, Flag, apply_override, parse_flags
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


def score(
    hypotheses: Sequence[str], references: Sequence[str], lang: str, lowercase: bool = False
) -> dict[str, Any]:
    """sacreBLEU (cased) and chrF with their signatures, and the paper's tokenized BLEU.

    Args:
      hypotheses: detokenized system output, one sentence each.
      references: the raw references, aligned with `hypotheses`.
      lang: the target language: sacreBLEU's `trg_lang` (13a tokenization, except Chinese,
        Japanese and Korean get their own) and the Moses tokenizer of the tokenized BLEU.
      lowercase: also score case-insensitively, as `bleu_lowercase` beside the cased `bleu`.
    """
    bleu = sacrebleu.BLEU(trg_lang=lang)
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    scores = {
        "bleu": round(bleu_score.score, 2),
        "signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": round(tokenized_bleu(hypotheses, references, lang), 2),
        "tokenized_bleu_recipe": tokenized_bleu_recipe(lang),
    }
    if lowercase:
        uncased = sacrebleu.BLEU(trg_lang=lang, lowercase=True)
        uncased_score = uncased.corpus_score(list(hypotheses), [list(references)])
        scores["bleu_lowercase"] = round(uncased_score.score, 2)
        scores["signature_lowercase"] = str(uncased.get_signature())
    return scores


def paired_bootstrap(
    hypotheses: Sequence[str],
    other: Sequence[str],
    references: Sequence[str],
    lang: str,
    num_samples: int = 1000,
) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap resampling test of `hypotheses` against `other`'s BLEU.

    `other` is the baseline; the p-value is the chance of a difference this large when the two
    systems are equally good (Koehn 2004, as `sacrebleu --paired-bs`, seeded by SACREBLEU_SEED,
    12345 by default, so the result repeats).

    Returns:
      Both BLEU scores with their bootstrap means and 95% confidence intervals, the p-value,
      whether it is below 0.05, and the test's signature. Identical hypotheses are reported
      as such (`identical`, no p-value): sacreBLEU's test, after multeval, gives them the
      smallest p-value, since it never attributes a zero difference to chance.
    """
    if list(hypotheses) == list(other):
        bleu = sacrebleu.BLEU(trg_lang=lang)
        value = round(bleu.corpus_score(list(hypotheses), [list(references)]).score, 2)
        return {
            "bleu": value,
            "other_bleu": value,
            "identical": True,
            "p_value": None,
            "significant": False,
            "signature": str(bleu.get_signature()),
        }
    test = PairedTest(
        [("other", list(other)), ("this", list(hypotheses))],
        {"BLEU": sacrebleu.BLEU(trg_lang=lang)},
        [list(references)],
        test_type="bs",
        n_samples=num_samples,
    )
    signatures, results = test()
    baseline, system = results["BLEU"]
    return {
        "bleu": round(system.score, 2),
        "bleu_mean": round(float(system.mean), 2),
        "bleu_ci95": round(float(system.ci), 2),
        "other_bleu": round(baseline.score, 2),
        "other_bleu_mean": round(float(baseline.mean), 2),
        "other_bleu_ci95": round(float(baseline.ci), 2),
        "identical": False,
        "p_value": round(float(system.p_value), 4),
        "significant": bool(system.p_value < 0.05),
        "signature": str(signatures["BLEU"]),
    }


def sha256_of_lines(lines: Sequence[str]) -> str:
    """The sha256 of the text as a file of these lines, each ended by "\\n"."""
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8") + b"\n")
    return digest.hexdigest()


def sha256_of_file(path: str | pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def git_commit() -> dict[str, Any] | None:
    """The commit of the checkout this package runs from, and whether files differ from it.

    None when the package is not a git checkout's (an installed wheel) or git is missing.
    """
    checkout = pathlib.Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise OSError(done.stderr)
        return done.stdout.strip()

    try:
        if pathlib.Path(git("rev-parse", "--show-toplevel")).resolve() != checkout:
            return None
        return {
            "commit": git("rev-parse", "HEAD"),
            "modified": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return None


# The distributions whose versions can change a score or a translation.
PACKAGES = (
    "translate",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "numpy",
    "sentencepiece",
    "sacrebleu",
    "sacremoses",
)


def package_versions() -> dict[str, str | None]:
    """Versions of `PACKAGES` (None when one is not installed as a distribution) and Python."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def provenance(config: Config, params: tuple) -> dict[str, Any]:
    """What produced a report: code, packages, devices, config and model size."""
    return {
        "git": git_commit(),
        "packages": package_versions(),
        "platform": jax.default_backend(),
        "num_devices": jax.device_count(),
        "config": config.to_dict(),
        # Per model of an ensemble.
        "num_parameters": [
            int(sum(np.size(x) for x in jax.tree.leaves(model))) for model in params
        ],
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
    lowercase: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Decodes `sources` and scores against `references`; returns (report, hypotheses).

    `graphdefs` and `params` are an ensemble's tuples (translate.decode), one model or more.
    `step` is the checkpoint's training step; `averaged_steps`, when the parameters are a
    checkpoint average, the steps averaged (recorded in the report). `lowercase` adds the
    case-insensitive BLEU beside the cased one.
    """
    times = DecodeTimes()
    translations = translate_sentences(
        graphdefs, params, tokenizer, sources, config.decode, config.data.max_len, times=times
    )
    hypotheses = [best[0][1] for best in translations]
    seconds = times.decode_seconds
    report = score(hypotheses, references, config.data.tgt_lang, lowercase)
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
            "test_set": {
                "source_sha256": sha256_of_lines(sources),
                "reference_sha256": sha256_of_lines(references),
            },
        }
    )
    report.update(provenance(config, params))
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
    ]
    if "bleu_lowercase" in report:
        lines.insert(
            3, f"lowercased      {report['bleu_lowercase']:.2f}   {report['signature_lowercase']}"
        )
    lines += comparison_lines(report.get("comparison"))
    lines += [
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
    git = report.get("git")
    if "packages" in report:
        versions = report["packages"]
        code = f"commit {git['commit'][:12]}" + (" (modified)" if git["modified"] else "")
        lines.append(
            f"code      {code if git else 'not a git checkout'}; "
            + ", ".join(f"{k} {versions[k]}" for k in ("jax", "flax", "sacrebleu") if k in versions)
            + f"; {report['num_parameters'][0]:,} parameters"
        )
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


def default_output(workdir: str, source: str, steps: Sequence[int], num_models: int) -> Workdir:
    """A new directory under the first workdir's evaluations/ named by the test set and model.

    `evaluations/newstest2014.en.step100000`, `...average5.step100000` or `...ensemble2.step..`;
    `.2`, `.3`, ... are added while a directory of that name exists, so nothing is overwritten.
    """
    name = pathlib.Path(source).name
    if num_models > 1:
        name += f".ensemble{num_models}"
    if len(steps) > 1:
        name += f".average{len(steps)}"
    name += f".step{steps[-1]}"
    evaluations = Workdir(workdir).evaluations
    candidate, number = evaluations / name, 1
    while candidate.exists():
        number += 1
        candidate = evaluations / f"{name}.{number}"
    return Workdir(candidate)


def check_output(output: str) -> None:
    """Refuses an --output that is a training workdir or holds a report already."""
    out = Workdir(output)
    if out.config.exists() or out.checkpoints.exists():
        raise ValueError(
            f"--output={output} is a training workdir, whose report.json is the training run's "
            "own: leave --output out (the default is WORKDIR/evaluations/...) or give another"
        )
    found = [p.name for p in (out.report_json, out.report_txt, out.hypotheses) if p.exists()]
    if found:
        raise ValueError(
            f"--output={output} holds {', '.join(found)} already; nothing was overwritten: "
            "give a new --output, or leave it out for a new WORKDIR/evaluations/... directory"
        )


def main(argv: Sequence[str]) -> None:
    flags, overrides = parse_flags(
        list(argv),
        {
            "workdir": Flag(
                [], "Required. A training workdir; repeat it to decode with an ensemble."
            ),
            "src": Flag("", "Required. The source side of the test set, one sentence a line."),
            "ref": Flag("", "Required. The reference translations, aligned with --src."),
            "output": Flag(
                "",
                "Directory for report.json, report.txt and hypotheses.txt; must not hold a "
                "report yet. Default: a new WORKDIR/evaluations/SRC.stepN.",
            ),
            "step": Flag(-1, "The checkpoint step to decode with; -1: the newest."),
            "average": Flag(0, "Decode with the mean parameters of the newest N checkpoints."),
            "lowercase": Flag(False, "Add the case-insensitive sacreBLEU beside the cased one."),
            "compare": Flag(
                "",
                "Another system's hypotheses for --src (one line each): paired bootstrap test "
                "of the BLEU difference (sacreBLEU, 1,000 resamples, p < 0.05).",
            ),
        },
        doc=__doc__,
        sections=("decode",),
    )
    for name in ("workdir", "src", "ref"):
        if not flags[name]:
            raise ValueError(f"--{name} is required (--help lists every flag)")
    if flags["output"]:
        check_output(flags["output"])
    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's read-only manager warnings
    workdirs = flags["workdir"]
    step = None if flags["step"] == -1 else flags["step"]
    graphdef, params, tokenizer, config, members = load_ensemble(workdirs, step, flags["average"])
    steps = members[0]
    for dotted, text in overrides.items():
        apply_override(config, dotted, text)
    config.validate()
    sources = read_lines(flags["src"])
    references = read_lines(flags["ref"])
    if len(sources) != len(references):
        raise ValueError(
            f"--src {flags['src']} has {len(sources)} lines but --ref "
            f"{flags['ref']} has {len(references)}"
        )
    other = read_lines(flags["compare"], allow_empty=True) if flags["compare"] else None
    if other is not None and len(other) != len(sources):
        raise ValueError(
            f"--compare {flags['compare']} has {len(other)} lines but --src "
            f"{flags['src']} has {len(sources)}"
        )
    report, hypotheses = evaluate(
        graphdef,
        params,
        tokenizer,
        config,
        sources,
        references,
        steps[-1],
        steps,
        lowercase=flags["lowercase"],
    )
    report["test_set"] = {
        "source": str(pathlib.Path(flags["src"]).resolve()),
        "source_sha256": sha256_of_file(flags["src"]),
        "reference": str(pathlib.Path(flags["ref"]).resolve()),
        "reference_sha256": sha256_of_file(flags["ref"]),
    }
    if len(members) > 1:
        report["ensemble"] = [f"{w} step {s}" for w, s in zip(workdirs, members)]
    if other is not None:
        report["comparison"] = {
            "other": str(pathlib.Path(flags["compare"]).resolve()),
            "other_sha256": sha256_of_file(flags["compare"]),
            **paired_bootstrap(hypotheses, other, references, config.data.tgt_lang),
        }
    out = Workdir(flags["output"]) if flags["output"] else None
    out = out or default_output(workdirs[0], flags["src"], steps, len(members))
    write_report(out.path, report, sources, references, hypotheses, plots_dir=workdirs[0])
    print(out.report_txt.read_text(), end="")
    print(f"(written to {out.path})")


if __name__ == "__main__":
    cli.run(main)
