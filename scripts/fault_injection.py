"""Kill a training run at random moments, resume it, and compare it with an uninterrupted run.

    python -m scripts.fault_injection --config=configs/tiny.py --kills=5 --seed=0 \
        [--workdir=/tmp/faults] [--config.train.num_train_steps=60 ...]

The reference run trains to the end without interruption. The faulty run is started, killed
(SIGKILL or SIGTERM, chosen by the seed) at a random moment after training has begun, and
started again with the same command, `--kills` times, then allowed to finish. The script
compares every parameter bit for bit and the final reports, prints what it compared, and ends
with `identical: true` or `identical: false` (exit status 0 only when true).
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from translate import cli
from translate.config import Flag, parse_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Reasonable defaults for configs/tiny.py: enough steps and checkpoints for kills to land
# between checkpoints as well as on them.
DEFAULT_OVERRIDES = {
    "train.num_train_steps": "30",
    "train.checkpoint_every_steps": "4",
    "train.log_every_steps": "1",
}


def train_command(config: str, workdir: pathlib.Path, overrides: dict[str, str]) -> list[str]:
    flags = [f"--config.{k}={v}" for k, v in overrides.items()]
    return [
        sys.executable,
        "-m",
        "translate.train",
        f"--config={config}",
        f"--workdir={workdir}",
        *flags,
    ]


def run_to_end(command: list[str]) -> str:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done.stderr


def run_and_kill(command: list[str], delay: float, signum: int) -> str:
    """Starts training, waits for its first step line plus `delay` seconds, sends `signum`."""
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    started = threading.Event()

    def read():
        for line in process.stderr:
            lines.append(line)
            if " step " in line or "resumed from" in line:
                started.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not started.wait(0.1):
        if process.poll() is not None:
            break
    time.sleep(delay)
    if process.poll() is None:
        process.send_signal(signum)
    try:
        process.wait(timeout=60)  # a SIGTERM must end the run within 60 s
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        lines.append("did not stop within 60 s of the signal\n")
    reader.join(timeout=5)
    return "".join(lines)


def compare(reference: pathlib.Path, faulty: pathlib.Path) -> list[tuple[str, bool]]:
    """(what, equal) for the parameters, the report's scores and the hypotheses."""
    import jax

    from translate.workdir import load_model

    results = []
    _, ref_params, _, _, ref_step = load_model(reference)
    _, got_params, _, _, got_step = load_model(faulty)
    leaves = list(zip(jax.tree.leaves(ref_params), jax.tree.leaves(got_params)))
    same = all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in leaves)
    results.append((f"final step ({ref_step} and {got_step})", ref_step == got_step))
    results.append((f"{len(leaves)} parameter arrays, bit for bit", same))
    ref_report = json.loads((reference / "report.json").read_text())
    got_report = json.loads((faulty / "report.json").read_text())
    for key in ("bleu", "chrf", "num_sentences", "step"):
        results.append(
            (
                f"report {key} ({ref_report[key]} and {got_report[key]})",
                ref_report[key] == got_report[key],
            )
        )
    results.append(
        (
            "hypotheses.txt",
            (reference / "hypotheses.txt").read_bytes() == (faulty / "hypotheses.txt").read_bytes(),
        )
    )
    return results


def main(argv: list[str]) -> int:
    flags, overrides = parse_flags(
        argv,
        {
            "config": Flag("configs/tiny.py", "The config both runs train."),
            "kills": Flag(3, "How many times the faulty run is killed and restarted."),
            "seed": Flag(0, "Seed of the kill moments and signals."),
            "workdir": Flag("", "Directory for the two runs; default a new temporary one."),
            "max_delay": Flag(3.0, "Longest wait, in seconds after training began, to a kill."),
            "sigterm_fraction": Flag(0.5, "Share of kills by SIGTERM (the rest SIGKILL)."),
        },
        doc=__doc__,
    )
    overrides = {**DEFAULT_OVERRIDES, **overrides}
    base = pathlib.Path(flags["workdir"] or tempfile.mkdtemp(prefix="faults-"))
    for name in ("reference", "faulty"):
        shutil.rmtree(base / name, ignore_errors=True)
    rng = random.Random(flags["seed"])

    print(f"reference run: {base / 'reference'}", flush=True)
    run_to_end(train_command(flags["config"], base / "reference", overrides))
    faulty = train_command(flags["config"], base / "faulty", overrides)
    for kill in range(flags["kills"]):
        signum = signal.SIGTERM if rng.random() < flags["sigterm_fraction"] else signal.SIGKILL
        delay = rng.uniform(0.0, flags["max_delay"])
        output = run_and_kill(faulty, delay, signum)
        resumed = [line.strip() for line in output.splitlines() if "resumed from" in line]
        stopped = [line.strip() for line in output.splitlines() if "stopped by" in line]
        print(
            f"kill {kill + 1}: {signum.name} {delay:.2f} s after training started; "
            f"{resumed[0].split(' ', 1)[1] if resumed else 'started fresh'}; "
            f"{stopped[0].split(' ', 1)[1] if stopped else 'no checkpoint on exit'}",
            flush=True,
        )
    run_to_end(faulty)
    results = compare(base / "reference", base / "faulty")
    for what, equal in results:
        print(f"  {'same' if equal else 'DIFFERENT'}: {what}")
    identical = all(equal for _, equal in results)
    print(f"identical: {str(identical).lower()}")
    return 0 if identical else 1


if __name__ == "__main__":
    cli.run(main)
