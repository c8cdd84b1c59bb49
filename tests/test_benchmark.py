"""scripts/benchmark.py: its steady-state mode, and decoding with only a vocabulary."""

import json
import statistics

import pytest

from translate import cli
from translate.data import synthetic
from translate.data.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Parallel synthetic text and a 64-piece vocabulary of it."""
    path = tmp_path_factory.mktemp("bench")
    pairs = synthetic.generate_pairs(300, seed=1)
    (path / "src.txt").write_text("".join(f"{s}\n" for s, _ in pairs))
    (path / "tgt.txt").write_text("".join(f"{t}\n" for _, t in pairs))
    train_tokenizer([s for pair in pairs for s in pair], 64, path / "vocab.model")
    return path


def run_benchmark(argv: list[str], out) -> dict:
    from scripts import benchmark

    with pytest.raises(SystemExit) as stopped:
        cli.run(benchmark.main, [*argv, f"--json={out}"])
    assert stopped.value.code == 0
    return json.loads(out.read_text())


@pytest.mark.slow  # 20-30 s of compilations; the decoding test stays in the default run
def test_steady_state_mode_reports_its_rounds_and_the_host_time_per_step(files, tmp_path):
    argv = ["--config=tiny", f"--src={files}/src.txt", f"--tgt={files}/tgt.txt"]
    argv += [f"--vocab={files}/vocab.model", "--batch_tokens=512", "--steps=3", "--warmup=1"]
    r = run_benchmark([*argv, "--steady_rounds=2"], tmp_path / "out.json")
    assert len(r["steady_step_seconds_rounds"]) == 2
    assert r["steady_step_seconds"] == statistics.median(r["steady_step_seconds_rounds"])
    assert r["train_tgt_tokens_per_sec_steady"] == pytest.approx(
        r["batch_tgt_tokens_median"] / r["steady_step_seconds"]
    )
    assert r["mfu_steady"] == pytest.approx(
        r["model_flops_per_step"] / r["steady_step_seconds"] / r["peak_flops_per_sec"]
    )
    assert r["mfu_published_steady"] is None  # no published peak for a CPU
    assert 0 < r["steady_put_batch_seconds"] and 0 < r["steady_dispatch_seconds"]
    assert r["nonfinite_steps"] == 0
    assert r["packed"] is True  # the trainer's step
    # The step on nnx.State trees, without the steady state: the same figures otherwise.
    off = run_benchmark([*argv, "--steady_rounds=0", "--packed=false"], tmp_path / "off.json")
    assert off["steady_step_seconds"] is None and "mfu_steady" not in off
    assert off["packed"] is False and off["nonfinite_steps"] == 0


def test_an_untrained_model_decodes_with_a_vocabulary_and_no_parallel_text(files, tmp_path):
    argv = ["--skip_training", "--config=tiny", f"--vocab={files}/vocab.model"]
    # The tiny config asks for 200 pieces and the vocabulary has 64: the model decoded is the
    # one the trainer would build with it, so every id it emits decodes.
    argv += [f"--decode_src={files}/src.txt", "--decode_num=4", "--ctranslate2=false"]
    argv += [f"--decode_profile={tmp_path}/profile"]
    r = run_benchmark(argv, tmp_path / "out.json")
    assert r["decode_sentences"] == 4 and r["decode_model"].startswith("untrained")
    # --decode_profile: each search at the config's batch size and at one sentence, by op.
    profile = json.loads((tmp_path / "profile" / "decode_profile.json").read_text())
    assert sorted(profile) == ["beam4_batch1", "beam4_batch8", "greedy_batch1", "greedy_batch8"]
    assert all(summary["kinds"] and summary["op_calls"] > 0 for summary in profile.values())


@pytest.mark.slow  # 44 s of compilations (five tiny steps); the steady-state test stays
def test_variants_and_several_steps_per_call_are_timed_per_step_in_turn(files, tmp_path):
    # One run for both (each costs a benchmark's compilations): --variant times the config's
    # step and each variant's in turn; --steps_per_call=2 runs two steps a call, with the moving
    # average carried through them.
    argv = ["--config=tiny", f"--src={files}/src.txt", f"--tgt={files}/tgt.txt"]
    argv += [f"--vocab={files}/vocab.model", "--batch_tokens=512", "--steps=4", "--warmup=2"]
    argv += ["--steps_per_call=2", "--steady_rounds=1", "--config.train.ema_decay=0.9"]
    argv += ["--variant_rounds=3", "--variant=model.d_ff=96 model.dropout_bits=hash"]
    r = run_benchmark(argv, tmp_path / "out.json")
    assert r["steps_per_call"] == 2 and r["timed_steps"] == 4 and r["nonfinite_steps"] == 0
    assert r["step_seconds_min"] <= r["step_seconds_median"] <= r["step_seconds_max"]
    assert len(r["steady_step_seconds_rounds"]) == 1
    config, wider = r["variants"]
    assert [v["variant"] for v in r["variants"]] == [
        "the config",
        "model.d_ff=96 model.dropout_bits=hash",
    ]
    # Each ran its own config: the wider feed-forward layers have more parameters.
    assert wider["parameters"] > config["parameters"]
    for v in r["variants"]:
        assert len(v["step_seconds_rounds"]) == len(v["cpu_seconds_rounds"]) == 3
        assert v["step_seconds"] == statistics.median(v["step_seconds_rounds"])
        assert v["cpu_seconds"] == statistics.median(v["cpu_seconds_rounds"])
        assert v["nonfinite_steps"] == 0
        ratios = [w / c for w, c in zip(v["step_seconds_rounds"], config["step_seconds_rounds"])]
        assert v["step_ratio"] == pytest.approx(statistics.median(ratios))
    assert config["step_ratio"] == config["cpu_ratio"] == 1.0


@pytest.mark.parametrize(
    "variant, message",
    [
        ("data.row_len=16", "would change the batches"),
        ("train.grad_accum_steps=2", "would change the batches"),
        ("model.d_ff", "is not section.field=value"),
        ("model.no_such_field=1", "no_such_field"),
        ("model.dropout_rate=1.5", "dropout_rate"),
        ("  ", "give overrides"),
    ],
)
def test_a_bad_variant_is_refused_naming_it_before_any_timing(files, tmp_path, variant, message):
    from scripts import benchmark

    argv = ["--config=tiny", f"--src={files}/src.txt", f"--tgt={files}/tgt.txt"]
    argv += [f"--variant={variant}"]
    with pytest.raises(SystemExit) as stopped:
        benchmark.main(argv)
    assert message in str(stopped.value) and "--variant" in str(stopped.value)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--steps_per_call=0"], "--steps_per_call=0: must be >= 1"),
        (["--steps_per_call=2", "--steps=3", "--warmup=2"], "must be multiples of it"),
        (["--steps_per_call=2", "--steps=4", "--warmup=3"], "must be multiples of it"),
        (["--steps_per_call=2", "--steps=4", "--warmup=2", "--packed=false"], "Packed"),
    ],
)
def test_bad_steps_per_call_are_refused(files, flags, message):
    from scripts import benchmark

    argv = ["--config=tiny", f"--src={files}/src.txt", f"--tgt={files}/tgt.txt", *flags]
    with pytest.raises(SystemExit) as stopped:
        benchmark.main(argv)
    assert message in str(stopped.value)
