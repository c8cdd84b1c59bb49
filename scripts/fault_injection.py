r"""Kill a training run at chosen moments, resume it, and compare it with an uninterrupted run.

    python -m scripts.fault_injection --config=configs/tiny.py --kills=6 --seed=0 \
        [--workdir=/tmp/faults] [--signals=alternate|kill|term] [--max_delay=2.0] \
        [--config.train.num_train_steps=600 ...]

The reference run trains to the end without interruption. The faulty run is started and killed
`--kills` times, each time with the same command, then allowed to finish. Kills alternate
between SIGKILL and SIGTERM (or use one of them, `--signals`), and cycle through three moments:
- `train`: a random delay (up to `--max_delay` s) after the attempt's first new training step;
- `save`: as soon as the trainer says a checkpoint is being written (its write is in flight);
- `eval`: as soon as a dev evaluation starts.
Each kill is reported with the steps trained before it and whether it landed where it was aimed;
a kill that lands after training ended does not count. The script compares every parameter bit
for bit and the final reports, and ends with `landed: K of N` and `identical: true|false`; the
exit status is 0 only when every kill landed mid-training and the runs are identical.
"""

from __future__ import annotations

import json
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import NamedTuple

import numpy as np

from translate import cli
from translate.flags import Flag, parse_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent

# For configs/tiny.py: enough steps that ten kills all land before the end, checkpoints often
# enough that kills land between them as well as on them, and dev evaluations to kill.
DEFAULT_OVERRIDES = {
    "train.num_train_steps": "600",
    "train.checkpoint_every_steps": "10",
    "train.eval_every_steps": "50",
    "train.log_every_steps": "1",
}
MOMENTS = ("train", "save", "eval")
STEP_LINE = re.compile(r" step (\d+)/\d+ ")
SAVE_LINE = re.compile(r"saving the checkpoint of step (\d+)")
EVAL_START = re.compile(r"evaluating at step (\d+)")


def train_command(config: str, workdir: pathlib.Path, overrides: dict[str, str]) -> list[str]:
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    command = [sys.executable, "-m", "translate.train", f"--config={config}"]
    return [*command, f"--workdir={workdir}", *flags]


def run_to_end(command: list[str]) -> str:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done.stderr


class Kill(NamedTuple):
    """What one kill did: where it was aimed, where it landed, and what the trainer said."""

    signum: signal.Signals
    moment: str
    landed: bool  # during training (not after the run ended), at the moment aimed for
    where: str  # in words
    output: str


def run_and_kill(
    command: list[str], signum: signal.Signals, moment: str, delay: float, checkpoints: pathlib.Path
) -> Kill:
    """Starts training and sends `signum` at `moment` of this attempt (see the module doc)."""
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    trained = threading.Event()  # a training step of this attempt has finished
    fired = threading.Event()
    mark: dict[str, float] = {}

    def fire():
        if not fired.is_set():
            mark["alive"] = process.poll() is None
            mark["sent_at"] = time.monotonic()
            if mark["alive"]:
                process.send_signal(signum)
            fired.set()

    def read():
        pattern = {"save": SAVE_LINE, "eval": EVAL_START}.get(moment)
        for line in process.stderr:
            lines.append(line)
            if found := STEP_LINE.search(line):
                mark.setdefault("first_step", int(found.group(1)))
                mark["step"] = int(found.group(1))
                trained.set()
            # Sent from here, the moment the line is read: a save of the tiny model is brief.
            if pattern and trained.is_set() and (found := pattern.search(line)):
                mark.setdefault("at", int(found.group(1)))
                fire()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    event = trained if moment == "train" else fired
    while not event.wait(0.05) and process.poll() is None:
        pass
    if moment == "train" and process.poll() is None:
        time.sleep(delay)
    fire()  # does nothing if the reader fired already
    try:
        process.wait(timeout=60)  # a SIGTERM must end the run within 60 s
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        lines.append("did not stop within 60 s of the signal\n")
    stopped_in = time.monotonic() - mark["sent_at"]
    left = sorted(p.name for p in checkpoints.glob("*.orbax-checkpoint-tmp*"))
    reader.join(timeout=5)
    output = "".join(lines)
    ended_by_signal = process.returncode in (-signum, 128 + signum)
    landed = mark["alive"] and ended_by_signal and trained.is_set()
    steps = f"steps {mark.get('first_step', '-')}..{mark.get('step', '-')} logged in this attempt"
    if not landed or (moment != "train" and "at" not in mark):
        return Kill(signum, moment, False, f"did not land mid-training ({steps})", output)
    if moment == "eval":
        landed = f"eval at step {mark['at']}:" not in output
        where = f"during the dev evaluation of step {mark['at']}" + (
            "" if landed else " (which finished first)"
        )
    elif moment == "save":
        where = f"at the save of step {mark['at']}"
        if signum == signal.SIGKILL:
            where += (
                f", whose write was in flight (left {left[0]})"
                if left
                else ", whose write had finished"
            )
    else:
        where = f"{delay:.2f} s into training"
    if signum == signal.SIGTERM:
        where += f"; stopped {stopped_in:.1f} s after the signal"
    return Kill(signum, moment, landed, f"{where} ({steps})", output)


def compare(reference: pathlib.Path, faulty: pathlib.Path) -> list[tuple[str, bool]]:
    """(what, equal) for the parameters, the report's scores and the hypotheses."""
    import jax

    from translate import checkpoint
    from translate.trained import load_model
    from translate.workdir import Workdir

    results = []
    # The parameters, and their moving average when the run keeps one (train.ema_decay).
    choices = {"raw": "parameter arrays"}
    ref_step = checkpoint.latest_step(Workdir(reference).checkpoints)
    if ref_step is not None and checkpoint.holds_ema(Workdir(reference).checkpoints, ref_step):
        choices["ema"] = "moving-average arrays"
    for choice, what in choices.items():
        _, ref_params, _, _, ref_step = load_model(reference, params=choice)
        _, got_params, _, _, got_step = load_model(faulty, params=choice)
        leaves = list(zip(jax.tree.leaves(ref_params), jax.tree.leaves(got_params)))
        same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in leaves)
        if choice == "raw":
            results.append((f"final step ({ref_step} and {got_step})", ref_step == got_step))
        results.append((f"{len(leaves)} {what}, bit for bit", same))
    ref_report = json.loads((reference / "report.json").read_text())
    got_report = json.loads((faulty / "report.json").read_text())
    for key in ("bleu", "chrf", "num_sentences", "step"):
        ref, got = ref_report[key], got_report[key]
        results.append((f"report {key} ({ref} and {got})", ref == got))
    hypotheses = [(run / "hypotheses.txt").read_bytes() for run in (reference, faulty)]
    results.append(("hypotheses.txt", hypotheses[0] == hypotheses[1]))
    return results


def plan_kills(kills: int, signals: str, seed: int) -> list[tuple[signal.Signals, str]]:
    """(signal, moment) per kill: moments cycle train, save, eval; signals alternate."""
    rng = random.Random(seed)
    first = rng.randrange(2)
    choice = {"kill": [signal.SIGKILL], "term": [signal.SIGTERM]}.get(
        signals, [signal.SIGKILL, signal.SIGTERM]
    )
    return [(choice[(i + first) % len(choice)], MOMENTS[i % len(MOMENTS)]) for i in range(kills)]


def main(argv: list[str]) -> int:
    flags, overrides = parse_flags(
        argv,
        {
            "config": Flag("configs/tiny.py", "The config both runs train."),
            "kills": Flag(6, "How many times the faulty run is killed and restarted."),
            "seed": Flag(0, "Seed of the first signal and of the kill delays."),
            "workdir": Flag("", "Directory for the two runs; default a new temporary one."),
            "max_delay": Flag(2.0, "Longest wait, in seconds after a first new step, to a kill."),
            "signals": Flag("alternate", "alternate (SIGKILL, SIGTERM), kill or term."),
        },
        doc=__doc__,
    )
    if flags["signals"] not in ("alternate", "kill", "term"):
        raise SystemExit(f"--signals={flags['signals']}: must be alternate, kill or term")
    if flags["kills"] < 0 or flags["max_delay"] < 0:
        raise SystemExit("--kills and --max_delay must be >= 0")
    overrides = {**DEFAULT_OVERRIDES, **overrides}
    base = pathlib.Path(flags["workdir"] or tempfile.mkdtemp(prefix="faults-"))
    # Only runs this script made are replaced: `--workdir` may name a directory of real runs.
    marker = base / "fault_injection.txt"
    for name in ("reference", "faulty"):
        if (base / name).exists() and not marker.is_file():
            raise SystemExit(
                f"{base / name} exists and was not made by this script: not deleting it; "
                "choose another --workdir"
            )
        shutil.rmtree(base / name, ignore_errors=True)
    base.mkdir(parents=True, exist_ok=True)
    marker.write_text("reference/ and faulty/ here are made (and replaced) by fault_injection.py\n")
    rng = random.Random(flags["seed"])

    print(f"reference run: {base / 'reference'}", flush=True)
    run_to_end(train_command(flags["config"], base / "reference", overrides))
    faulty = train_command(flags["config"], base / "faulty", overrides)
    checkpoints = base / "faulty" / "checkpoints"
    kills = []
    for i, (signum, moment) in enumerate(
        plan_kills(flags["kills"], flags["signals"], flags["seed"])
    ):
        kill = run_and_kill(
            faulty, signum, moment, rng.uniform(0.0, flags["max_delay"]), checkpoints
        )
        kills.append(kill)
        resumed = re.search(r"resumed from step (\d+)", kill.output)
        print(
            f"kill {i + 1}: {signum.name} aimed at {moment}: "
            f"{'landed' if kill.landed else 'MISSED'} {kill.where}; "
            f"{'resumed from step ' + resumed.group(1) if resumed else 'started fresh'}",
            flush=True,
        )
    run_to_end(faulty)
    results = compare(base / "reference", base / "faulty")
    for what, equal in results:
        print(f"  {'same' if equal else 'DIFFERENT'}: {what}")
    identical = all(equal for _, equal in results)
    landed = sum(kill.landed for kill in kills)
    print(f"landed: {landed} of {len(kills)}")
    print(f"identical: {str(identical).lower()}")
    return 0 if identical and landed == len(kills) else 1


if __name__ == "__main__":
    cli.run(main)
