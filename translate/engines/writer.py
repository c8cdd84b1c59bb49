"""Exports a workdir's model for another engine: the checks, then a directory written whole.

An export directory holds the format's own files (ctranslate2.py, huggingface.py),
our `vocab.model` (the engines take SentencePiece pieces or ids; neither tokenizes), and
`translate-export.json`, which marks the directory as an export of ours and lists the files
the export wrote: a later export may replace such a directory, and nothing else. Files a user
added to it since (a README, a script) are carried into the new export, said in one line; an
export directory that a training run has written into since is refused (training refuses an
export as its workdir, too). Everything is checked before the parameters are read, and the
directory is written beside its place and renamed into it once whole (atomic.directory), so a
failed export leaves what was there.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import importlib.util
import json
import logging
import os
import pathlib
import shutil
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from flax import nnx

from translate import atomic, provenance
from translate.config import Config
from translate.engines import ctranslate2, huggingface
from translate.engines.shared import NUM_POSITIONS
from translate.models.positions import position_scheme
from translate.trained import load_ensemble, parameters_read
from translate.workdir import (
    EXPORT_MARKER,
    Workdir,
    check_output_path,
    enclosing_run,
    read_config,
)

# --format's names and their modules. Each module gives the same interface: PACKAGE and
# INSTALL (the package its writer needs), QUANTIZATIONS and QUANTIZATION_PACKAGES (what a
# quantization's conversion needs beyond PACKAGE), unsupported_reason(config),
# record_fields(config) and write(model, config, tokenizer, directory, quantization).
FORMATS: dict[str, ModuleType] = {"ctranslate2": ctranslate2, "huggingface": huggingface}
log = logging.getLogger("translate")

MARKER = EXPORT_MARKER


def check_request(config: Config, workdir: str, output: str, fmt: str, quantization: str) -> None:
    """Refuses a format, quantization or model that cannot be exported, naming the flag."""
    if fmt not in FORMATS:
        raise ValueError(f"--format={fmt}: give " + " or ".join(f"--format={f}" for f in FORMATS))
    if not output:
        raise ValueError("--output is required: the directory to write the export into")
    quantizations = FORMATS[fmt].QUANTIZATIONS
    if quantization and not quantizations:
        takers = " or ".join(f"--format={f}" for f, m in FORMATS.items() if m.QUANTIZATIONS)
        raise ValueError(f"--quantization={quantization}: only {takers} takes it")
    if quantization and quantization not in quantizations:
        raise ValueError(f"--quantization={quantization}: one of " + ", ".join(quantizations))
    reason = FORMATS[fmt].unsupported_reason(config.model)
    if reason:
        raise ValueError(f"--format={fmt} cannot export --workdir={workdir}: {reason}")
    # Sources of data.max_len pieces (and EOS) must find their positions in the exported table:
    # past it CTranslate2 cut them silently or raised, and transformers raised IndexError.
    if config.data.max_len > NUM_POSITIONS:
        raise ValueError(
            f"--workdir={workdir}: data.max_len={config.data.max_len} is more than the "
            f"{NUM_POSITIONS} positions an export embeds (CTranslate2's position table, "
            "transformers' max_position_embeddings); train with data.max_len <= "
            f"{NUM_POSITIONS} to export"
        )
    # A decoder-only model reads `x EOS BOS y` as one sequence (models/decoder_only.py): with
    # each side at most data.max_len tokens, EOS included, its positions run to 2 * max_len - 1,
    # and a table of added (sinusoidal) positions must hold them all. Positions that act in
    # attention (rotary, relative) are CTranslate2's own computation, with no table to outgrow.
    pair = 2 * config.data.max_len
    if (
        config.model.architecture == "decoder_only"
        and position_scheme(config.model).added
        and pair > NUM_POSITIONS
    ):
        raise ValueError(
            f"--workdir={workdir}: data.max_len={config.data.max_len} needs {pair} positions "
            "for a decoder-only model's source and target together, more than the "
            f"{NUM_POSITIONS} of the exported sinusoidal position table; train with "
            f"data.max_len <= {NUM_POSITIONS // 2}, or rotary or relative positions, to export"
        )


def check_output(output: str | os.PathLike, workdir: str | os.PathLike) -> None:
    """Refuses an --output whose replacement would lose anything but an earlier export of ours.

    Refused: what `workdir.check_output_path` refuses (the workdir itself or a directory
    holding it, a file, a training run, a path inside any run's or export's own files); a path
    inside one of the own files or directories (checkpoints/, best/, evaluations/, ...) of the
    workdir or of the training run that the path lies in; a non-empty directory without our
    marker. A new path, an empty directory or an earlier export may be written.
    """
    out, run = pathlib.Path(os.path.realpath(output)), pathlib.Path(os.path.realpath(workdir))
    check_output_path(output, "--output", [workdir], directory=True, instead="give a new directory")
    # Stricter than for a report: nowhere among a run's own entries (evaluations/ too), the
    # --workdir's or those of the training run that --output lies in.
    found = enclosing_run(out)
    for other in [run] + ([found.path] if found and not found.is_export() else []):
        if other in out.parents:
            first = out.relative_to(other).parts[0]
            if first in Workdir(other).entry_names():
                which = "--workdir's" if other == run else f"the training run {other}'s"
                raise ValueError(
                    f"--output={output} is inside {which} own {first}; give a new directory "
                    f"(e.g. {other / 'export'})"
                )
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise ValueError(
            f"--output={output} holds files that no translate-export wrote (no {MARKER}); "
            "nothing was overwritten: give a new or empty directory"
        )
    if out.is_dir() and (trained := Workdir(out).holds_training_files()):
        raise ValueError(
            f"--output={output} is an earlier export that a training run has written into "
            f"since ({', '.join(trained)}); replacing it would delete that run: move the run "
            "away or give a new directory (nothing was overwritten)"
        )


def check_dependency(fmt: str, quantization: str = "") -> None:
    """Refuses, in one line and before anything is written, a format whose writer's package
    is not installed, or a quantization whose conversion needs a package that is not."""
    module = FORMATS[fmt]
    try:
        importlib.import_module(module.PACKAGE)
    except ImportError:
        raise ValueError(
            f"--format={fmt} needs the {module.PACKAGE} package, which is not installed: "
            f"{module.INSTALL} (or pip install '.[export]')"
        ) from None
    needed = module.QUANTIZATION_PACKAGES.get(quantization)
    # Looked up, not imported: torch takes seconds to import.
    if needed and importlib.util.find_spec(needed) is None:
        others = [q for q in module.QUANTIZATIONS if q not in module.QUANTIZATION_PACKAGES]
        raise ValueError(
            f"--quantization={quantization} needs the {needed} package to convert the weights, "
            f"which is not installed: pip install {needed}, or give one of " + ", ".join(others)
        )


def export(
    workdir: str,
    output: str,
    fmt: str,
    step: int | None = None,
    average: int = 0,
    quantization: str = "",
    params: str = "auto",
) -> dict[str, Any]:
    """Writes the model of `workdir` (at `step`, or the mean of its newest `average`
    checkpoints; `params` as trained.load_model's) in format `fmt` to the directory `output`;
    returns what the marker records.

    Raises:
      ValueError, OSError: a user's mistake, in one line naming the flag (see the checks above
        and trained.load_ensemble).
    """
    if (pathlib.Path(workdir) / MARKER).is_file():
        raise ValueError(
            f"--workdir={workdir} is an export ({MARKER}), not a training workdir; give the "
            "workdir it was exported from"
        )
    config = read_config(Workdir(workdir))
    check_request(config, workdir, output, fmt, quantization)
    check_output(output, workdir)
    check_dependency(fmt, quantization)
    for left in atomic.remove_stale(output, "new"):
        log.warning("removed %s, the partial copy that a killed export left beside it", left)
    with writing(output) as tmp:
        record = write_export(workdir, fmt, step, average, quantization, tmp, output, params)
        try:
            carry_added_files(pathlib.Path(output), tmp)
        except OSError as e:
            raise OSError(
                e.errno,
                f"could not copy the files added to the earlier export ({e.strerror or e}); "
                "nothing at --output changed",
                f"--output={output}",
            ) from None
        return record


def carry_added_files(output: pathlib.Path, tmp: pathlib.Path) -> None:
    """Copies into the new export `tmp` what a user added to the earlier one at `output`:
    every entry that neither the earlier export (its marker's list) nor the new one wrote."""
    if not (output / MARKER).is_file():
        return
    try:
        written = set(json.loads((output / MARKER).read_text(encoding="utf-8"))["files"])
    except (OSError, ValueError, KeyError, TypeError):
        written = set()  # an export older than the list: keep all it holds that is not new
    added = sorted(
        p.name for p in output.iterdir() if p.name not in written and not (tmp / p.name).exists()
    )
    for name in added:
        if (output / name).is_dir() and not (output / name).is_symlink():
            shutil.copytree(output / name, tmp / name, symlinks=True)
        else:
            shutil.copy2(output / name, tmp / name, follow_symlinks=False)
    if added:
        log.warning("kept what the earlier export did not write: %s", ", ".join(added))


@contextlib.contextmanager
def writing(output: str) -> Iterator[pathlib.Path]:
    """atomic.directory(output), with a place that cannot be written refused in one line
    before anything is read."""
    target = pathlib.Path(output)
    stack = contextlib.ExitStack()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = stack.enter_context(atomic.directory(target))
    except OSError as e:
        raise OSError(f"--output={output}: cannot write a directory there ({e.strerror})") from None
    with stack:
        yield tmp


def write_export(
    workdir: str,
    fmt: str,
    step: int | None,
    average: int,
    quantization: str,
    tmp: pathlib.Path,
    output: str = "",
    params: str = "auto",
) -> dict[str, Any]:
    """Loads the model and writes the export's files into the empty directory `tmp`, which
    will become `output` (named in an error)."""
    graphdefs, loaded, tokenizer, config, steps = load_ensemble(
        [workdir], step, average, params=params
    )
    model = nnx.merge(graphdefs[0], loaded[0])
    found = provenance.git_commit()
    record = {
        "format": fmt,
        "workdir": os.path.realpath(workdir),
        "steps": list(steps[0]),
        # The moving average of the parameters (train.ema_decay), or the parameters themselves.
        "parameters": parameters_read([workdir], steps, params) or "raw",
        "quantization": quantization or "float32",
        "architecture": config.model.architecture,
        "norm_position": config.model.norm_position,
        "layer_norm_epsilon": float(model.decoder[0].norm1.epsilon),
        "exported": datetime.datetime.now().isoformat(timespec="seconds"),
        "commit": found["commit"] if found else None,
    }
    record.update(FORMATS[fmt].record_fields(config.model))
    try:
        FORMATS[fmt].write(model, config.model, tokenizer, tmp, quantization)
        for path in tokenizer.files:  # unless the format wrote its own (huggingface's vocab.json)
            if not (tmp / path.name).exists():
                shutil.copyfile(path, tmp / path.name)
        record["files"] = sorted([p.name for p in tmp.iterdir()] + [MARKER])
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
    except OSError as e:  # a full disk, say, inside the engine's converter
        raise OSError(
            e.errno,
            f"could not write the export ({e.strerror or e}); nothing at --output changed",
            f"--output={output}",
        ) from None
    return record
