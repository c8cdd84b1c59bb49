r"""Import a Marian model from a Hugging Face folder as a workdir: the import command.

    translate-import --from=FOLDER --workdir=DIR [--src_lang=en --tgt_lang=de]

(or `python -m translate.import_model ...`) reads FOLDER as transformers' `save_pretrained`
writes a `MarianMTModel` (config.json, model.safetensors or pytorch_model.bin) with our
SentencePiece model beside it (vocab.model, as translate-export writes it), and writes DIR, a
new workdir at step 0 that every command takes as a trained run: translate-text,
translate-evaluate, translate-score, translate-export, and training from it through
`train.init_from`. Every field of config.json is mapped exactly or refused in one line, and
nothing is left in DIR unless the import is whole (translate/pretrained/marian.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

from translate import cli
from translate.flags import Flag, parse_flags
from translate.pretrained.marian import import_marian

_imports_done()

FLAGS = {
    "from": Flag("", "Required. The folder of the Marian model (config.json and its weights)."),
    "workdir": Flag("", "Required. The workdir to write: a new or empty directory."),
    "src_lang": Flag("", "The source language the config records (default: the config's)."),
    "tgt_lang": Flag("", "The target language the config records (default: the config's)."),
}


def main(argv: Sequence[str]) -> None:
    cli.quiet_libraries()
    flags, _ = parse_flags(list(argv), FLAGS, doc=__doc__, sections=())
    for name in ("from", "workdir"):
        if not flags[name]:
            raise SystemExit(f"--{name} is required: translate-import --from=FOLDER --workdir=DIR")
    if bool(flags["src_lang"]) != bool(flags["tgt_lang"]):
        raise SystemExit("--src_lang and --tgt_lang go together: give both or neither")
    languages = (flags["src_lang"], flags["tgt_lang"]) if flags["src_lang"] else ()
    config = import_marian(flags["from"], flags["workdir"], languages)
    m = config.model
    print(
        f"wrote {flags['workdir']}: {m.num_layers}+{m.num_layers} layers, d_model {m.d_model}, "
        f"{config.data.vocab_size} pieces, {config.data.src_lang}->{config.data.tgt_lang}, "
        f"from {flags['from']}"
    )


def console_main() -> None:
    """`translate-import`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
