"""What a run evaluates and keeps: dev BLEU, the best checkpoint, the final parameters (the
mean of the newest checkpoints, Sec. 6.1), the test report and the training curves.

The trainer (training/trainer.py) calls these at its intervals and at its end.
"""

from __future__ import annotations

import logging
from typing import Any

import jax

from translate import checkpoint, sharding
from translate.config import Config
from translate.data.sources import Data
from translate.decoding.report import translate_and_score, write_report
from translate.decoding.settings import decode_settings
from translate.trained import mean_params, write_params_workdir
from translate.workdir import Workdir, config_text

log = logging.getLogger("translate")


def write_test_report(
    workdir: Workdir,
    report: dict[str, Any],
    sources: list[str],
    references: list[str],
    hypotheses: list[str],
) -> dict[str, Any]:
    """Writes the run's report files (process 0) and logs the scores; returns the report."""
    if jax.process_index() == 0:
        write_report(workdir.path, report, sources, references, hypotheses)
        log.info(
            "test: sacreBLEU %.2f (%s), tokenized BLEU %.2f (the paper's metric), chrF %.2f; "
            "report in %s",
            report["bleu"],
            report["signature"],
            report["tokenized_bleu"],
            report["chrf"],
            workdir.report_json,
        )
    return report


def save_best(
    manager, config: Config, workdir: Workdir, data: Data, params, ema, step: int, bleu: float
) -> None:
    """Keeps `params` (and their moving average `ema`, when the run keeps one) as the
    workdir's best checkpoint (`train.keep_best_by`), replacing the last.

    best/ is a workdir of its own, so every command that reads a workdir reads it. Orbax
    writes the step beside and renames it when whole, then deletes the one it replaces.
    """
    best = Workdir(workdir.best)
    meta = {"step": step, "dev_bleu": bleu, "vocab_sha256": data.tokenizer.sha256}
    try:
        written = write_params_workdir(
            best, config_text(config), workdir, manager, step, params, meta, ema
        )
    except Exception as e:
        then = "make room, and the same command resumes (it keeps the best from then on)"
        if error := checkpoint.write_error(e, best.checkpoints, step, manager.all_steps(), then):
            raise error from e
        raise
    if not written:  # kept before this run resumed; the same parameters
        return
    log.info("kept step %d as the best by dev BLEU (%.2f) in %s", step, bleu, best.path)


def draw_training_curves(workdir: Workdir) -> None:
    """Draws the run's curves into its workdir; a failure is a warning, never the run's end."""
    try:
        # Imported here: matplotlib takes seconds to import, and only the end of a run draws.
        from translate.training.plots import draw_training_curves as draw

        written = draw(workdir)
    except Exception as e:  # noqa: BLE001 - pictures are a convenience, the run is done
        log.warning("WARNING: could not draw the training curves: %s: %s", type(e).__name__, e)
        return
    log.info("training curves: %s", ", ".join(str(p) for p in written))


def final_params(
    config: Config, manager, params, step: int, abstract_params, grid=None
) -> tuple[Any, list[int]]:
    """The parameters the final evaluation decodes, and the training steps they come from.

    With `decode.average_last` = N > 1, the mean of the newest N saved checkpoints on the grid
    (every `train.checkpoint_every_steps`, and this last step), read as
    scripts/average_checkpoints.py reads them (translate.checkpoint): the same steps whether or
    not a stop signal saved others; else `params`, the last step's own. A run that holds fewer
    than N checkpoints (some set aside as unreadable) averages those it has, and says so.

    Args:
      manager: the run's checkpoint manager, its saves finished.
      params: the parameters after the last step, on the mesh.
      step: the last step.
      abstract_params: the parameters' shapes and shardings on the mesh (restore targets).
      grid: the run's `checkpoint.KeepOnGrid`; default the config's.
    """
    num = config.decode.average_last
    if num == 1:
        return params, [step]
    t = config.train
    grid = grid or checkpoint.KeepOnGrid(t.keep_checkpoints, t.checkpoint_every_steps, step)

    def among(saved_step: int) -> bool:
        return grid.on_grid(saved_step) or saved_step == step

    saved = [s for s in manager.all_steps() if among(s)]
    if len(saved) < num:
        log.warning(
            "WARNING: --config.decode.average_last=%d, but %s holds only %d checkpoints %s; "
            "averaging those",
            num,
            manager.directory,
            len(saved),
            sorted(saved),
        )
        num = len(saved)
    steps = checkpoint.steps_to_average(manager, num, config.train.keep_checkpoints, among)
    # The mean of the moving averages (of those that hold one) when the run keeps them.
    choice = "auto" if config.train.ema_decay else "raw"
    warn = lambda line: log.warning("WARNING: %s", line)  # noqa: E731
    return mean_params(manager, steps, abstract_params, choice, log=warn), steps


def dev_bleu(graphdef, params, data: Data, config: Config, step: int) -> dict[str, float]:
    """BLEU on the first `decode.eval_num_sentences` dev sentences (none for a language model)."""
    if not data.translations:
        return {}
    sources, references = data.dev_text
    n = config.decode.eval_num_sentences or len(sources)
    host_params = sharding.local_copy(params)
    settings = decode_settings(config.decode)
    report, _ = translate_and_score(
        (graphdef,),
        (host_params,),
        data.tokenizer,
        config,
        settings,
        sources[:n],
        references[:n],
        step,
    )
    return {
        "eval/bleu": report["bleu"],
        "eval/tokenized_bleu": report["tokenized_bleu"],
        "eval/chrf": report["chrf"],
    }
