"""Fetch the public data the recipes read: Multi30k, and the benchmarks' WMT sample.

    translate-data multi30k --dir=data/multi30k
    translate-data wmt_sample --dir=data/wmt_sample
    translate-data multi30k --dir=data/multi30k --from=COPIES   (offline: files copied in)

(`python -m translate.translate_data`.) Downloads each file from the dataset's public repository
at a pinned commit (translate/data/fetch.py), decompresses it and checks its sha256 before
writing it whole into --dir; a damaged, partial or other file is refused with its name and never
used. A file already in --dir with the right sha256 is kept. Then, for example:

    translate-train --config=multi30k --workdir=/tmp/multi30k --config.data.dir=data/multi30k
"""

from __future__ import annotations

from collections.abc import Sequence

from translate import cli
from translate.cli import Flag, parse_flags
from translate.data.fetch import DATASETS, fetch

FLAGS = {
    "dir": Flag("", "Required. The directory the files go in (made if needed)."),
    "from": Flag("", "A directory holding the files already (offline), instead of downloading."),
}


def main(argv: Sequence[str]) -> None:
    names = [arg for arg in argv if not arg.startswith("-")]
    flags, _ = parse_flags(
        [arg for arg in argv if arg.startswith("-")], FLAGS, doc=__doc__, sections=()
    )
    if len(names) != 1:
        raise ValueError(f"give one dataset: {' or '.join(sorted(DATASETS))} (--help says more)")
    if not flags["dir"]:
        raise ValueError("--dir is required: the directory the files go in")
    fetch(names[0], flags["dir"], flags["from"] or None)


def console_main() -> None:
    """`translate-data`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
