"""Translate text from the command line with a trained workdir, or an ensemble of workdirs.

    translate-text --workdir=/tmp/quickstart < input.en > output.de
    translate-text --workdir=A [--workdir=B ...] --input=in.en --output=out.de \\
        [--step=N | --average=N] [--beam_size=4] [--length_penalty=0.6] \\
        [--max_extra_len=50] [--batch_size=64] [--parallel_batches=2] [--nbest=N]
    translate-text --workdir=/tmp/quickstart    (type a sentence, read its translation)

(`python -m translate.translate_text` is the same command.) One sentence per input line gives
one translation per output line, in input order; an empty line gives an empty line. Lines are
decoded as soon as they arrive: typed at a terminal or written to a pipe one at a time, each
line is translated and written at once; from a file, or a pipe that holds many lines,
up to 10,000 lines are decoded together in length-sorted batches, so memory stays bounded and
output streams however long the input. With `--nbest=N` every non-empty line gives N lines
`LINE<TAB>SCORE<TAB>TRANSLATION` (LINE counts input lines from 0; SCORE is the length-normalised
log-probability that beam search ranks by), best first; an empty line gives the single line
`LINE<TAB>0.0000<TAB>`. The N are distinct texts from the beam's hypotheses; fewer come out when
pieces that spell the same text fill the beam (a wider --beam_size helps). Without --step or
--average the newest checkpoint decodes; `--step=N` picks one, and `--average=N` the mean of the
newest N (as translate.evaluate); the first line on stderr says which (and, when the training
report decoded the mean of the newest N, how to pick that). Several --workdir flags decode with
their ensemble (one shared vocabulary), each workdir at the same choice. Decoding options left
unset come from the first workdir's config; one that cannot decode (`--beam_size=-3`,
`--length_penalty=nan`) is refused before anything is loaded. A line longer than the model's
`data.max_len` tokens is translated from its first tokens only, and stderr says which line.
A --batch_size (or the workdir's) whose searches, --parallel_batches at once, would need more
than 80% of the device's free memory by an estimate of their caches (translate/decoding/
memory.py, `search_bytes`) is refused before any line is read, naming the most that fits.
Writing to --output shows progress and sentences/s on stderr.

`--sampling=ancestral|topk|topp|epsilon` samples in place of the beam (`--temperature`, `--top_k`,
`--top_p`, `--epsilon`), `--num_candidates=N` per line, each line's samples fixed by `--seed`
and the line's place in the input; `--mbr=chrf|bleu` chooses each line's output among the
candidates (samples or the beam's n-best) by minimum Bayes risk; `--prefix=FILE` gives one target
prefix per input line that the outputs start with (docs/translating.md, "Sampling, MBR and
prefixes").

--output is written to a temporary file beside it that replaces it only once every line is
translated, so a failed or interrupted run (Ctrl-C, SIGTERM) leaves an existing --output as it
was, and the temporary file of one killed outright is removed by the next run into that file
(standard output, a pipe or a device streams as it goes). An --output that is the --input file
(however spelled: ./x, a symlink), a directory, or anything a --workdir holds (its config,
vocabulary, checkpoints, tokens, logs, report, curves, best/, evaluations/, data/, or any other
file already there) is refused before any file is opened.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line
startup.import_jax()  # before anything imports JAX: without etils.epath (translate/startup.py)


from translate import cli, compilation
from translate.config import DecodeConfig, field_descriptions
from translate.data.batching import decode_width
from translate.decoding import forced, memory, saved_searches
from translate.decoding.settings import (
    DecodeSettings,
    check_combination,
    check_values,
    decode_settings,
)
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
    say,
    unknown_characters_warning,
)
from translate.workdir import Workdir, read_config

_imports_done()

# Most lines decoded and written at a time: bounds memory on arbitrarily long input.
LINES_PER_CHUNK = 10_000


def format_lines(first_index: int, results: list[list[tuple[float, str]]], nbest: int) -> str:
    if not nbest:
        return "".join(hypotheses[0][1] + "\n" for hypotheses in results)
    return "".join(
        f"{first_index + i}\t{score:.4f}\t{text}\n"
        for i, hypotheses in enumerate(results)
        for score, text in hypotheses
    )


DECODE_FIELDS = field_descriptions(DecodeConfig)
# The decoding flags' defaults, which mean "the workdir's config.decode value".
UNSET = {
    "beam_size": 0,
    "length_penalty": -1.0,
    "max_extra_len": -1,
    "batch_size": 0,
    "parallel_batches": 0,
    "beam_stop": "",
}
# Lines longer than data.max_len (and --prefix lines with characters outside the vocabulary)
# named on stderr, at most; then one line says there are more.
MAX_TRUNCATION_WARNINGS = 5
FLAGS = {
    "workdir": Flag([], "Required. A training workdir; repeat it for an ensemble."),
    **checkpoint_flags("decode with"),
    "input": Flag("", "The text to translate, one sentence a line; default stdin."),
    "output": Flag(
        "",
        "Where the translations go (replaced only once all are written); default stdout.",
    ),
    # Left at these values: the first workdir's config.decode value.
    **{
        name: Flag(unset, DECODE_FIELDS[name] + " Left at the default shown: the workdir's config.")
        for name, unset in UNSET.items()
    },
    "nbest": Flag(
        0,
        "Write the N best translations of each line with their scores (the beam's, the "
        "samples' or, with --mbr, by expected utility).",
    ),
    "sampling": Flag(
        "",
        "Sample in place of beam search: ancestral, topk, topp or epsilon (docs/translating.md).",
    ),
    "temperature": Flag(1.0, "Sampling: divides the log-probabilities; lower is closer to greedy."),
    "top_k": Flag(0, "--sampling=topk: draw from the k likeliest pieces (1: greedy)."),
    "top_p": Flag(1.0, "--sampling=topp: draw from the nucleus of this probability."),
    "epsilon": Flag(0.0, "--sampling=epsilon: draw from the pieces of probability >= this."),
    "num_candidates": Flag(
        1, "Candidates per line: samples, or the beam's n-best (for --mbr and --nbest)."
    ),
    "seed": Flag(0, "Sampling: the seed; a line's samples depend only on it and the line."),
    "mbr": Flag(
        "", "Choose each line's output among the candidates by minimum Bayes risk: chrf or bleu."
    ),
    "prefix": Flag(
        "", "A file of target prefixes, one per input line (empty: none): outputs start with it."
    ),
    **alignment_flags(),
    **matmul_dtype_flag(),
    **compilation_cache_flag(),
}


def named_flags(argv: Sequence[str]) -> set[str]:
    """The names of the flags on a command line (`--beam_size=0` and `--beam_size 0` alike)."""
    return {arg[2:].partition("=")[0] for arg in argv if arg.startswith("--")}


# The sampling and candidate flags: fields of DecodeSettings that no config holds.
SAMPLING_FLAGS = ("sampling", "temperature", "top_k", "top_p", "epsilon", "num_candidates")
SAMPLING_FLAGS += ("seed", "mbr")


def given_decoding_flags(flags: dict[str, Any], named: set[str] = frozenset()) -> dict[str, Any]:
    """The decoding flags given a value of their own (not left at "unset"), checked by
    config/rules.py's rules (translate/decoding/settings.py), with --nbest; the sampling flags
    named or set, checked by theirs.

    Raises:
      ValueError: naming a flag whose value cannot decode, or a beam flag given with
        --sampling (before any model is loaded).
    """
    # A flag at its "unset" value counts as given when the command line names it: an
    # explicit --beam_size=0 is a mistake, not "the workdir's setting".
    given = {
        name: flags[name] for name, unset in UNSET.items() if flags[name] != unset or name in named
    }
    given.update(
        {
            name: flags[name]
            for name in SAMPLING_FLAGS
            if name in named or flags.get(name, FLAGS[name].default) != FLAGS[name].default
        }
    )
    check_values(given)
    if given.get("sampling"):
        # Sampling draws its candidates (sample_search): a beam setting would change nothing.
        for name in ("beam_size", "beam_stop"):
            if name in given:
                raise ValueError(
                    f"--{name}={given[name]} does nothing with --sampling={given['sampling']}: "
                    "the samples are drawn, not searched (--num_candidates sets how many)"
                )
    if flags["nbest"] < 0:
        raise ValueError(f"--nbest={flags['nbest']}: must be >= 0 (0: the best translation alone)")
    return given


def describe_models(workdirs: Sequence[str], steps: Sequence[list[int]], chosen: bool, config):
    """The stderr line that says which model decodes (and how to pick the report's)."""
    models = [
        f"the checkpoint of step {s[0]} of {w}"
        if len(s) == 1
        else f"the mean of the checkpoints at steps {s} of {w}"
        for w, s in zip(workdirs, steps)
    ]
    line = "decoding with " + "; ".join(models)
    n = config.decode.average_last
    if not chosen and n > 1 and len(steps[0]) == 1:
        line += f" (the training report decoded the mean of the newest {n} (--average={n}))"
    return line


def warn_of_long_lines(
    tokenizer, chunk: list[str], first: int, max_len: int, said: list[int], progress
) -> None:
    """Names on stderr the lines that decoding cuts to their first `max_len` - 1 tokens."""
    lengths = [len(ids) for ids in tokenizer.encode_source(chunk)]
    for i, length in enumerate(lengths):
        if length + 1 <= max_len or not chunk[i].strip():
            continue
        said.append(first + i + 1)
        if progress is not None:
            progress.end_line()
        if len(said) <= MAX_TRUNCATION_WARNINGS:
            say(
                f"warning: line {first + i + 1} is longer than data.max_len={max_len} tokens "
                f"({length} + EOS): only its first {max_len - 1} are translated\n"
            )
        elif len(said) == MAX_TRUNCATION_WARNINGS + 1:
            say("warning: more lines are longer than data.max_len; not named\n")


def warn_of_unknown_prefixes(
    tokenizer, prefixes: list[str] | None, first: int, name: str, said: list[int], progress
) -> None:
    """Names on stderr the --prefix lines whose characters outside the vocabulary are forced
    as <unk> (translate-sample's warning for its --prompt), the first few of them."""
    for i, prefix in enumerate(prefixes or []):
        if not prefix.strip():  # no prefix (`sentences.prefix_array`)
            continue
        where = f"--prefix={name} line {first + i + 1}"
        warning = unknown_characters_warning(tokenizer.encode_target([prefix])[0], where)
        if warning is None:
            continue
        said.append(first + i + 1)
        if progress is not None:
            progress.end_line()
        if len(said) <= MAX_TRUNCATION_WARNINGS:
            say(warning)
        elif len(said) == MAX_TRUNCATION_WARNINGS + 1:
            say(f"warning: more --prefix={name} lines have such characters; not named\n")


def check_flags(flags: dict[str, Any], argv: Sequence[str]) -> dict[str, Any]:
    """Refuses, before anything is loaded, flags that cannot work alone or together, inputs
    that are missing or directories, outputs a workdir owns; returns the decoding flags given.
    """
    given = given_decoding_flags(flags, named_flags(argv))
    # What goes together is checked at the defaults too, before anything loads; again below at
    # the workdir's settings (its beam size).
    check_combination(DecodeSettings(**given, nbest=flags["nbest"]), given, beam_known=False)
    for name, what in (("input", "sentences"), ("prefix", "target prefixes")):
        path = flags[name]
        if path and (os.path.isdir(path) or not os.path.exists(path)):
            found = "a directory" if os.path.isdir(path) else "no such file"
            raise ValueError(f"--{name}={path}: {found}; give a file of {what}")
    if flags["prefix"] and flags["input"]:
        # Known only for regular files: a pipe's length is checked as its lines are read.
        lines = count_lines(flags["input"]), count_lines(flags["prefix"])
        if None not in lines and lines[0] != lines[1]:
            raise ValueError(
                f"--prefix={flags['prefix']} has {lines[1]} lines and --input={flags['input']} "
                f"{lines[0]}: give one prefix per input line (an empty line: none)"
            )
    check_alignment_flags(flags)
    outputs = {"--output": flags["output"], "--alignment": flags["alignment"]}
    inputs = {"--input": flags["input"], "--prefix": flags["prefix"]}
    check_output_files(outputs, inputs, flags["workdir"])
    return given


def main(argv: Sequence[str]) -> None:
    flags, _ = parse_flags(list(argv), FLAGS, doc=__doc__, sections=())
    dash_is_standard(flags)
    cli.quiet_libraries()
    given = check_flags(flags, argv)
    outputs = {"--output": flags["output"], "--alignment": flags["alignment"]}
    step, average = checkpoint_choice(flags)
    cache = compilation.use_persistent_cache(flags["compilation_cache"])
    models = saved_searches.OpenedModels(
        flags["workdir"], step, average, flags["params"], cache, flags["matmul_dtype"]
    )
    chosen = step is not None or average > 0
    say(describe_models(flags["workdir"], models.steps, chosen, models.config) + "\n")
    if not flags["input"] and sys.stdin.isatty():  # a person at a terminal: say it waits
        say("type a sentence and press Enter to translate it; Ctrl-D ends\n")
    settings = decode_settings(models.config.decode, given, flags["nbest"])
    tokenizer, max_len = models.tokenizer, models.config.data.max_len
    configs = [read_config(Workdir(path)) for path in flags["workdir"]]
    layer = None
    if flags["alignment"]:  # refused before any line is read
        layer = forced.ensemble_alignment_layer(configs, flags["workdir"], flags["alignment_layer"])
    member_models = [config.model for config in configs]
    check_batch_memory(member_models, tokenizer.vocab_size, settings, max_len, given)

    source = open(flags["input"], "rb") if flags["input"] else sys.stdin.buffer
    prefix_file = open(flags["prefix"], "rb") if flags["prefix"] else None
    progress = None
    try:
        prefixes = prefix_lines(prefix_file, flags["prefix"])
        with Outputs(outputs) as out:
            if flags["output"]:
                progress = Progress(count_lines(flags["input"]) if flags["input"] else None)
            first, truncated, unknown = 0, [], []
            for chunk in read_chunks(source, flags["input"] or "<stdin>", LINES_PER_CHUNK):
                warn_of_long_lines(tokenizer, chunk, first, max_len, truncated, progress)
                chunk_prefixes = take_prefixes(prefixes, len(chunk), first, flags["prefix"])
                warn_of_unknown_prefixes(
                    tokenizer, chunk_prefixes, first, flags["prefix"], unknown, progress
                )
                results = models.translate(
                    chunk,
                    settings,
                    on_batch=progress.update if progress else None,
                    prefixes=chunk_prefixes,
                    first_line=first,
                )
                out.write("--output", format_lines(first, results, settings.nbest))
                if "--alignment" in out:
                    aligned = alignment_lines(
                        models, chunk, results, layer, flags, settings.batch_size, member_models
                    )
                    out.write("--alignment", aligned)
                first += len(chunk)
            if prefix_file is not None and next(prefixes, None) is not None:
                raise ValueError(
                    f"--prefix={flags['prefix']} has more lines than the input's {first}: give "
                    "one prefix per input line"
                )
            out.commit()
        if len(truncated) > MAX_TRUNCATION_WARNINGS:
            if progress:
                progress.end_line()  # the closing warning starts a line of its own
            say(f"warning: {len(truncated)} lines in all were longer than data.max_len\n")
    finally:
        if progress:
            progress.close()
        if source is not sys.stdin.buffer:
            source.close()
        if prefix_file is not None:
            prefix_file.close()


def prefix_lines(stream, name: str) -> Iterator[str]:
    """The prefix file's lines one by one (none without a file), checked as input lines are."""
    if stream is None:
        return iter(())
    return (line for chunk in read_chunks(stream, name, LINES_PER_CHUNK) for line in chunk)


def take_prefixes(prefixes: Iterator[str], count: int, first: int, name: str) -> list[str] | None:
    """The prefixes of the next `count` input lines (None without --prefix).

    Raises:
      ValueError: the prefix file ends first (nothing of this run's output is kept).
    """
    if not name:
        return None
    taken = list(itertools.islice(prefixes, count))
    if len(taken) < count:
        raise ValueError(
            f"--prefix={name} has {first + len(taken)} lines and the input more: give one "
            "prefix per input line (an empty line: none)"
        )
    return taken


def alignment_lines(
    models, chunk: list[str], results, layer: int, flags, batch_size: int, member_models
) -> str:
    """The alignment of each output line to its input line (one line per output line), by
    `layer` (`forced.ensemble_alignment_layer`), in batches of --batch_size kept within the
    memory bound (`member_models`: each model's config)."""
    graphdefs, params = models.load_model()
    sources = [line for line, found in zip(chunk, results) for _ in found]
    outputs = [text for found in results for _, text in found]
    scored = forced.score_pairs(
        graphdefs,
        params,
        models.tokenizer,
        sources,
        outputs,
        batch_size,
        models.config.data.max_len,
        alignment_layer=layer,
        alignment_pieces=flags["alignment_pieces"],
        cut_sources=True,
        models=member_models,
    )
    return "".join(forced.format_links(pair.links) + "\n" for pair in scored)


def check_batch_memory(
    models, vocab_size: int, settings: DecodeSettings, max_len: int, given: dict[str, Any]
) -> None:
    """Refuses a batch size whose searches, `settings.parallel_batches` at once, would need
    more memory than a batch may take (`memory.memory_bound`, by `memory.search_bytes`'
    estimate for sources of data.max_len tokens), before any line is read.

    Raises:
      ValueError: naming --batch_size (or the workdir's config.decode.batch_size), the memory
        it would need and the most that fits.
    """
    # A batch holds at most LINES_PER_CHUNK lines, padded to the power of two above.
    rows = min(settings.batch_size, 1 << (LINES_PER_CHUNK - 1).bit_length())
    width = decode_width(max_len, max_len)
    at_once = settings.parallel_batches
    per_row = at_once * memory.search_bytes(models, vocab_size, settings, 1, width)
    bound = memory.memory_bound()
    if rows * per_row > bound:
        flag = f"--batch_size={settings.batch_size}"
        if "batch_size" not in given:
            flag += " (the workdir's config.decode.batch_size)"
        batches = (
            f"{at_once} batches at once (--parallel_batches) of" if at_once > 1 else "a batch of"
        )
        most = bound // per_row
        fix = f"give --batch_size={most} or less"
        if not most:
            fix = (
                "so would --batch_size=1: lower --parallel_batches, --beam_size or --max_extra_len"
            )
        raise ValueError(
            f"{flag}: {batches} {rows} lines of up to data.max_len={max_len} tokens would need "
            f"{memory.over_bound(rows * per_row)}; {fix}"
        )


def console_main() -> None:
    """`translate-text`, the console script of pyproject.toml. It ends without the interpreter's
    teardown (`cli.run`): a one-line translation is a 2-second command."""
    cli.run(main, teardown=False)


if __name__ == "__main__":
    console_main()
