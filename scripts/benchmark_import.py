r"""translate-import of an OPUS-MT-sized model: its time and memory, and the first line after.

    python -m scripts.benchmark_import [--dir=/tmp/opus_bench] [--json=PATH]

Builds, with transformers and torch (the `interop` extras), a `MarianMTModel` from the config of
Helsinki-NLP/opus-mt-en-de (6 + 6 layers of width 512, 8 heads, feed-forward 2048, SiLU, a
58,101-piece id table: 74M parameters) with random weights, saves it as OPUS-MT's folders are
laid out (config.json, model.safetensors, source.spm, target.spm, vocab.json; the two
SentencePiece models trained here on the synthetic grammar, the id table filled to size), then
runs, each as a user would, in a fresh process:

  translate-import --from=FOLDER --workdir=RUN     wall time and peak memory (max RSS)
  echo LINE | translate-text --workdir=RUN         twice: with a new compilation cache (the
                                                   first command on a machine), then again

and prints one JSON object (and writes it to --json). The untrained model's output means nothing;
the times are the commands' own.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from translate.data import synthetic

# Helsinki-NLP/opus-mt-en-de's config.json (the fields that say what it computes).
OPUS_MT_EN_DE = dict(
    vocab_size=58101,
    decoder_vocab_size=58101,
    d_model=512,
    encoder_layers=6,
    decoder_layers=6,
    encoder_attention_heads=8,
    decoder_attention_heads=8,
    encoder_ffn_dim=2048,
    decoder_ffn_dim=2048,
    activation_function="swish",
    scale_embedding=True,
    static_position_embeddings=True,
    normalize_before=False,
    normalize_embedding=False,
    add_final_layer_norm=False,
    add_bias_logits=False,
    share_encoder_decoder_embeddings=True,
    pad_token_id=58100,
    decoder_start_token_id=58100,
    eos_token_id=0,
    bos_token_id=0,
    forced_eos_token_id=0,
    bad_words_ids=[[58100]],
    max_position_embeddings=512,
    max_length=512,
    num_beams=4,
    dropout=0.1,
    attention_dropout=0.0,
    activation_dropout=0.0,
)
LINE = "The sister opens the bottle ."


def spm_model(texts: list[str]) -> bytes:
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="unigram",
        vocab_size=200,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return model.getvalue()


def write_folder(folder: pathlib.Path) -> int:
    """OPUS-MT's folder of a random opus-mt-en-de-sized model; returns its parameter count."""
    import sentencepiece as spm
    import torch
    import transformers

    size = OPUS_MT_EN_DE["vocab_size"]
    pairs = synthetic.generate_pairs(2000, seed=0)
    models = [spm_model([p[side] for p in pairs]) for side in (0, 1)]
    pieces = ["</s>", "<unk>"]
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in pieces and piece != "<s>":
                pieces.append(piece)
    pieces += [f"▁filler{i}" for i in range(size - 1 - len(pieces))] + ["<pad>"]
    torch.manual_seed(0)
    model = transformers.MarianMTModel(transformers.MarianConfig(**OPUS_MT_EN_DE))
    model.save_pretrained(str(folder))
    for name, data in zip(("source.spm", "target.spm"), models, strict=True):
        (folder / name).write_bytes(data)
    table = {piece: i for i, piece in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(table, ensure_ascii=False), encoding="utf-8")
    return sum(p.numel() for n, p in model.named_parameters() if "embed_positions" not in n)


def timed(argv: list[str], stdin: str = "", env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, this command's own peak RSS in MiB, stdout) in a fresh process."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
                                 text=True)  # fmt: skip
        child.stdin.write(stdin)
        child.stdin.close()
        _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if child.returncode:
            raise SystemExit(f"{' '.join(argv)} failed:\n{err.read()[-2000:]}")
        return wall, usage.ru_maxrss / 1024, out.read()  # ru_maxrss: KiB on Linux


def main(argv: list[str]) -> None:
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv if a.startswith("--"))
    root = pathlib.Path(flags.get("dir", "/tmp/opus_bench"))
    root.mkdir(parents=True, exist_ok=True)
    folder, run = root / "folder", root / "run"
    parameters = None
    if not (folder / "model.safetensors").is_file():
        print(f"writing {folder} ...", file=sys.stderr)
        parameters = write_folder(folder)
    if run.exists():
        raise SystemExit(f"--dir={root}: {run} exists; give a new --dir or remove it")
    python = sys.executable
    import_s, import_mib, _ = timed(
        [python, "-m", "translate.import_model", f"--from={folder}", f"--workdir={run}"]
    )
    env = {**os.environ, "TRANSLATE_COMPILATION_CACHE": str(root / "xla")}
    text = [python, "-m", "translate.translate_text", f"--workdir={run}"]
    first_s, first_mib, output = timed(text, LINE + "\n", env)
    again_s, again_mib, _ = timed(text, LINE + "\n", env)
    weights = (folder / "model.safetensors").stat().st_size
    result = {
        "parameters": parameters,
        "folder_safetensors_mib": round(weights / 2**20, 1),
        "import_seconds": round(import_s, 2),
        "import_peak_rss_mib": round(import_mib),
        "text_first_line_seconds_new_cache": round(first_s, 2),
        "text_first_line_seconds_again": round(again_s, 2),
        "text_peak_rss_mib": round(max(first_mib, again_mib)),
        "output_lines": output.count("\n"),
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if "json" in flags:
        pathlib.Path(flags["json"]).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
