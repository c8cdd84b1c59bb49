"""Two JAX processes on one machine (a localhost coordinator, 2 CPU devices each) train together.

Each test starts this file twice as a script (`python tests/test_multihost.py MODE OUT_DIR`),
one per process, joined by `sharding.initialize_distributed()` (which calls
`jax.distributed.initialize`; CPU collectives go through gloo, JAX's default). The workers
write what they loaded and the parameters they hold to files that the tests compare.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
NUM_STEPS = 3
VOCAB_SIZE = 64
REPO = pathlib.Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def job_environment() -> dict[str, str]:
    """Two CPU processes of one job on this machine (add JAX_PROCESS_ID per process)."""
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}",
        # What sharding.initialize_distributed() reads on hosts without SLURM.
        "JAX_COORDINATOR_ADDRESS": f"localhost:{free_port()}",
        "JAX_NUM_PROCESSES": str(NUM_PROCESSES),
    }


def run_workers(mode: str, config, out_dir: pathlib.Path, timeout: float = 300) -> None:
    """Runs `mode` in two processes joined through a localhost coordinator; fails on any error."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config.to_dict()))
    env = job_environment()
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, mode, str(out_dir)],
            env={**env, "JAX_PROCESS_ID": str(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(NUM_PROCESSES)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed:\n{text[-4000:]}"


def random_corpus():
    """The same small tokenized corpus in every process (and in the test)."""
    from translate.data.corpus import TokenizedCorpus

    rng = np.random.default_rng(0)
    src = [list(rng.integers(4, VOCAB_SIZE, rng.integers(2, 12))) for _ in range(200)]
    tgt = [list(rng.integers(4, VOCAB_SIZE, rng.integers(2, 12))) for _ in range(200)]
    return TokenizedCorpus.from_lists(src, tgt)


def global_layout(config):
    from translate.data.batching import BatchLayout

    d = config.data
    return BatchLayout.from_config(
        d.tokens_per_batch,
        d.row_len,
        config.train.grad_accum_steps,
        NUM_PROCESSES * DEVICES_PER_PROCESS,
    )


def flat_params(params) -> dict[str, np.ndarray]:
    return {f"param_{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(params))}


def worker_steps(config, out_dir: pathlib.Path) -> None:
    """A few train steps through the trainer's building blocks, as train_and_evaluate runs them."""
    from translate import sharding
    from translate.data.batching import DataPosition, iterate_batches
    from translate.training.steps import make_steps

    mesh = sharding.make_mesh()
    layout = global_layout(config)
    row_slice = sharding.host_row_slice(layout.rows)
    batches = iterate_batches(random_corpus(), layout, 0, DataPosition(), row_slice)
    steps = make_steps(config, VOCAB_SIZE, mesh)
    params, opt_state = steps.init(jax.random.key(0))
    step_fn = steps.train
    loaded = []
    for step in range(NUM_STEPS):
        batch, _ = next(batches)
        loaded.append(batch.src)
        params, opt_state, _ = step_fn(
            params, opt_state, sharding.put_batch(batch, mesh), step, jax.random.key(1)
        )
    np.savez(
        out_dir / f"process_{jax.process_index()}.npz",
        src=np.stack(loaded),  # [steps, A, R / processes, row_len]
        **flat_params(sharding.local_copy(params)),
    )


def worker_train_and_evaluate(config, out_dir: pathlib.Path) -> None:
    """The real trainer on a shared workdir; records this process's first batch and final params."""
    from translate import cli, sharding
    from translate.training import trainer

    first_batches, final_params = [], []
    original_batches, original_local_copy = trainer.iterate_batches, sharding.local_copy

    def recording_batches(*args, **kwargs):
        for batch, position in original_batches(*args, **kwargs):
            if not first_batches:
                first_batches.append(batch.src)
            yield batch, position

    def recording_local_copy(params):
        final_params[:] = [original_local_copy(params)]
        return final_params[0]

    trainer.iterate_batches = recording_batches
    sharding.local_copy = recording_local_copy
    cli.setup_logging()
    trainer.train_and_evaluate(config, out_dir / "workdir")
    np.savez(
        out_dir / f"process_{jax.process_index()}.npz",
        src=first_batches[0],
        **flat_params(final_params[0]),
    )


def worker_main(mode: str, out_dir: str) -> None:
    from translate import sharding

    sharding.initialize_distributed()  # jax.distributed.initialize with the variables above
    assert jax.process_count() == NUM_PROCESSES
    assert jax.device_count() == NUM_PROCESSES * DEVICES_PER_PROCESS

    from translate.config import config_from_dict

    out_dir = pathlib.Path(out_dir)
    config = config_from_dict(json.loads((out_dir / "config.json").read_text()))
    {"steps": worker_steps, "train_and_evaluate": worker_train_and_evaluate}[mode](config, out_dir)
    jax.distributed.shutdown()


def load_outputs(out_dir: pathlib.Path) -> list[dict[str, np.ndarray]]:
    return [dict(np.load(out_dir / f"process_{i}.npz")) for i in range(NUM_PROCESSES)]


def params_of(output: dict[str, np.ndarray]) -> list[np.ndarray]:
    count = sum(k.startswith("param_") for k in output)
    return [output[f"param_{i}"] for i in range(count)]


@pytest.fixture(scope="module")
def steps_run(tmp_path_factory):
    """Two processes, a few steps of the tiny config; returns (config, per-process outputs)."""
    from helpers import tiny_config

    config = tiny_config()
    config.model.num_layers = 1  # halves compilation, the bulk of this test's time
    out_dir = tmp_path_factory.mktemp("two_processes")
    run_workers("steps", config, out_dir)
    return config, load_outputs(out_dir)


def test_each_process_loads_its_own_rows_of_every_global_batch(steps_run):
    from translate.data.batching import DataPosition, iterate_batches

    config, outputs = steps_run
    batches = iterate_batches(random_corpus(), global_layout(config), 0, DataPosition())
    whole = np.stack([next(batches)[0].src for _ in range(NUM_STEPS)])  # [steps, A, R, L]
    halves = [out["src"] for out in outputs]
    assert halves[0].shape[2] == halves[1].shape[2] == whole.shape[2] // NUM_PROCESSES
    assert not np.array_equal(halves[0], halves[1])
    np.testing.assert_array_equal(np.concatenate(halves, axis=2), whole)


def test_processes_hold_identical_parameters_after_training(steps_run):
    _, outputs = steps_run
    for a, b in zip(params_of(outputs[0]), params_of(outputs[1])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # compiles the step once more, in this process: about 12 s
def test_two_processes_train_like_one_process_on_the_same_batches(steps_run):
    from test_trainer import run_steps

    from translate.data.batching import DataPosition, iterate_batches

    config, outputs = steps_run
    batches = iterate_batches(random_corpus(), global_layout(config), 0, DataPosition())
    mesh = Mesh(np.array(jax.devices()[: NUM_PROCESSES * DEVICES_PER_PROCESS]), ("data",))
    one, _, _ = run_steps(config, mesh, [next(batches)[0] for _ in range(NUM_STEPS)], VOCAB_SIZE)
    leaves = jax.tree.leaves(one)
    assert len(leaves) == len(params_of(outputs[0]))
    for a, b in zip(leaves, params_of(outputs[0])):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_train_and_evaluate_on_two_processes_shares_one_workdir(config, tmp_path):
    from translate import checkpoint
    from translate.data.batching import make_batch, plan_epoch
    from translate.data.sources import load_data
    from translate.training.trainer import data_files
    from translate.workdir import Workdir

    run_workers("train_and_evaluate", config, tmp_path)
    workdir = tmp_path / "workdir"
    outputs = load_outputs(tmp_path)
    for a, b in zip(params_of(outputs[0]), params_of(outputs[1])):
        np.testing.assert_array_equal(a, b)
    data = load_data(config, data_files(Workdir(workdir)))
    layout = global_layout(config)
    whole = make_batch(data.train, plan_epoch(data.train, layout, config.train.seed, 0)[0], layout)
    np.testing.assert_array_equal(
        np.concatenate([out["src"] for out in outputs], axis=1), whole.src
    )
    assert checkpoint.latest_step(Workdir(workdir).checkpoints) == config.train.num_train_steps
    report = json.loads((workdir / "report.json").read_text())
    assert report["step"] == config.train.num_train_steps
    logged_steps = [
        json.loads(line)["step"]
        for line in (workdir / "metrics.jsonl").read_text().splitlines()
        if "train/loss" in line
    ]
    assert logged_steps == sorted(set(logged_steps))  # written by process 0 alone


@pytest.mark.slow  # two processes train: 25 s on 2 cores
def test_sigterm_to_one_process_stops_every_process_at_the_same_step(tmp_path):
    """SLURM signals each task on its own: the one signalled and the one not must still stop
    together (a host saving while another enters the next step's collectives hangs both)."""
    from translate import checkpoint
    from translate.workdir import Workdir

    env = job_environment()
    command = [
        sys.executable,
        "-m",
        "translate.train",
        "--config=configs/tiny.py",
        f"--workdir={tmp_path}",
        "--config.model.num_layers=1",
        "--config.train.num_train_steps=100000",
        "--config.train.log_every_steps=1",
        "--config.train.stop_check_every_steps=4",
    ]
    procs = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env={**env, "JAX_PROCESS_ID": str(i)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(NUM_PROCESSES)
    ]
    outputs: list[list[str]] = [[] for _ in procs]
    started = threading.Event()

    def read(i):
        for line in procs[i].stderr:
            outputs[i].append(line)
            if i == 1 and " step " in line:
                started.set()

    readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(len(procs))]
    for reader in readers:
        reader.start()
    try:
        assert started.wait(300), "process 1 never logged a step:\n" + "".join(outputs[1])
        procs[1].send_signal(signal.SIGTERM)  # process 0 is never signalled
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for reader in readers:
        reader.join(timeout=10)
    texts = ["".join(lines) for lines in outputs]
    stops = []
    for p, text in zip(procs, texts):
        assert p.returncode == 128 + signal.SIGTERM, text[-3000:]
        stops.append(int(text.split("stopped by SIGTERM at step ")[1].split(";")[0]))
    assert stops[0] == stops[1] and stops[0] % 4 == 0
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == stops[0]


if __name__ == "__main__":
    worker_main(*sys.argv[1:])
