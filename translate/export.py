r"""Export a trained model to CTranslate2 or Hugging Face transformers: the export command.

    translate-export --workdir=DIR --format=ctranslate2 --output=OUT [--quantization=int8] \
        [--step=N | --average=N]
    translate-export --workdir=DIR --format=huggingface --output=OUT [--step=N | --average=N]

(or `python -m translate.export ...`) writes OUT whole: the engine's model files, the workdir's
vocab.model and translate-export.json (what was exported, from where). An encoder-decoder exports
to both formats (transformers' Marian layout for post-LayerNorm, Pegasus for pre-LayerNorm); a
causal decoder-only model to CTranslate2 (a Generator). An OUT that exists must be an earlier
export, which is replaced, or an empty directory. docs/translating.md translates with the
result in five lines and says how it agrees with ours.
"""

from __future__ import annotations

from collections.abc import Sequence

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

from translate import cli
from translate.engines.writer import export
from translate.flags import Flag, checkpoint_choice, checkpoint_flags, parse_flags

_imports_done()

FLAGS = {
    "workdir": Flag("", "Required. A training workdir (or one written by average_checkpoints)."),
    **checkpoint_flags("export"),
    "format": Flag("", "Required. ctranslate2 or huggingface."),
    "output": Flag("", "Required. The directory to write; an earlier export there is replaced."),
    "quantization": Flag(
        "",
        "CTranslate2 only: the stored weights' type (int8, int8_float32, int8_float16, "
        "int8_bfloat16, int16, float16, bfloat16, float32); empty keeps float32.",
    ),
}


def main(argv: Sequence[str]) -> None:
    cli.quiet_libraries()
    flags, _ = parse_flags(list(argv), FLAGS, doc=__doc__, sections=())
    for name in ("workdir", "format", "output"):
        if not flags[name]:
            raise SystemExit(
                f"--{name} is required: translate-export --workdir=DIR "
                "--format=ctranslate2|huggingface --output=OUT"
            )
    if flags["average"] < 0:
        raise SystemExit(f"--average={flags['average']}: must be >= 0 (0: no averaging)")
    step, average = checkpoint_choice(flags)
    record = export(
        flags["workdir"],
        flags["output"],
        flags["format"],
        step,
        average,
        flags["quantization"],
        flags["params"],
    )
    steps = record["steps"]
    which = f"step {steps[0]}" if len(steps) == 1 else f"the mean of steps {steps}"
    kind = record.get("model_class") or f"{record['quantization']} weights"
    print(f"wrote {flags['output']}: {flags['format']} ({kind}), {which} of {flags['workdir']}")


def console_main() -> None:
    """`translate-export`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
