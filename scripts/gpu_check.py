"""The GPU check: six phases, each under its own time budget, each writing OUT/PHASE.json.

    python -m scripts.gpu_check --phase=tests --out=OUT      # pytest -m gpu
    python -m scripts.gpu_check --phase=bench --out=OUT      # base and big training steps
    python -m scripts.gpu_check --phase=decode --out=OUT     # beam 4 and greedy speed
    python -m scripts.gpu_check --phase=multi30k --out=OUT   # the GPU recipe, the whole command
    python -m scripts.gpu_check --phase=text --out=OUT       # translate-text cold, then warm
    python -m scripts.gpu_check --phase=distill --out=OUT    # teachers to a student
    python -m scripts.gpu_check --phase=all --out=OUT        # the six, in that order

- tests: `pytest -m gpu` (120 s a test with pytest-timeout); each outcome from OUT/tests.xml.
- bench: scripts/benchmark.py, configs/base.py and configs/big.py at the paper's batch (25,000
  target token slots) in bfloat16 on the WMT sample, and each of today's blocks against the base
  step (`BLOCK_VARIANTS`; `--block_variants=false` skips them); `--profile` adds
  OUT/profile_NAME.json (the time per op of 5 more steps); `--bench_flags` replace the phase's
  flags of the same name ("--steps_per_call=5", "--packed=false",
  "--config.train.loss_keep=logits_bf16", "--vocab=SPM_MODEL"); XLA's and JAX's knobs go in the
  environment, which the children inherit (XLA_FLAGS=--xla_gpu_enable_command_buffer= turns CUDA
  graphs off; JAX_DEFAULT_PRNG_IMPL=rbg).
- decode: beam 4 and greedy over 3,000 lines of the WMT sample, an untrained configs/base.py (a
  worst case: outputs run to the length limit) or --decode_workdir's model.
- multi30k: `bash scripts/multi30k_gpu_ensemble.sh WORK/multi30k` from an empty compilation
  cache, as a user runs it: its seeds' test2016 reports and the ensemble's val and test2016;
  `--multi30k_flags` go to both trainings ("--config.train.steps_per_call=5").
- text: `translate-text` over test2016.en with that phase's seed 0 (run it on the same machine,
  with the same --work), cold then warm against a new compilation cache, counting what JAX's
  log says each run traced and compiled: the warm one should compile nothing (the saved
  searches, translate/decoding/saved_searches.py).
- distill: `translate-distill` from an empty compilation cache: two teachers of
  configs/multi30k_adamw.py, their ensemble's beam decoding of the training sources, the reverse
  model of configs/multi30k_reverse.py back-translating the targets, a student of
  configs/multi30k_student.py, the scores; OUT/distill.json holds the pipeline's report (every
  stage's time). `--smoke` runs it on the tiny config's synthetic corpus.

A phase out of budget is stopped (SIGTERM, SIGKILL 20 s later; training saves a checkpoint) and
still writes its JSON, `timed_out: true`. No JAX runs in this process, so one process at a time
holds the GPU. `--smoke` shrinks every shape: all six in 5 minutes on 2 CPU cores. A bare GPU
machine needs .whl/ (`bash scripts/fetch_gpu_wheels.sh`) and data/ (`translate-data multi30k
--dir=data/multi30k`, `translate-data wmt_sample --dir=data/wmt_sample`) made where there is
network and carried beside the checkout; docs/gpus.md ("The GPU check") says more.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree

from translate import provenance

ROOT = pathlib.Path(__file__).resolve().parent.parent
PHASES = ("tests", "bench", "decode", "multi30k", "text", "distill")
GRACE_S = 20  # seconds a stopped command gets to save and exit; kept inside the budget
PAPER_BATCH_TOKENS = 25_000  # target token slots a step (the paper's Sec. 5.1)
INSTALL = """\
  where there is network:  bash scripts/fetch_gpu_wheels.sh        (writes .whl/)
  on this machine:         python3 -m pip install -q --no-index --no-deps --no-compile \\
                               --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
                           export PYTHONPATH=/tmp/site"""
FETCH = """\
  translate-data multi30k --dir=data/multi30k      (where there is network; carry data/)
  translate-data wmt_sample --dir=data/wmt_sample  or pass --data=DIR"""
# --smoke: 1 + 1 layers of width 32, a 500-piece vocabulary (the WMT sample has 253
# characters), short rows; Multi30k for 6 steps, its val and test sets cut to 40 sentences.
# Today's blocks (docs/variants.md), each timed against the base step by the bench phase in one
# process (scripts/benchmark.py --variant): a gated network at 2/3 of d_ff, a multiple of 8.
BLOCK_VARIANTS = [
    "model.positions=rotary",
    "model.positions=relative",
    "model.normalization=rmsnorm",
    "model.feed_forward=swiglu model.d_ff=1368",
    "model.num_kv_heads=2",
    "model.use_bias=false",
]
SMOKE_MODEL = "num_layers=1 d_model=32 num_heads=4 d_ff=64".split()
SMOKE_MODEL = [f"--config.model.{f}" for f in SMOKE_MODEL] + ["--config.data.vocab_size=500"]
SMOKE_MODEL += ["--config.data.max_len=32", "--config.data.row_len=32"]
SMOKE_DECODE = ["--config.decode.max_extra_len=4"]
SMOKE_MULTI30K = "num_train_steps=6 warmup_steps=2 eval_every_steps=3 log_every_steps=2".split()
SMOKE_MULTI30K = [f"--config.train.{f}" for f in [*SMOKE_MULTI30K, "checkpoint_every_steps=3"]]
SMOKE_MULTI30K += ["--config.model.num_layers=1", "--config.decode.alignment_layer=0"]
SMOKE_MULTI30K += SMOKE_DECODE
SMOKE_SENTENCES = 40
# --smoke's pipeline: the tiny config on its synthetic corpus, taught fast enough that its
# translations are not empty (tests/test_pipeline.py's teachers).
SMOKE_DISTILL = {"train.num_train_steps": "120", "train.warmup_steps": "40",
                 "train.learning_rate_scale": "0.3",
                 "train.checkpoint_every_steps": "40"}  # fmt: skip
# configs/multi30k_student.py's corpora, which the tiny config does not name.
SMOKE_CORPORA = json.dumps([{"prefix": "original"}, {"prefix": "distilled"},
                            {"prefix": "back_translated", "tag": "<BT>"}])  # fmt: skip
SPLITS = ("val", "test2016")
# The devices, from a child: this process never initialises (and holds) the GPU.
PROBE = """import json, jax; d = jax.devices(); print(json.dumps({"platform": jax.default_backend(),
"device_kind": d[0].device_kind, "device_count": len(d),
"compute_capability": getattr(d[0], "compute_capability", None)}))"""
NVIDIA_SMI = ["nvidia-smi", "--format=csv,noheader"]
NVIDIA_SMI += ["--query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version"]
# What JAX logs with jax_log_compiles; a program read from the persistent cache is logged as an
# XLA compilation too, and as a cache hit.
COMPILE_LINES = {
    "traced": "Finished tracing",
    "xla_compilations": "Finished XLA compilation",
    "cache_hits": "Persistent compilation cache hit",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--phase", required=True, choices=(*PHASES, "all"))
    add("--out", required=True, help="directory for the JSON files and logs")
    add("--data", default="data", help="holds multi30k/ and wmt_sample/")
    add("--work", default="/tmp/gpu_check", help="the phases' workdirs, caches and traces")
    add("--budget_s", type=float, default=540.0, help="seconds per phase")
    add("--smoke", action="store_true", help="tiny shapes: exercise, not measure")
    add("--bench_steps", type=int, default=30, help="bench: timed steps")
    add(
        "--block_variants",
        type=lambda v: v.lower() in ("1", "true", "yes"),
        default=True,
        help="bench: time today's blocks against the base step (BLOCK_VARIANTS)",
    )
    add("--bench_flags", default="", help="bench: more flags for scripts/benchmark.py")
    add("--profile", action="store_true", help="bench: trace 5 more steps of each model")
    add("--decode_workdir", default="", help="decode: a trained workdir")
    add("--decode_num", type=int, default=3000, help="decode: sentences")
    add("--decode_batch_size", type=int, default=64, help="decode: sentences a batch")
    add("--multi30k_flags", default="", help="multi30k: more flags for both trainings")
    add("--commit", default="", help="recorded commit (default: git's HEAD)")
    args = parser.parse_args(argv)
    # Children run in the checkout's root: paths given relative to here are made to fit there.
    for name in ("out", "data", "work", "decode_workdir"):
        if getattr(args, name):
            path = pathlib.Path(getattr(args, name)).resolve()
            setattr(args, name, path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
    return args


def with_flags(own: list[str], given: str) -> list[str]:
    """The phase's own flags, less those that `given` (a shell-quoted string) sets, then it."""
    extra = shlex.split(given)
    names = {flag.split("=")[0] for flag in extra}
    return [flag for flag in own if flag.split("=")[0] not in names] + extra


def has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def missing_data(phases: list[str], data: pathlib.Path) -> list[pathlib.Path]:
    needed = []
    if "bench" in phases or "decode" in phases:
        needed += [data / "wmt_sample" / f"train.{lang}" for lang in ("en", "de")]
    if "multi30k" in phases or "text" in phases or "distill" in phases:
        names = [f"{s}.{lang}" for s in ("train", *SPLITS) for lang in ("en", "de")]
        needed += [data / "multi30k" / name for name in names]
    return [path for path in needed if not path.is_file()]


def environment() -> dict:
    """The devices, the versions, the processor and nvidia-smi's clocks."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise SystemExit(f"could not start JAX:\n{done.stderr}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    found.update(provenance.package_versions(), **provenance.host())
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(NVIDIA_SMI, capture_output=True, text=True).stdout
        found["nvidia_smi"] = [NVIDIA_SMI[-1], *smi.strip().splitlines()]
    return found


def run_logged(cmd: list[str], log: pathlib.Path, deadline: float, env=None) -> dict:
    """Runs `cmd` in the checkout's root until `deadline` (time.monotonic), its output echoed
    and written to `log`. Past the deadline it gets SIGTERM, GRACE_S seconds, then SIGKILL."""
    print(f"\n$ {shlex.join(cmd)}", flush=True)
    start, tail = time.monotonic(), collections.deque(maxlen=30)
    env = None if env is None else {**os.environ, **env}
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env=env, start_new_session=True,  # its own process group: a stop reaches its children
        )  # fmt: skip

        def pump():
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                out.write(line)
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
    seconds = round(time.monotonic() - start, 2)
    return {"command": shlex.join(cmd), "returncode": returncode, "timed_out": timed_out,
            "seconds": seconds, "log": log.name, "output_tail": list(tail)}  # fmt: skip


def read_json(path: pathlib.Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def scores(report: dict | None) -> dict | None:
    """A report's scores: sacreBLEU, the literature's lowercased tokenized BLEU, chrF, speed."""
    keys = ("bleu", "signature", "literature_bleu", "tokenized_bleu", "chrf", "step")
    keys += ("num_sentences", "compile_seconds", "decode_seconds", "sentences_per_second")
    return None if report is None else {k: report[k] for k in keys if k in report}


def phase_tests(args, out: pathlib.Path, deadline: float, on_gpu: bool) -> dict:
    xml = out / "tests.xml"
    xml.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    cmd += ["--timeout=120"] if has_module("pytest_timeout") else []
    run = run_logged([*cmd, f"--junitxml={xml}"], out / "tests.log", deadline)
    counts, tests = collections.Counter(), []
    for case in ElementTree.parse(xml).getroot().iter("testcase") if xml.is_file() else []:
        test = {"test": f"{case.get('classname')}::{case.get('name')}", "outcome": "passed"}
        test.update(seconds=float(case.get("time", 0)), message="")
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                test["outcome"] = {"failure": "failed", "error": "error"}.get(child.tag, "skipped")
                test["message"] = child.get("message", "")[:500]
        counts[test["outcome"]] += 1
        tests.append(test)
    # pytest exits 0 when every test collected passes or skips; on a GPU, all skipped is a failure.
    ok = run["returncode"] == 0 and not run["timed_out"] and (counts["passed"] > 0 or not on_gpu)
    return {"runs": [run], "counts": dict(counts), "tests": tests, "ok": ok}


def phase_bench(args, out: pathlib.Path, deadline: float) -> dict:
    wmt = args.data / "wmt_sample"
    if args.smoke:
        own = ["--batch_tokens=256", "--steps=2", "--warmup=1", *SMOKE_MODEL]
    else:
        own = [f"--batch_tokens={PAPER_BATCH_TOKENS}", f"--steps={args.bench_steps}"]
        own += ["--warmup=5", "--config.model.compute_dtype=bfloat16"]
    result = {"runs": [], "models": {}}
    for name in ("base", "big"):
        json_path, trace = out / f"bench_{name}.json", args.work / f"profile_{name}"
        json_path.unlink(missing_ok=True)
        shutil.rmtree(trace, ignore_errors=True)
        flags = [f"--config=configs/{name}.py", f"--src={wmt}/train.en", f"--tgt={wmt}/train.de"]
        flags += [f"--json={json_path}"] + ([f"--profile={trace}"] if args.profile else [])
        if name == "base" and args.block_variants:
            # The smoke model's d_ff is 64: its gated width is 40.
            width = ("d_ff=1368", "d_ff=40") if args.smoke else ("", "")
            flags += [f"--variant={v.replace(*width)}" for v in BLOCK_VARIANTS]
            flags += ["--variant_rounds=3"]
        cmd = [
            sys.executable,
            "-m",
            "scripts.benchmark",
            *with_flags(flags + own, args.bench_flags),
        ]
        result["runs"].append(run_logged(cmd, out / f"bench_{name}.log", deadline))
        result["models"][name] = read_json(json_path)
        if (trace / "profile_summary.json").is_file():
            shutil.copy(trace / "profile_summary.json", out / f"profile_{name}.json")
    result["ok"] = None not in result["models"].values()
    return result


def phase_decode(args, out: pathlib.Path, deadline: float) -> dict:
    wmt = args.data / "wmt_sample"
    json_path = out / "decode_benchmark.json"
    json_path.unlink(missing_ok=True)
    num = 16 if args.smoke else args.decode_num
    cmd = [sys.executable, "-m", "scripts.benchmark", "--skip_training"]
    cmd += [f"--decode_src={wmt}/train.en", f"--decode_num={num}", f"--json={json_path}"]
    if args.decode_workdir:
        cmd.append(f"--decode_workdir={args.decode_workdir}")
    else:
        cmd += ["--config=configs/base.py", f"--src={wmt}/train.en", f"--tgt={wmt}/train.de"]
        cmd += SMOKE_MODEL if args.smoke else ["--config.model.compute_dtype=bfloat16"]
    cmd += SMOKE_DECODE if args.smoke else []
    size = 8 if args.smoke else args.decode_batch_size
    cmd += [f"--config.decode.batch_size={size}"] if size else []
    run = run_logged(cmd, out / "decode.log", deadline)
    benchmark = read_json(json_path)
    return {"sentences": num, "runs": [run], "benchmark": benchmark, "ok": benchmark is not None}


def multi30k_data(args) -> pathlib.Path:
    """data/multi30k, or with --smoke a copy in --work with val and test cut to 40 sentences."""
    data = args.data / "multi30k"
    if not args.smoke:
        return data
    smoke = args.work / "multi30k_data"
    smoke.mkdir(parents=True, exist_ok=True)
    for path in data.glob("*.??"):
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        cut = lines if path.stem == "train" else lines[:SMOKE_SENTENCES]
        (smoke / path.name).write_text("".join(cut), encoding="utf-8")
    return smoke


def phase_multi30k(args, out: pathlib.Path, deadline: float) -> dict:
    work, cache = args.work / "multi30k", args.work / "multi30k_cache"
    shutil.rmtree(work, ignore_errors=True)  # a fresh run; the script refuses a finished one
    shutil.rmtree(cache, ignore_errors=True)  # as on a new machine
    flags = [f"--config.data.dir={multi30k_data(args)}"] + (SMOKE_MULTI30K if args.smoke else [])
    cmd = ["bash", "scripts/multi30k_gpu_ensemble.sh", str(work)]
    env = {"TRANSLATE_COMPILATION_CACHE": str(cache), "PYTHON": sys.executable}
    cmd += with_flags(flags, args.multi30k_flags)
    run = run_logged(cmd, out / "multi30k.log", deadline, env)
    seeds = {}
    for seed in ("s0", "s1"):
        metrics = work / seed / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        train = [m for m in map(json.loads, filter(None, lines)) if "train/loss" in m]
        report = scores(read_json(work / seed / "report.json"))
        seeds[seed] = {"test2016": report, "last_train_log": train[-1] if train else None}
    ensemble = {s: scores(read_json(work / f"ensemble_{s}" / "report.json")) for s in SPLITS}
    ok = run["returncode"] == 0 and None not in ensemble.values()
    config = read_json(work / "s0" / "config.json")
    return {"workdir": str(work), "config": config, "runs": [run], "wall_seconds": run["seconds"],
            "seeds": seeds, "ensemble": ensemble, "ok": ok}  # fmt: skip


def phase_text(args, out: pathlib.Path, deadline: float) -> dict:
    model, cache = args.work / "multi30k" / "s0", args.work / "text_cache"
    if not (model / "config.json").is_file():
        raise SystemExit(f"{model}: no trained model; run --phase=multi30k first (same --work)")
    shutil.rmtree(cache, ignore_errors=True)
    result, outputs = {"workdir": str(model), "runs": []}, []
    for name in ("cold", "warm"):
        target, log = args.work / f"text_{name}.de", out / f"text_{name}.log"
        target.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "translate.translate_text", f"--workdir={model}"]
        cmd += [f"--input={multi30k_data(args) / 'test2016.en'}", f"--output={target}"]
        cmd += [f"--compilation_cache={cache}"]
        result["runs"].append(run_logged(cmd, log, deadline, {"JAX_LOG_COMPILES": "1"}))
        text = log.read_text(encoding="utf-8", errors="replace")
        result[name] = {key: text.count(line) for key, line in COMPILE_LINES.items()}
        result[name]["compiled"] = result[name]["xla_compilations"] - result[name]["cache_hits"]
        outputs.append(target.read_bytes() if target.is_file() else None)
    result["outputs_identical"] = outputs[0] is not None and outputs[0] == outputs[1]
    result["warm_compiled_anything"] = result["warm"]["compiled"] > 0
    result["ok"] = all(r["returncode"] == 0 for r in result["runs"]) and result["outputs_identical"]
    return result


def config_file(path: pathlib.Path, base: str, overrides: dict[str, str]) -> pathlib.Path:
    """A config file that is the packaged config `base` with dotted `overrides` over it."""
    path.write_text(
        "from translate.config import load_config\n\n\ndef get_config():\n"
        f"    return load_config({base!r}, {overrides!r})\n"
    )
    return path


def phase_distill(args, out: pathlib.Path, deadline: float) -> dict:
    """translate-distill from an empty compilation cache: two teachers of
    configs/multi30k_adamw.py, their ensemble's decoding of the training sources, the reverse
    model's back-translation of the targets, and the student of configs/multi30k_student.py,
    each stage timed by the pipeline's report."""
    work, cache = args.work / "distill", args.work / "distill_cache"
    for path in (work, cache):
        shutil.rmtree(path, ignore_errors=True)  # as on a new machine
    configs = args.work / "distill_configs"
    configs.mkdir(parents=True, exist_ok=True)
    teacher, reverse, student = "multi30k_adamw", "multi30k_reverse", "multi30k_student"
    overrides = {"data.dir": str(multi30k_data(args).resolve())}
    student_overrides = overrides
    if args.smoke:
        teacher, reverse, student, overrides = "tiny", "tiny", "tiny", SMOKE_DISTILL
        student_overrides = {**SMOKE_DISTILL, "data.source": "files",
                             "data.train_corpora": SMOKE_CORPORA}  # fmt: skip
    cmd = [sys.executable, "-m", "translate.distill", f"--dir={work}", "--num_teachers=2"]
    cmd += [f"--teacher_config={config_file(configs / 'teacher.py', teacher, overrides)}"]
    cmd += [f"--reverse_config={config_file(configs / 'reverse.py', reverse, overrides)}"]
    student_file = config_file(configs / "student.py", student, student_overrides)
    cmd += [f"--student_config={student_file}"]
    cmd += [f"--compilation_cache={cache}"]
    run = run_logged(cmd, out / "distill.log", deadline)
    report = read_json(work / "report.json")
    return {"workdir": str(work), "runs": [run], "wall_seconds": run["seconds"],
            "report": report, "ok": run["returncode"] == 0 and report is not None}  # fmt: skip


PHASE_RUNS = {"tests": phase_tests, "bench": phase_bench, "decode": phase_decode,
              "multi30k": phase_multi30k, "text": phase_text, "distill": phase_distill}  # fmt: skip


def print_summary(phase: str, r: dict) -> None:
    """The phase's verdict; its commands printed their own figures above."""
    stopped = " (stopped: out of budget)" if r["timed_out"] else ""
    print(f"\n== {phase}: {'ok' if r['ok'] else 'NOT OK'}{stopped} ==")
    for test in r.get("tests", []):
        if test["outcome"] != "passed":
            print(f"  {test['outcome']:8} {test['test']}  {test['message'][:120]}")
    for key in ("counts", "wall_seconds", "cold", "warm", "warm_compiled_anything"):
        if key in r:
            print(f"{key}: {r[key]}")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    os.chdir(ROOT)  # paths in `args` are relative to the root now, for this script and children
    phases = list(PHASES) if args.phase == "all" else [args.phase]
    needed = ["jax", "flax", "optax", "orbax.checkpoint", "sacrebleu", "sentencepiece"]
    needed += ["sacremoses", "tensorboardX"] + (["pytest"] if "tests" in phases else [])
    missing = [name for name in needed if not has_module(name)]
    if missing:
        print(f"missing Python packages: {', '.join(missing)}", file=sys.stderr)
        if set(missing) <= {"sacremoses", "tensorboardX"}:
            print(f"install them from wheels:\n{INSTALL}", file=sys.stderr)
        return 2
    absent = "\n".join(f"  {path}" for path in missing_data(phases, args.data))
    if absent:
        print(f"missing data files:\n{absent}\nfetch them:\n{FETCH}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    found, commit = environment(), provenance.git_commit()
    if commit:
        commit = commit["commit"][:7] + ("+changes" if commit["modified"] else "")
    header = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": args.commit or commit,
        "command": shlex.join(["python", "-m", "scripts.gpu_check", *argv]),
        "smoke": args.smoke,
        "budget_seconds": args.budget_s,
        **found,
    }
    print(json.dumps(found))
    if found["platform"] != "gpu" and not args.smoke:
        header["warning"] = f"NO GPU: JAX runs on {found['platform']} ({found['device_kind']})"
        print(f"\n!!! {header['warning']}: these figures do not measure a GPU\n", file=sys.stderr)
    all_ok = True
    for phase in phases:
        print(f"\n== phase {phase} (budget {args.budget_s:.0f} s) ==", flush=True)
        start = time.monotonic()
        extra = {"on_gpu": found["platform"] == "gpu"} if phase == "tests" else {}
        result = PHASE_RUNS[phase](args, args.out, start + args.budget_s, **extra)
        result = {"phase": phase, **header, "phase_seconds": time.monotonic() - start, **result}
        result["timed_out"] = any(r["timed_out"] for r in result["runs"])
        (args.out / f"{phase}.json").write_text(json.dumps(result, indent=2) + "\n")
        print_summary(phase, result)
        print(f"wrote {args.out / f'{phase}.json'}")
        all_ok = all_ok and result["ok"]
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
