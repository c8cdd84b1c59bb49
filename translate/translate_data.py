"""Fetch the public data the recipes read: Multi30k, and the benchmarks' WMT sample.

    translate-data multi30k --dir=data/multi30k
    translate-data wmt_sample --dir=data/wmt_sample
    translate-data multi30k --dir=data/multi30k --from=COPIES   (offline: files copied in)

(`python -m translate.translate_data`.) Downloads each file from the dataset's public repository
at a pinned commit (translate/data/fetch.py), decompresses it and checks its sha256 before
writing it whole into --dir; a damaged, partial or other file is refused with its name and never
used. A file already in --dir with the right sha256 is kept. Any other file there under a
dataset file's name (edited by hand, another dataset's train.en, a symbolic link) stops the
command before anything is written; --force replaces it (a link itself, never its file). --dir is
never a training run or inside one's own files (its data/, checkpoints/), with --force or without;
two translate-data into one --dir take turns. Then, for example:

    translate-train --config=multi30k --workdir=/tmp/multi30k --config.data.dir=data/multi30k
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Sequence

from translate import cli
from translate.data.fetch import DATASETS, fetch
from translate.flags import Flag, parse_flags
from translate.workdir import check_output_path

FLAGS = {
    "dir": Flag("", "Required. The directory the files go in (made if needed)."),
    "from": Flag("", "A directory holding the files already (offline), instead of downloading."),
    "force": Flag(
        False,
        "Replace what --dir holds under a dataset file's name that is not the recorded file (a "
        "file edited by hand, another dataset's, a symbolic link: the link itself, never the "
        "file it points to). Without it such a file stops the command, nothing written.",
    ),
}


def split_arguments(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(dataset names, flag arguments): a flag's value may be the next argument (`--dir DIR`),
    which is then the flag's and not a name, as `parse_flags` reads it."""
    names, flags = [], []
    position = 0
    while position < len(argv):
        arg = argv[position]
        position += 1
        if not arg.startswith("-"):
            names.append(arg)
            continue
        flags.append(arg)
        name, has_value, _ = arg[2:].partition("=")
        if not arg.startswith("--") or has_value or name not in FLAGS or position == len(argv):
            continue
        following = argv[position]
        if isinstance(FLAGS[name].default, bool):
            takes = following.lower() in cli._BOOL_WORDS  # a bool flag's optional value
        else:
            takes = not following.startswith("--")
        if takes:
            flags.append(following)
            position += 1
    return names, flags


def tell(line: str) -> None:
    """Prints a line of progress; a standard output that is closed or whose reader went away
    (`| head -1`) loses it and the lines after it, never the files being fetched."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        # What stayed in the buffer would fail again at exit, with a traceback and status 120:
        # point the descriptor at /dev/null instead, so that it drains there.
        with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


def check_dir(name: str, directory: str) -> None:
    """Refuses a --dir, or a dataset file's path in it, that a run owns or that is a run
    (translate/workdir.py, `check_output_path`), before anything is read or written."""
    instead = "give another --dir"
    check_output_path(directory, "--dir", [], directory=True, instead=instead)
    for file in DATASETS.get(name, []):
        target = os.path.join(directory, file.name)
        check_output_path(target, "--dir", [], directory=False, instead=instead)


def main(argv: Sequence[str]) -> None:
    names, flag_arguments = split_arguments(argv)
    flags, _ = parse_flags(flag_arguments, FLAGS, doc=__doc__, sections=())
    if len(names) != 1:
        raise ValueError(f"give one dataset: {' or '.join(sorted(DATASETS))} (--help says more)")
    if not flags["dir"]:
        raise ValueError("--dir is required: the directory the files go in")
    check_dir(names[0], flags["dir"])
    fetch(names[0], flags["dir"], flags["from"] or None, log=tell, force=flags["force"])


def console_main() -> None:
    """`translate-data`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
