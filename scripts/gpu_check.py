"""Measure a GPU in four phases, each under its own time budget, one JSON file per phase.

Runs on a machine that has only the checkout and no network; the children run in its root:

    python -m scripts.gpu_check --phase=tests --out=DIR      # pytest -m gpu: DIR/tests.json
    python -m scripts.gpu_check --phase=bench --out=DIR      # base, big training: bench.json
    python -m scripts.gpu_check --phase=decode --out=DIR     # beam 4, greedy: decode.json
    python -m scripts.gpu_check --phase=multi30k --out=DIR   # train, test BLEU: multi30k.json
    python -m scripts.gpu_check --phase=all --out=DIR        # the four, in that order

Options: --data=DIR (default gpu_data), --budget_s=540 per phase, --smoke (tiny shapes, a few
steps and sentences: the whole script in minutes on a CPU), --grad_accum=K (bench: K
micro-batches per step), --bench_steps=30, --decode_workdir=DIR (decode a trained model, e.g.
the multi30k phase's workdir, instead of an untrained base model), --decode_num=3000,
--decode_batch_size=64 (0: the config's, 32 since issue 26), --multi30k_workdir=DIR (default
/tmp/gpu_check_multi30k), --commit=SHA (recorded when the checkout has no .git).

What the machine needs beside JAX, Flax, Optax, Orbax, sacreBLEU and SentencePiece:
- sacremoses and tensorboardX, as wheels fetched where there is network and carried in `.whl/`:
      bash scripts/fetch_gpu_wheels.sh                       # once, with network
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
          --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site   # on the GPU machine
- the data, copied into the git-ignored `gpu_data/` of the checkout:
      mkdir -p gpu_data && cp -r ../shared/data/multi30k ../shared/data/opennmt_toy_ende gpu_data/

On the project's device tool (one phase a call, each call at most 10 minutes), with
carry [".whl", "gpu_data"]:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site && \\
        python3 -m scripts.gpu_check --phase=bench --out=$OUT --commit=SHA

(--commit because the copy there may have no .git). The multi30k workdir in /tmp lasts only as
long as that machine stays warm: run `--phase=decode --decode_workdir=/tmp/gpu_check_multi30k`
right after `--phase=multi30k`.

The phases:
- tests: `python -m pytest -m gpu -q`; per-test outcomes from pytest's JUnit XML.
- bench: scripts/benchmark.py for configs/base.py and configs/big.py at the paper's batch
  (25,000 target token slots per step) in bfloat16, on news text (the WMT sample
  opennmt_toy_ende/train.{en,de}): tokens/s, step time, MFU against the measured matmul peak
  and the GPU's published dense peak, peak memory.
- decode: beam 4 and greedy over the first 3,000 lines of opennmt_toy_ende/train.en, with an
  untrained configs/base.py model (its outputs run to the length limit: a worst case) or the
  model in --decode_workdir; compilation is timed apart from decoding.
- multi30k: `python -m translate.train --config=configs/multi30k_gpu.py` on gpu_data/multi30k
  (with --force: a fresh run in the workdir), then its test report.

A phase that runs out of budget stops its command (SIGTERM; training saves a checkpoint) and
still writes its JSON, with `timed_out: true`. Every JSON records the device, the versions of
JAX and Flax, the commit, the date and the command. This script imports nothing from JAX: every
measurement runs in a child process, so only one process at a time holds the GPU.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import importlib.util
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree

from translate import provenance

ROOT = pathlib.Path(__file__).resolve().parent.parent
PHASES = ("tests", "bench", "decode", "multi30k")
# Seconds a stopped command gets to save and exit before it is killed; kept inside the budget.
GRACE_S = 20
# The paper's batch (Sec. 5.1): about 25,000 target tokens per step.
PAPER_BATCH_TOKENS = 25_000
WHEEL_INSTRUCTIONS = """\
  where there is network:  bash scripts/fetch_gpu_wheels.sh   (writes .whl/, git-ignored)
  on this machine:         python3 -m pip install -q --no-index --no-deps --no-compile \\
                               --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
                           export PYTHONPATH=/tmp/site"""
DATA_INSTRUCTIONS = """\
  mkdir -p gpu_data && cp -r ../shared/data/multi30k ../shared/data/opennmt_toy_ende gpu_data/
  (from the checkout's root; gpu_data/ is git-ignored) or pass --data=DIR"""

# --smoke: every model 1 + 1 layers of width 32, a 500-piece vocabulary (the news sample has
# 253 characters) and short rows.
SMOKE_MODEL = [
    "--config.model.num_layers=1",
    "--config.model.d_model=32",
    "--config.model.num_heads=4",
    "--config.model.d_ff=64",
    "--config.data.vocab_size=500",
    "--config.data.max_len=32",
    "--config.data.row_len=32",
]
SMOKE_TRAIN = [
    "--config.data.tokens_per_batch=512",
    "--config.train.num_train_steps=4",
    "--config.train.warmup_steps=2",
    "--config.train.log_every_steps=2",
    "--config.train.checkpoint_every_steps=4",
    "--config.decode.average_last=1",
    "--config.train.eval_every_steps=4",
    "--config.decode.eval_num_sentences=8",
    "--config.decode.max_extra_len=4",
]
SMOKE_DECODE = ["--config.decode.batch_size=8", "--config.decode.max_extra_len=4"]

# Run in a child so that this process never initialises (and holds) the GPU.
PROBE = """\
import json, platform
import flax, jax, jaxlib, optax
devices = jax.devices()
print(json.dumps({
    "platform": jax.default_backend(),
    "device_kind": devices[0].device_kind,
    "device_count": len(devices),
    "compute_capability": getattr(devices[0], "compute_capability", None),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "jaxlib": jaxlib.__version__,
    "flax": flax.__version__,
    "optax": optax.__version__,
}))
"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", required=True, choices=(*PHASES, "all"))
    parser.add_argument("--out", required=True, help="directory for the JSON files and logs")
    parser.add_argument(
        "--data", default=str(ROOT / "gpu_data"), help="multi30k/, opennmt_toy_ende/"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny shapes: exercise, not measure")
    parser.add_argument("--budget_s", type=float, default=540.0, help="seconds per phase")
    parser.add_argument("--grad_accum", type=int, default=1, help="bench: micro-batches per step")
    parser.add_argument("--bench_steps", type=int, default=30, help="bench: timed steps")
    parser.add_argument("--decode_workdir", default="", help="decode: a trained workdir")
    parser.add_argument("--decode_num", type=int, default=3000, help="decode: sentences")
    parser.add_argument(
        "--decode_batch_size",
        type=int,
        default=64,
        help="decode: sentences per batch (64, as BENCHMARKS.md's GPU figures; 0: the config's)",
    )
    parser.add_argument("--multi30k_workdir", default="/tmp/gpu_check_multi30k")
    parser.add_argument(
        "--multi30k_flag",
        action="append",
        default=[],
        help="multi30k: one more flag for translate.train, e.g. --config.model.attention=xla "
        "(repeatable)",
    )
    parser.add_argument("--commit", default="", help="recorded commit (default: git's HEAD)")
    args = parser.parse_args(argv)
    # Children run in the checkout's root: paths given relative to here are made to fit there.
    for name in ("out", "data", "decode_workdir", "multi30k_workdir"):
        if getattr(args, name):
            setattr(args, name, from_root(pathlib.Path(getattr(args, name))))
    return args


def from_root(path: pathlib.Path) -> pathlib.Path:
    """`path` relative to the checkout's root when it lies inside it, else absolute."""
    path = path.resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def short_commit() -> str | None:
    """The checkout's commit, short, with "+changes" when tracked files differ from it."""
    found = provenance.git_commit()
    if found is None:
        return None
    return found["commit"][:7] + ("+changes" if found["modified"] else "")


def missing_modules(phases: list[str]) -> list[str]:
    # translate.evaluate imports sacremoses (every phase imports it); translate.monitor
    # imports tensorboardX when training starts.
    needed = ["jax", "flax", "optax", "orbax.checkpoint", "sacrebleu", "sentencepiece"]
    needed += ["sacremoses", "tensorboardX"]
    if "tests" in phases:
        needed.append("pytest")
    missing = []
    for name in needed:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


def missing_data(phases: list[str], data: pathlib.Path) -> list[pathlib.Path]:
    needed = []
    if "bench" in phases or "decode" in phases:
        needed += [data / "opennmt_toy_ende" / f"train.{lang}" for lang in ("en", "de")]
    if "multi30k" in phases:
        needed += [
            data / "multi30k" / f"{split}.{lang}"
            for split in ("train", "val", "test2016")
            for lang in ("en", "de")
        ]
    return [path for path in needed if not path.is_file()]


def probe_environment() -> dict:
    """Device and library facts, from a child process that exits before any phase starts."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise SystemExit(f"could not start JAX:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_logged(cmd: list[str], log_path: pathlib.Path, deadline: float) -> dict:
    """Runs `cmd` in the checkout's root, echoing and logging its output, until `deadline`.

    Past the deadline (time.monotonic) the command gets SIGTERM, GRACE_S seconds to finish
    (the trainer saves a checkpoint), then SIGKILL.
    """
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    start = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=30)
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group, so a stop reaches its children
        )

        def pump():
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
                tail.append(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            returncode = proc.wait(timeout=max(deadline - GRACE_S - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
            print("\n*** out of budget: stopping the command (SIGTERM) ***", flush=True)
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                returncode = proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                returncode = proc.wait()
        reader.join(timeout=10)
    return {
        "command": shlex.join(cmd),
        "returncode": returncode,
        "timed_out": timed_out,
        "seconds": round(time.monotonic() - start, 2),
        "log": log_path.name,
        "output_tail": list(tail),
    }


def read_json(path: pathlib.Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def phase_tests(args: argparse.Namespace, out: pathlib.Path, deadline: float, on_gpu: bool) -> dict:
    """`pytest -m gpu`: counts and per-test outcomes (skipped, on a machine without a GPU)."""
    xml_path = out / "tests.xml"
    xml_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    run = run_logged([*cmd, f"--junitxml={xml_path}"], out / "tests.log", deadline)
    result = {"run": run, "counts": None, "tests": []}
    if xml_path.is_file():
        result.update(parse_junit(xml_path))
    # pytest exits 0 when all collected tests pass (or skip), 1 on a failure, 5 when the
    # marker selects no test at all. On a GPU, tests that all skip measured nothing.
    passed = (result["counts"] or {}).get("passed", 0)
    result["ok"] = run["returncode"] == 0 and not run["timed_out"] and (passed > 0 or not on_gpu)
    return result


def parse_junit(path: pathlib.Path) -> dict:
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = collections.Counter()
    tests = []
    for suite in suites:
        for case in suite.iter("testcase"):
            outcome, message = "passed", ""
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    outcome = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                    message = child.get("message", "")
            counts[outcome] += 1
            tests.append(
                {
                    "test": f"{case.get('classname')}::{case.get('name')}",
                    "outcome": outcome,
                    "seconds": float(case.get("time", 0.0)),
                    "message": message[:500],
                }
            )
    return {"counts": dict(counts), "tests": tests}


def phase_bench(args: argparse.Namespace, out: pathlib.Path, deadline: float) -> dict:
    """Training speed of the paper's base and big models at its batch, in bfloat16."""
    news = pathlib.Path(args.data) / "opennmt_toy_ende"
    if args.smoke:
        shape = ["--batch_tokens=256", "--steps=2", "--warmup=1", *SMOKE_MODEL]
    else:
        shape = [
            f"--batch_tokens={PAPER_BATCH_TOKENS}",
            f"--steps={args.bench_steps}",
            "--warmup=5",
            "--config.model.compute_dtype=bfloat16",
        ]
    if args.grad_accum > 1:
        shape.append(f"--config.train.grad_accum_steps={args.grad_accum}")
    result = {"batch_tokens": PAPER_BATCH_TOKENS if not args.smoke else 256, "models": {}}
    for name in ("base", "big"):
        json_path = out / f"bench_{name}.json"
        json_path.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "scripts.benchmark",
            f"--config=configs/{name}.py",
            f"--src={news / 'train.en'}",
            f"--tgt={news / 'train.de'}",
            *shape,
            f"--json={json_path}",
        ]
        run = run_logged(cmd, out / f"bench_{name}.log", deadline)
        result["models"][name] = {"run": run, "benchmark": read_json(json_path)}
    result["ok"] = all(m["benchmark"] is not None for m in result["models"].values())
    return result


def phase_decode(args: argparse.Namespace, out: pathlib.Path, deadline: float) -> dict:
    """Beam 4 and greedy decoding speed over news sentences, compilation apart."""
    news = pathlib.Path(args.data) / "opennmt_toy_ende"
    json_path = out / "decode_benchmark.json"
    json_path.unlink(missing_ok=True)
    num = 16 if args.smoke else args.decode_num
    cmd = [
        sys.executable,
        "-m",
        "scripts.benchmark",
        "--skip_training",
        f"--decode_src={news / 'train.en'}",
        f"--decode_num={num}",
    ]
    if args.decode_workdir:
        cmd.append(f"--decode_workdir={args.decode_workdir}")
    else:
        cmd += ["--config=configs/base.py", f"--src={news / 'train.en'}"]
        cmd += [f"--tgt={news / 'train.de'}"]
        cmd += SMOKE_MODEL if args.smoke else ["--config.model.compute_dtype=bfloat16"]
    if args.smoke:
        cmd += SMOKE_DECODE
    if args.decode_batch_size and not args.smoke:
        cmd.append(f"--config.decode.batch_size={args.decode_batch_size}")
    run = run_logged([*cmd, f"--json={json_path}"], out / "decode.log", deadline)
    benchmark = read_json(json_path)
    return {"sentences": num, "run": run, "benchmark": benchmark, "ok": benchmark is not None}


def phase_multi30k(args: argparse.Namespace, out: pathlib.Path, deadline: float) -> dict:
    """Trains configs/multi30k_gpu.py from scratch and reads its test report."""
    workdir = pathlib.Path(args.multi30k_workdir)
    cmd = [
        sys.executable,
        "-m",
        "translate.train",
        "--config=configs/multi30k_gpu.py",
        f"--workdir={workdir}",
        f"--config.data.dir={pathlib.Path(args.data) / 'multi30k'}",
        "--force",  # a fresh run: what an earlier run left in the workdir is deleted
    ]
    if args.smoke:
        cmd += SMOKE_MODEL + SMOKE_TRAIN
    cmd += args.multi30k_flag
    report_path = workdir / "report.json"
    report_path.unlink(missing_ok=True)
    run = run_logged(cmd, out / "multi30k.log", deadline)
    report = read_json(report_path)
    metrics = []
    if (workdir / "metrics.jsonl").is_file():
        lines = (workdir / "metrics.jsonl").read_text().splitlines()
        metrics = [json.loads(line) for line in lines if line.strip()]
    train = [m for m in metrics if "train/loss" in m]
    evals = [m for m in metrics if "eval/bleu" in m]
    scores = None
    if report is not None:
        keys = ("bleu", "signature", "chrf", "chrf_signature", "tokenized_bleu", "step")
        scores = {k: report[k] for k in keys}
        keys = ("num_sentences", "decode_seconds", "sentences_per_second", "beam_size")
        scores.update({k: report[k] for k in keys if k in report})
    return {
        "workdir": str(workdir),
        "config": read_json(workdir / "config.json"),
        "run": run,
        "wall_seconds": run["seconds"],
        "steps": train[-1]["step"] if train else 0,
        "last_train_log": train[-1] if train else None,
        "dev_evals": evals,
        "test_report": scores,
        "ok": report is not None,
    }


def print_summary(phase: str, result: dict) -> None:
    stopped = " (stopped: out of budget)" if result["timed_out"] else ""
    print(f"\n== {phase}: {'ok' if result['ok'] else 'NOT OK'}{stopped} ==")
    if phase == "tests":
        print(f"counts {result['counts']}, pytest exit {result['run']['returncode']}")
        for test in result["tests"]:
            if test["outcome"] != "passed":
                print(f"  {test['outcome']:8} {test['test']}  {test['message'][:120]}")
    elif phase == "bench":
        for name, model in result["models"].items():
            b = model["benchmark"]
            if b is None:
                print(f"{name}: no result (exit {model['run']['returncode']})")
                continue
            published = "n/a" if b["mfu_published"] is None else f"{100 * b['mfu_published']:.1f}%"
            print(
                f"{name}: {b['train_tgt_tokens_per_sec']:,.0f} target tokens/s, step "
                f"{1e3 * b['step_seconds_median']:.1f} ms, MFU {100 * b['mfu']:.1f}% of the "
                f"measured {b['peak_flops_per_sec'] / 1e12:.3g} TFLOP/s, {published} of the "
                f"published peak, peak memory {b['peak_memory_bytes'] / 2**30:.2f} GiB"
            )
            if b.get("steady_step_seconds") is not None:
                print(
                    f"{name}, steady state: {b['train_tgt_tokens_per_sec_steady']:,.0f} target "
                    f"tokens/s, step {1e3 * b['steady_step_seconds']:.1f} ms, MFU "
                    f"{100 * b['mfu_steady']:.1f}% of measured, "
                    f"{100 * (b['mfu_published_steady'] or 0):.1f}% of published"
                )
    elif phase == "decode" and result["benchmark"] is not None:
        b = result["benchmark"]
        for name in ("beam4", "greedy"):
            print(
                f"{name}: {b[f'decode_sentences_per_sec_{name}']:.1f} sentences/s, "
                f"{b[f'decode_tokens_per_sec_{name}']:,.0f} tokens/s, "
                f"{b[f'decode_seconds_{name}']:.2f} s decoding {b['decode_sentences']} "
                f"sentences; batch shapes compiled: {b[f'decode_num_compiles_{name}']}, in "
                f"{b[f'decode_compile_seconds_{name}']:.2f} s"
            )
    elif phase == "multi30k" and result["test_report"] is not None:
        r = result["test_report"]
        print(
            f"test sacreBLEU {r['bleu']:.2f}, chrF {r['chrf']:.2f} after {r['step']} steps; "
            f"{result['wall_seconds']:.0f} s in all"
        )


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # paths in `args` are relative to the root now, for this script and children
    phases = list(PHASES) if args.phase == "all" else [args.phase]
    missing = missing_modules(phases)
    if missing:
        print(f"missing Python packages: {', '.join(missing)}", file=sys.stderr)
        if set(missing) <= {"sacremoses", "tensorboardX"}:
            print(f"install them from wheels:\n{WHEEL_INSTRUCTIONS}", file=sys.stderr)
        return 2
    absent = missing_data(phases, pathlib.Path(args.data))
    if absent:
        names = "\n".join(f"  {path}" for path in absent)
        print(f"missing data files:\n{names}\ncopy them in:\n{DATA_INSTRUCTIONS}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    environment = probe_environment()
    header = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": args.commit or short_commit(),
        "command": shlex.join(["python", "-m", "scripts.gpu_check", *argv]),
        "smoke": args.smoke,
        "budget_seconds": args.budget_s,
        **environment,
    }
    print(json.dumps(environment))
    if environment["platform"] != "gpu" and not args.smoke:
        warning = (
            f"NO GPU: JAX runs on {environment['platform']} ({environment['device_kind']}); "
            "these figures do not measure a GPU"
        )
        header["warning"] = warning
        print(f"\n{'!' * 78}\n!!! {warning}\n{'!' * 78}\n", file=sys.stderr, flush=True)

    run_phase = {
        "tests": functools.partial(phase_tests, on_gpu=environment["platform"] == "gpu"),
        "bench": phase_bench,
        "decode": phase_decode,
        "multi30k": phase_multi30k,
    }
    all_ok = True
    for phase in phases:
        print(f"\n== phase {phase} (budget {args.budget_s:.0f} s) ==", flush=True)
        start = time.monotonic()
        result = run_phase[phase](args, out, start + args.budget_s)
        result = {"phase": phase, **header, "phase_seconds": time.monotonic() - start, **result}
        result["timed_out"] = any(run["timed_out"] for run in find_runs(result))
        (out / f"{phase}.json").write_text(json.dumps(result, indent=2) + "\n")
        print_summary(phase, result)
        print(f"wrote {out / f'{phase}.json'}")
        all_ok = all_ok and result["ok"]
    return 0 if all_ok else 1


def find_runs(result: dict) -> list[dict]:
    """Every command record ("run") in a phase's result."""
    if "run" in result:
        return [result["run"]]
    return [m["run"] for m in result.get("models", {}).values()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
