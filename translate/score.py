"""Score given translations with a trained workdir (forced decoding), and align them.

    translate-score --workdir=DIR --src=test.en --tgt=test.de [--output=scores.tsv] \\
        [--per_token=pieces.jsonl] [--alignment=align.txt [--alignment_pieces] \\
        [--alignment_layer=N]] [--step=N | --average=N] [--matmul_dtype=compute]
    paste test.en test.de | translate-score --workdir=DIR > scores.tsv

(`python -m translate.score`.) One output line per pair: its total log-probability under the
model (natural log, the target's EOS included, no label smoothing, no length penalty), then the
number of target pieces scored (EOS included) and their mean, tab-separated: `TOTAL<TAB>N<TAB>MEAN`.
The pairs come from --src and --tgt (one sentence a line, the same number of lines), or from
--input (or standard input) with the source and the target of a pair on one line, separated by a
tab. Several --workdir flags score with their ensemble: each piece by the mean of the models'
log-probabilities, as beam search scores a hypothesis, so the score of the search's own output
is the search's score of it before the length penalty.

--per_token=FILE writes one JSON line per pair: {"line": N, "pieces": [...], "log_probs": [...]}.
--alignment=FILE writes one line per pair in Moses/Pharaoh format, `i-j` for source word i and
target word j (from 0; words are the whitespace tokens of each line as given, str.split()'s, or
pieces with --alignment_pieces), each target word linked to the source word its chosen decoder
layer's cross-attention, heads averaged, attends to most (forced alignment;
docs/translating.md).

A pair longer than the model's data.max_len tokens on a side is scored whole (nothing is cut)
and stderr names its line: the model never saw such lengths in training. Pairs are scored in
length-sorted batches of --batch_size, up to 10,000 lines at a time, so memory stays bounded and
output streams however long the input: a batch may take 80% of the device's free memory, by an
estimate of the pass's largest arrays (translate/decoding/forced.py, `forced_bytes`), so a
--batch_size whose batches would need more is refused before anything is read, a batch of long
pairs is split, and a pair too long to score whole within it is refused, naming its line,
before any pair of its 10,000 lines is scored. Output files are written beside their paths and
replace them only once every pair is scored; an output that is an input, another output, or a
file of a --workdir is refused before anything is read.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import BinaryIO

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line
startup.import_jax()  # before anything imports JAX: without etils.epath (translate/startup.py)

from translate import cli, compilation
from translate.data.batching import decode_width
from translate.decoding import forced, memory
from translate.flags import (
    Flag,
    alignment_flags,
    check_alignment_flags,
    checkpoint_choice,
    checkpoint_flags,
    compilation_cache_flag,
    matmul_dtype_flag,
    parse_flags,
)
from translate.streams import (
    Outputs,
    Progress,
    check_output_files,
    count_lines,
    dash_is_standard,
    read_chunks,
    read_parallel,
    say,
)
from translate.trained import load_ensemble
from translate.workdir import Workdir, read_config

_imports_done()

# Most lines scored and written at a time: bounds memory on arbitrarily long input.
LINES_PER_CHUNK = 10_000
# Over-long pairs named on stderr, at most; then one line says there are more.
MAX_LENGTH_WARNINGS = 5

FLAGS = {
    "workdir": Flag([], "Required. A training workdir; repeat it for an ensemble."),
    **checkpoint_flags("score with"),
    "src": Flag("", "The source sentences, one a line (with --tgt)."),
    "tgt": Flag("", "The target sentences to score, aligned with --src."),
    "input": Flag(
        "", "Pairs as SOURCE<TAB>TARGET lines, instead of --src and --tgt; default stdin."
    ),
    "output": Flag("", "Where the scores go (replaced only once all are written); default stdout."),
    "per_token": Flag(
        "", "Also write each pair's pieces and their log-probabilities as JSON lines."
    ),
    **alignment_flags(),
    "batch_size": Flag(64, "Pairs scored together."),
    **matmul_dtype_flag(),
    **compilation_cache_flag(),
}


def read_pairs(flags, source: BinaryIO | None) -> Iterator[tuple[list[str], list[str]]]:
    """(sources, targets) chunks of at most LINES_PER_CHUNK pairs, in order.

    Raises:
      ValueError: naming the file and line of a line without exactly one tab, a line that is
        not UTF-8, or --src and --tgt of different lengths.
    """
    if flags["src"]:
        # Paired line by line: two pipes, or a pipe and a file, arrive in chunks of their own.
        parallel = {"--src": flags["src"], "--tgt": flags["tgt"]}
        yield from read_parallel(parallel, LINES_PER_CHUNK)
        return
    name, first = flags["input"] or "<stdin>", 0
    for chunk in read_chunks(source, name, LINES_PER_CHUNK):
        pairs = [line.split("\t") for line in chunk]
        for number, fields in enumerate(pairs, first + 1):
            if len(fields) != 2:
                raise ValueError(
                    f"{name}:{number}: {len(fields) - 1} tabs; a pair is SOURCE<TAB>TARGET "
                    "(or give --src and --tgt)"
                )
        first += len(chunk)
        yield [p[0] for p in pairs], [p[1] for p in pairs]


def check_flags(flags) -> None:
    """Refuses, before any model is loaded, flags that cannot work together."""
    if not flags["workdir"]:
        raise ValueError("--workdir is required (repeat it for an ensemble)")
    if bool(flags["src"]) != bool(flags["tgt"]):
        raise ValueError("give --src and --tgt together (or pairs as SOURCE<TAB>TARGET lines)")
    if flags["src"] and flags["input"]:
        raise ValueError("give --src and --tgt, or --input, not both")
    for flag in ("src", "tgt", "input"):
        path = flags[flag]
        if path and (os.path.isdir(path) or not os.path.exists(path)):
            what = "a directory" if os.path.isdir(path) else "no such file"
            raise ValueError(f"--{flag}={path}: {what}")
    if flags["batch_size"] < 1:
        raise ValueError(f"--batch_size={flags['batch_size']}: must be >= 1")
    check_alignment_flags(flags)


def member_configs(workdirs: Sequence[str]) -> list:
    """The config of each --workdir, read before any checkpoint is.

    Raises:
      ValueError: naming a --workdir that is an export (translate-export.json), or whose
        config.json cannot be read.
    """
    configs = []
    for path in workdirs:
        record = Workdir(path).path / "translate-export.json"
        if record.is_file():
            try:
                exported = json.loads(record.read_text(encoding="utf-8"))
                origin = f" (exported from {exported['workdir']})"
                what = f"a {exported['format']} export"
            except (OSError, ValueError, TypeError, KeyError):
                origin, what = "", "an export"
            raise ValueError(
                f"--workdir={path} is {what} ({record.name}), not a training workdir{origin}: "
                "translate-score reads a training workdir's checkpoints"
            )
        try:
            configs.append(read_config(Workdir(path)))
        except ValueError as e:
            raise ValueError(f"--workdir={path}: {e}") from None
    return configs


def check_batch_memory(
    batch_size: int, models: Sequence, vocab_size: int, max_len: int, param_bytes: int = 0
) -> None:
    """Refuses a --batch_size whose batches of pairs within data.max_len would need more memory
    than a batch may take (`memory.memory_bound`, by `forced.forced_bytes`' estimate).

    Raises:
      ValueError: naming --batch_size, the memory it would need and the most that fits.
    """
    # A batch holds at most LINES_PER_CHUNK pairs, padded to the power of two above.
    rows = min(batch_size, 1 << (LINES_PER_CHUNK - 1).bit_length())
    width = decode_width(max_len)
    per_row = forced.forced_bytes(models, vocab_size, 1, width, width)
    need, bound = rows * per_row + param_bytes, memory.memory_bound()
    if need > bound:
        most = max(0, bound - param_bytes) // per_row
        fix = f"give --batch_size={most} or less" if most else "so would --batch_size=1"
        raise ValueError(
            f"--batch_size={batch_size}: a batch of {rows} pairs of up to data.max_len={max_len} "
            f"pieces a side would need {memory.over_bound(need)}; {fix}"
        )


def output_lines(first: int, scored: Sequence[forced.PairScore]) -> dict[str, str]:
    """The lines of each output for pairs `first`, `first` + 1, ...: by flag."""
    scores = "".join(
        f"{pair.total:.6f}\t{len(pair.log_probs)}\t{pair.total / len(pair.log_probs):.6f}\n"
        for pair in scored
    )
    per_token = "".join(
        json.dumps(
            {
                "line": first + n,
                "pieces": pair.pieces,
                "log_probs": [round(x, 6) for x in pair.log_probs],
            },
            ensure_ascii=False,
        )
        + "\n"
        for n, pair in enumerate(scored)
    )
    links = "".join(forced.format_links(pair.links or []) + "\n" for pair in scored)
    return {"--output": scores, "--per_token": per_token, "--alignment": links}


def main(argv: Sequence[str]) -> None:
    flags, _ = parse_flags(list(argv), FLAGS, doc=__doc__, sections=())
    dash_is_standard(flags)
    cli.quiet_libraries()
    check_flags(flags)
    outputs = {f"--{n}": flags[n] for n in ("output", "per_token", "alignment")}
    inputs = {f"--{n}": flags[n] for n in ("src", "tgt", "input")}
    check_output_files(outputs, inputs, flags["workdir"])
    step, average = checkpoint_choice(flags)
    configs = member_configs(flags["workdir"])
    layer = None
    if flags["alignment"]:
        layer = forced.ensemble_alignment_layer(configs, flags["workdir"], flags["alignment_layer"])
    compilation.use_persistent_cache(flags["compilation_cache"])
    graphdefs, params, tokenizer, config, _ = load_ensemble(
        flags["workdir"], step, average, params=flags["params"], matmul_dtype=flags["matmul_dtype"]
    )
    models = [member.model for member in configs]
    check_batch_memory(
        flags["batch_size"],
        models,
        tokenizer.vocab_size,
        config.data.max_len,
        forced.parameter_bytes(params),
    )
    total = count_lines(flags["src"] or flags["input"]) if flags["output"] else None
    source = None
    if not flags["src"]:
        source = open(flags["input"], "rb") if flags["input"] else sys.stdin.buffer
    progress, long_lines = None, 0
    try:
        with Outputs(outputs) as out:
            if flags["output"]:
                progress = Progress(total, unit="pairs")
            first = 0
            for sources, targets in read_pairs(flags, source):
                scored = forced.score_pairs(
                    graphdefs,
                    params,
                    tokenizer,
                    sources,
                    targets,
                    flags["batch_size"],
                    config.data.max_len,
                    alignment_layer=layer,
                    alignment_pieces=flags["alignment_pieces"],
                    models=models,
                    first_pair=first,
                )
                for n, pair in enumerate(scored, first + 1):
                    if pair.too_long:
                        long_lines += 1
                        if progress:
                            progress.end_line()
                        say_long_line(n, long_lines, config.data.max_len)
                for flag, text in output_lines(first, scored).items():
                    if flag in out:
                        out.write(flag, text)
                if progress:
                    progress.update(len(scored))
                first += len(sources)
            out.commit()
        if long_lines > MAX_LENGTH_WARNINGS:
            if progress:
                progress.end_line()  # the closing warning starts a line of its own
            say(f"warning: {long_lines} pairs in all were longer than data.max_len\n")
    finally:
        if progress:
            progress.close()
        if source is not None and source is not sys.stdin.buffer:
            source.close()


def say_long_line(number: int, count: int, max_len: int) -> None:
    """Names on stderr a pair longer than the model was trained on (the first few)."""
    if count <= MAX_LENGTH_WARNINGS:
        say(
            f"warning: pair {number} is longer than data.max_len={max_len} tokens on a side: "
            "scored whole, at lengths the model never saw in training\n"
        )
    elif count == MAX_LENGTH_WARNINGS + 1:
        say("warning: more pairs are longer than data.max_len; not named\n")


def console_main() -> None:
    """`translate-score`, the console script of pyproject.toml."""
    cli.run(main, teardown=False)


if __name__ == "__main__":
    console_main()
