r"""Training and decoding speed of a config on this machine's devices, with utilisation.

    translate-data wmt_sample --dir=data/wmt_sample     # the 10,000 WMT pairs, once
    python -m scripts.benchmark --config=configs/small.py --src=data/wmt_sample/train.en \
        --tgt=data/wmt_sample/train.de --batch_tokens=2048 [--vocab=SPM_MODEL] [--steps=30] \
        [--warmup=3] [--decode_src=FILE] [--decode_workdir=DIR] [--decode_num=N] \
        [--json=PATH] [--config.SECTION.FIELD=VALUE ...]
    python -m scripts.benchmark --skip_training --decode_src=FILE [--decode_num=N] \
        [--decode_ref=FILE] [--ctranslate2=false] [--huggingface] [--decode_profile=DIR] \
        (--decode_workdir=DIR | --config=CONFIG (--src=SRC --tgt=TGT | --vocab=SPM_MODEL))

Training: batches of `batch_tokens` target token slots (and as many source slots) packed from
the files as the trainer packs them, through the trainer's own jitted step (with the moving
average of `train.ema_decay`) on a mesh of every device; after `warmup` steps, each of `steps`
is timed until its results are ready (medians), then the steady state (`steady_rounds`)
dispatches the same steps without waiting, as the trainer does, and waits once a round. The
model's vocabulary is the config's `data.vocab_size` even when the BPE model learned is smaller.
Model FLOPs come from the batch's shapes, padding excluded and included (`_padded`); MFU divides
their rate by this script's matmul peak (`mfu`) and the maker's published dense peak
(`mfu_published`, null on CPUs). Decoding (--decode_src): beam 4 and greedy in the evaluator's
length-sorted batches, compilation timed apart, with --decode_workdir's model or an untrained
one (a worst case: it seldom emits EOS), and the exported engines on the same sentences:
CTranslate2 in float32 and int8, transformers with --huggingface (`*_same_as_ours_*`: the share
of translations equal to ours; set OMP_WAIT_POLICY=passive on busy cores); --decode_profile
traces each search, warm, at the decode batch size and at one sentence, and prints XLA's ops by
kind (scripts/profile_summary.py). --variant times the
config's step and each variant's in turn in one process, `variant_rounds` rounds, as ratios.
docs/speed.md ("Measure it") says more; --json writes every figure (BENCHMARKS.md lists them).
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import pathlib
import resource
import statistics
import tempfile
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from translate import cli, provenance, sharding
from translate.config import Config, apply_override, load_config
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import tokenize_parallel
from translate.data.text import ParallelText, read_lines, read_parallel, sample_sentences
from translate.data.tokenizer import Tokenizer, train_tokenizer
from translate.decoding import metrics
from translate.decoding.sentences import DecodeTimes, translate_sentences
from translate.decoding.settings import decode_settings
from translate.devices import published_peak, resolve_dtype
from translate.engines import ctranslate2 as export_ctranslate2
from translate.engines import huggingface as export_huggingface
from translate.flags import Flag, parse_flags
from translate.models import flops
from translate.models.factory import make_model
from translate.models.precision import product_dtype
from translate.trained import load_model
from translate.training.steps import Packed, make_steps

FLAGS = {
    "config": Flag("", "A config file or an example config's name (see translate-train --help)."),
    "src": Flag("", "Source side of the parallel text that batches are packed from."),
    "tgt": Flag("", "Target side, aligned with --src."),
    "batch_tokens": Flag(2048, "Target token slots per batch (and as many source slots)."),
    "vocab": Flag("", "A SentencePiece model to use instead of training one on --src/--tgt."),
    "steps": Flag(30, "Timed training steps (after --warmup); the figures are medians."),
    "warmup": Flag(3, "Untimed training steps first (compilation)."),
    "decode_src": Flag("", "Also time beam and greedy decoding of this file's sentences."),
    "decode_workdir": Flag("", "Decode with the trained model of this workdir."),
    "decode_num": Flag(0, "Decode only the first N sentences of --decode_src (0: all)."),
    "skip_training": Flag(False, "Time decoding only (needs --decode_src)."),
    "decode_ref": Flag("", "References aligned with --decode_src: the BLEU of every search."),
    "ctranslate2": Flag(True, "Also time the model exported to CTranslate2, float32 and int8."),
    "huggingface": Flag(False, "Also time the model exported to transformers (needs torch)."),
    "engine_threads": Flag(0, "Threads of CTranslate2 and torch; 0: one per CPU core."),
    "json": Flag("", "Write every printed figure to this JSON file."),
    "packed": Flag(True, "State as steps.Packed (the trainer's); false: nnx.State trees."),
    "steady_rounds": Flag(3, "Steady rounds: steps dispatched, then waited for once (0: off)."),
    "steps_per_call": Flag(1, "Steps a call (a lax.scan); --steps, --warmup: multiples of it."),
    "variant": Flag([], "Overrides timed against the config, e.g. 'model.dropout_bits=hash'."),
    "variant_rounds": Flag(8, "Alternating rounds of --variant timing (each: every variant once)."),
    "profile": Flag("", "Trace 5 more steps into this directory; print the time per op and kind."),
    "decode_profile": Flag(
        "",
        "With --decode_src: trace beam 4 and greedy decoding, at the decode batch size and at "
        "one sentence, into this directory; print the time per op and kind of each.",
    ),
}


def matmul_peak(dtype, accumulate=None) -> tuple[float, int]:
    """Best FLOP/s of a jitted n x n matrix product on the first device over many runs, and n;
    `accumulate`: its output dtype when not `dtype` (float32 for model.matmul_dtype's bfloat16).
    The best run, not the median: a peak is what the device can do (the median of a few runs
    moved by 15% between invocations on a shared CPU)."""
    n = 2048 if jax.default_backend() == "cpu" else 8192
    a, b = (jax.random.normal(k, (n, n), dtype) for k in jax.random.split(jax.random.key(0)))
    product = jax.jit(functools.partial(jnp.matmul, preferred_element_type=accumulate))
    product(a, b).block_until_ready()
    times = []
    for _ in range(30 if jax.default_backend() == "cpu" else 100):
        start = time.perf_counter()
        product(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * n**3 / min(times), n


def peak_memory() -> tuple[int, str]:
    """Peak bytes on device 0 where the backend reports it, else the process's peak RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
    # Linux reports ru_maxrss in KiB: on the CPU, device memory is host memory.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "process peak RSS"


def get_tokenizer(flags: dict, config: Config, tmp: pathlib.Path) -> Tokenizer:
    """--vocab, else a BPE model of the config's size trained on --src and --tgt in `tmp`."""
    if flags["vocab"]:
        return Tokenizer(flags["vocab"])
    src, tgt = read_parallel(flags["src"], flags["tgt"])
    print(f"training a {config.data.vocab_size}-piece BPE model on {len(src)} pairs ...")
    text = ParallelText.from_lists(src, tgt, flags["src"])
    sample = sample_sentences(text, config.data.vocab_sample_size, seed=0)
    return train_tokenizer(sample, config.data.vocab_size, tmp / "vocab.model")


def training_batches(flags: dict, config: Config, tokenizer: Tokenizer):
    """The (corpus, pairs dropped, mesh, layout, model vocabulary size, warm-up + timed batches)."""
    src, tgt = read_parallel(flags["src"], flags["tgt"])
    corpus, dropped = tokenize_parallel(tokenizer, src, tgt, config.data.max_len)
    mesh = sharding.make_mesh()
    layout = BatchLayout.from_config(
        flags["batch_tokens"], config.data.row_len, config.train.grad_accum_steps, mesh.size
    )
    vocab_size = max(config.data.vocab_size, tokenizer.vocab_size)
    plan = plan_epoch(corpus, layout, seed=0, epoch=0)
    needed = flags["warmup"] + flags["steps"]
    plan = (plan * -(-needed // len(plan)))[:needed]
    batches = [make_batch(corpus, rows, layout) for rows in plan]
    return corpus, dropped, mesh, layout, vocab_size, batches


def calls_of(flags: dict, batches: list, mesh) -> list[Callable]:
    """The batches grouped into the calls of --steps_per_call steps, each a function that places
    its batches on the devices (one batch, or K stacked)."""
    k = flags["steps_per_call"]
    if k == 1:
        return [functools.partial(sharding.put_batch, b, mesh) for b in batches]
    groups = [batches[i : i + k] for i in range(0, len(batches), k)]
    return [functools.partial(sharding.put_batches, group, mesh) for group in groups]


def benchmark_training(flags: dict, config: Config, tokenizer: Tokenizer) -> dict:
    corpus, dropped, mesh, layout, vocab_size, batches = training_batches(flags, config, tokenizer)
    k = flags["steps_per_call"]
    steps = make_steps(config, vocab_size, mesh, steps_per_call=k)
    state, train_step = trainer_step(flags, steps)
    dropout_key = jax.random.key(1)
    calls = calls_of(flags, batches, mesh)
    times, nonfinite = [], 0
    for call, place in enumerate(calls):
        start = time.perf_counter()
        state, metrics = train_step(state, place(), call * k, dropout_key)
        jax.block_until_ready(metrics)
        nonfinite += int(np.sum(metrics["nonfinite"]))
        if call * k >= flags["warmup"]:
            times.append((time.perf_counter() - start) / k)
        if call == 0:
            print(f"first call (compilation included): {time.perf_counter() - start:.1f} s")

    timed = batches[flags["warmup"] :]
    timed_calls = calls[flags["warmup"] // k :]
    # Steady state: the loop the trainer runs, each step dispatched while the one before still
    # runs (the trainer reads its metrics a window of steps later), one wait per round.
    # The host's part of each step (placing the batch, dispatching the step) is timed too: when
    # it is as long as the step, the host bounds the speed; when the device still idles between
    # its ops with the host ahead, launching them does.
    rounds, host = [], []
    for _ in range(flags["steady_rounds"]):
        state, seconds, _, bad = steady_round(train_step, state, timed_calls, k, dropout_key, host)
        rounds.append(seconds)
        nonfinite += bad
    put_s, dispatch_s = [x for x, _ in host], [x for _, x in host]
    if flags["profile"]:
        few = timed_calls[: -(-5 // k)]
        state = profile_steps(flags["profile"], train_step, state, few, k)
    slots = layout.num_micro * layout.rows * layout.row_len  # per side
    real_src = np.array([(b.src_segments > 0).sum() for b in timed])
    real_tgt = np.array([(b.tgt_segments > 0).sum() for b in timed])
    real_flops = [
        flops.train_flops(config.model, vocab_size, *flops.batch_lengths(b)) for b in timed
    ]
    full = np.full(layout.num_micro * layout.rows, layout.row_len)  # every slot of every row
    padded_flops = flops.train_flops(config.model, vocab_size, full, full)
    step_s = statistics.median(times)
    return {
        "train_pairs": len(corpus),
        "train_pairs_dropped_over_max_len": dropped,
        "vocab_size_model": vocab_size,
        "vocab_size_tokenizer": tokenizer.vocab_size,
        "batch_layout": f"{layout.num_micro} x {layout.rows} rows x {layout.row_len} slots",
        "batch_tgt_slots": slots,
        "batch_tgt_tokens_median": float(np.median(real_tgt)),
        "batch_src_tokens_median": float(np.median(real_src)),
        "timed_steps": len(times) * k,
        # Steps whose loss or gradient was not finite (the step then left the state as it was).
        "nonfinite_steps": nonfinite,
        "step_seconds_median": step_s,
        # Steady state: the mean step of each round of len(timed) steps waited for once, and the
        # median round (null without rounds).
        "steady_step_seconds_rounds": rounds,
        "steady_step_seconds": statistics.median(rounds) if rounds else None,
        # Medians over the steady rounds' steps: the host placing a batch, dispatching a step.
        "steady_put_batch_seconds": statistics.median(put_s) if put_s else None,
        "steady_dispatch_seconds": statistics.median(dispatch_s) if dispatch_s else None,
        "step_seconds_min": min(times),
        "step_seconds_max": max(times),
        "train_steps_per_sec": 1.0 / step_s,
        # Per-step medians of tokens over the median step time.
        "train_tgt_tokens_per_sec": float(np.median(real_tgt)) / step_s,
        "train_src_tokens_per_sec": float(np.median(real_src)) / step_s,
        "padding_fraction": 1.0 - float(real_tgt.sum()) / (slots * len(timed)),
        "padding_fraction_src": 1.0 - float(real_src.sum()) / (slots * len(timed)),
        "model_flops_per_step": float(np.median(real_flops)),
        "model_flops_per_step_padded": float(padded_flops),
        "packed": flags["packed"],
        "steps_per_call": k,
        "_params": (steps.graphdef, state[0].tree() if flags["packed"] else state[0]),
    }


def steady_round(train_step, state, calls, k: int, key, host=None) -> tuple:
    """Dispatches `calls` of `k` steps, then waits once: (state, wall and CPU seconds a step,
    non-finite steps); `host` gets each call's seconds placing and dispatching, a step."""
    start, start_cpu, outs = time.perf_counter(), time.process_time(), []
    for call, place in enumerate(calls):
        t0 = time.perf_counter()
        placed = place()
        t1 = time.perf_counter()
        state, metrics = train_step(state, placed, call * k, key)
        if host is not None:
            host.append(((t1 - t0) / k, (time.perf_counter() - t1) / k))
        outs.append(metrics["nonfinite"])
    jax.block_until_ready((state, outs))
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    nonfinite = int(sum(np.sum(np.asarray(x)) for x in outs))
    return state, wall / (len(calls) * k), cpu / (len(calls) * k), nonfinite


def trainer_step(flags: dict, steps) -> tuple[list, Callable]:
    """The first state and the step the trainer calls, as (state, batch, step, key) -> (state,
    metrics): with --packed (the trainer's) the parameters and Adam's state as `Packed`, and with
    train.ema_decay the moving average too, updated in the same call; with --packed=false the
    step on nnx.State trees, without the average."""
    params, opt_state = steps.init(jax.random.key(0))
    if not flags["packed"]:
        state, call = [params, opt_state], steps.train
    else:  # the average starts from the parameters, in buffers of its own (each call donates)
        average = [] if steps.ema is None else [Packed.of(steps.init(jax.random.key(0))[0])]
        state = [Packed.of(params), Packed.of(opt_state), *average]
        call = steps.packed_train_many or steps.packed_train_ema or steps.packed_train

    def step_fn(state, batch, step, key):
        *state, metrics = call(*state, batch, step, key)
        return state, metrics

    return state, step_fn


def profile_steps(directory, train_step, state, calls, k: int) -> list:
    """Traces `calls` more calls of `k` steps each, prints the time per op; returns the state."""
    from scripts import profile_summary

    with jax.profiler.trace(directory, create_perfetto_trace=True):
        for call, place in enumerate(calls):
            state, metrics = train_step(state, place(), call * k, jax.random.key(2))
        jax.block_until_ready(metrics)
    summary = profile_summary.summarise(profile_summary.find_trace(pathlib.Path(directory)))
    print(f"profile of {len(calls) * k} steps:")
    profile_summary.print_summary(summary)
    out = pathlib.Path(directory) / "profile_summary.json"
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return state


def profile_decoding(directory, config: Config, graphdef, params, tokenizer, sentences) -> None:
    """Traces each search at each of PROFILED's batch sizes into DIR/SEARCH_batchN (compiled
    before the trace), prints where the time went and writes DIR/decode_profile.json."""
    from scripts import profile_summary

    found = {}
    for name, beam in SEARCHES:
        for count, batch in PROFILED:
            batch = batch or config.decode.batch_size
            settings = decode_settings(config.decode, {"beam_size": beam, "batch_size": batch})
            chosen = sentences[:count]
            path = pathlib.Path(directory) / f"{name}_batch{batch}"

            def decode(chosen=chosen, settings=settings):
                return translate_sentences(
                    (graphdef,), (params,), tokenizer, chosen, settings, config.data.max_len
                )

            decode()  # every program compiled before the trace
            with jax.profiler.trace(str(path), create_perfetto_trace=True):
                decode()
            summary = profile_summary.summarise(profile_summary.find_trace(path))
            print(f"profile of {name}, batches of {batch}, {len(chosen)} sentences:")
            profile_summary.print_summary(summary)
            found[f"{name}_batch{batch}"] = summary
    out = pathlib.Path(directory) / "decode_profile.json"
    out.write_text(json.dumps(found, indent=2) + "\n")


def parse_variant(text: str) -> dict[str, str]:
    """One --variant's overrides, `section.field -> text`; refuses what would change the batches."""
    if not text.split():
        raise SystemExit("--variant='': give overrides such as 'model.dropout_bits=hash'")
    overrides = {}
    for item in text.split():
        dotted, equals, value = item.removeprefix("--config.").partition("=")
        if not equals or dotted.count(".") != 1:
            raise SystemExit(f"--variant={text!r}: {item!r} is not section.field=value")
        if dotted.split(".")[0] not in ("model", "train") or dotted == "train.grad_accum_steps":
            raise SystemExit(
                f"--variant={text!r}: {dotted} would change the batches; a variant sets model "
                "and train fields only (not train.grad_accum_steps)"
            )
        overrides[dotted] = value
    return overrides


def variant_configs(flags: dict, overrides: dict[str, str]) -> list[tuple[str, Config]]:
    """(label, config) of each --variant: the config with the command line's overrides and then
    the variant's; a bad field or value names the variant."""
    configs = []
    for text in flags["variant"]:
        try:
            configs.append((text, load_config(flags["config"], overrides | parse_variant(text))))
        except ValueError as e:
            raise SystemExit(f"--variant={text!r}: {e}") from None
    return configs


def benchmark_variants(flags: dict, configs: list[tuple[str, Config]], tokenizer) -> list[dict]:
    """Times the steady step of each (label, config) in turn, round after round, the order
    rotating; the first is the reference of every ratio (median of per-round ratios)."""
    base = configs[0][1]
    *_, mesh, layout, vocab_size, batches = training_batches(flags, base, tokenizer)
    k = flags["steps_per_call"]
    calls = calls_of(flags, batches, mesh)
    timed = calls[flags["warmup"] // k :]
    key = jax.random.key(1)
    runs = []
    for label, config in configs:
        steps = make_steps(config, vocab_size, mesh, steps_per_call=k)
        state, train_step = trainer_step(flags, steps)
        params = state[0].tree() if flags["packed"] else state[0]
        size = sum(x.size for x in jax.tree.leaves(params))
        for call, place in enumerate(calls[: max(1, flags["warmup"] // k)]):  # compiles
            state, metrics = train_step(state, place(), call * k, key)
        jax.block_until_ready(metrics)
        runs.append({"label": label, "step": train_step, "state": state, "size": size})
    wall, cpu, nonfinite = [[] for _ in runs], [[] for _ in runs], [0 for _ in runs]
    for turn in range(flags["variant_rounds"]):
        for i in [(turn + j) % len(runs) for j in range(len(runs))]:  # the order rotates
            run = runs[i]
            run["state"], w, c, bad = steady_round(run["step"], run["state"], timed, k, key)
            wall[i].append(w)
            cpu[i].append(c)
            nonfinite[i] += bad
    return [
        {
            "variant": run["label"],
            "parameters": run["size"],
            "step_seconds_rounds": wall[i],
            "cpu_seconds_rounds": cpu[i],
            "step_seconds": statistics.median(wall[i]),
            "cpu_seconds": statistics.median(cpu[i]),
            # Medians over rounds of this variant's time over the reference's, same round.
            "step_ratio": statistics.median(w / r for w, r in zip(wall[i], wall[0])),
            "cpu_ratio": statistics.median(c / r for c, r in zip(cpu[i], cpu[0])),
            "nonfinite_steps": nonfinite[i],
        }
        for i, run in enumerate(runs)
    ]


def print_variants(variants: list[dict]) -> None:
    print(f"variants, {len(variants[0]['step_seconds_rounds'])} alternating rounds (medians):")
    print(f"  {'variant':44s} {'step ms':>8s} {'x config':>9s} {'CPU ms':>8s} {'x config':>9s}")
    for v in variants:
        print(
            f"  {v['variant'][:44]:44s} {1e3 * v['step_seconds']:8.1f} {v['step_ratio']:9.3f} "
            f"{1e3 * v['cpu_seconds']:8.1f} {v['cpu_ratio']:9.3f}"
            + (f"  ({v['nonfinite_steps']} non-finite steps)" if v["nonfinite_steps"] else "")
        )


def init_params(config: Config, vocab_size: int):
    """A freshly initialised model's (graphdef, params) on the default device."""
    model = make_model(config.model, vocab_size, nnx.Rngs(params=jax.random.key(0)))
    return nnx.split(model, nnx.Param)


SEARCHES = (("beam4", 4), ("greedy", 1))
# What --decode_profile traces of --decode_src, warm: the first 64 sentences in batches of the
# config's size, and the first 8 one at a time (a user's line).
PROFILED = ((64, None), (8, 1))


def benchmark_decoding(flags: dict, config: Config, graphdef, params, tokenizer) -> dict:
    sentences = read_lines(flags["decode_src"])[: flags["decode_num"] or None]
    references = None
    if flags["decode_ref"]:
        references = read_lines(flags["decode_ref"])[: len(sentences)]
        if len(references) != len(sentences):
            raise SystemExit(f"--decode_ref={flags['decode_ref']}: fewer lines than --decode_src")
    out = {"decode_sentences": len(sentences), "decode_batch_size": config.decode.batch_size}
    ours = {}
    for name, beam in SEARCHES:
        settings = decode_settings(config.decode, {"beam_size": beam})
        times = DecodeTimes()
        start = time.perf_counter()
        translations = translate_sentences(
            (graphdef,), (params,), tokenizer, sentences, settings, config.data.max_len, times=times
        )
        ours[name] = hypotheses = [best[0][1] for best in translations]
        wall = time.perf_counter() - start
        tokens = sum(len(ids) + 1 for ids in tokenizer.encode_target(hypotheses))  # + EOS
        seconds = times.decode_seconds
        out[f"decode_seconds_{name}"] = seconds
        out[f"decode_sentences_per_sec_{name}"] = len(sentences) / seconds
        out[f"decode_tokens_per_sec_{name}"] = tokens / seconds
        out[f"decode_compile_seconds_{name}"] = times.compile_seconds
        out[f"decode_num_compiles_{name}"] = len(times.shapes)
        # Compiling, decoding, and the host's tokenizing and detokenizing: what a user waits.
        out[f"decode_wall_seconds_{name}"] = wall
        out[f"decode_tokens_{name}"] = tokens
        if references is not None:
            out[f"decode_bleu_{name}"] = score(hypotheses, references, config)
    if flags["decode_profile"]:
        profile_decoding(flags["decode_profile"], config, graphdef, params, tokenizer, sentences)
    if flags["ctranslate2"] or flags["huggingface"]:
        out["engines"] = []
        with tempfile.TemporaryDirectory() as tmp:
            engines = exported_engines(flags, config, graphdef, params, tokenizer, tmp, out)
            for engine, translate in engines:
                out["engines"].append(engine)
                out.update(time_engine(config, engine, translate, sentences, ours, references))
    return out


def score(hypotheses: list[str], references: list[str], config: Config) -> float:
    return metrics.score(hypotheses, references, config.data.tgt_lang)["bleu"]


def exported_engines(flags: dict, config: Config, graphdef, params, tokenizer, tmp: str, out):
    """Yields (name, translate(sentences, beam_size) -> texts) of each exported engine, loaded
    when its turn comes; `out` gets its load seconds, or why it was skipped."""
    model = nnx.merge(graphdef, params)
    directory = pathlib.Path(tmp)
    d = config.decode
    options = dict(length_penalty=d.length_penalty, max_extra_len=d.max_extra_len)
    options.update(max_len=config.data.max_len, batch_size=d.batch_size)
    skipped = out.setdefault("engines_skipped", {})
    threads = flags["engine_threads"] or os.cpu_count() or 1
    out["engine_threads"] = threads
    if flags["ctranslate2"]:
        reason = export_ctranslate2.unsupported_reason(config.model)
        try:
            import ctranslate2
        except ImportError:
            reason = "the ctranslate2 package is not installed"
        if reason:
            skipped["ctranslate2"] = reason
        else:
            path = directory / "ctranslate2"
            path.mkdir()
            export_ctranslate2.write(model, config.model, tokenizer, path)
            decoder_only = config.model.architecture == "decoder_only"
            kind = ctranslate2.Generator if decoder_only else ctranslate2.Translator
            for compute_type in ("float32", "int8"):
                name, start = f"ctranslate2_{compute_type}", time.perf_counter()
                engine = kind(str(path), compute_type=compute_type, intra_threads=threads)
                out[f"{name}_load_seconds"] = time.perf_counter() - start
                out[f"{name}_device"] = engine.device
                yield (
                    name,
                    functools.partial(export_ctranslate2.translate, engine, tokenizer, **options),
                )
                del engine
    if not flags["huggingface"]:
        return
    reason = export_huggingface.unsupported_reason(config.model)
    try:
        import torch
        import transformers
    except ImportError:
        reason = "transformers or torch is not installed"
    if reason:
        skipped["huggingface"] = reason
        return
    path = directory / "huggingface"
    path.mkdir()
    export_huggingface.write(model, config.model, tokenizer, path)
    torch.set_num_threads(threads)
    epsilon = float(model.decoder[0].norm1.epsilon)
    for name, our_epsilon in (("transformers", True), ("transformers_epsilon_1e-5", False)):
        start = time.perf_counter()
        engine = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(path)).eval()
        if our_epsilon:
            export_huggingface.match_layer_norm_epsilon(engine, epsilon)
        out[f"{name}_load_seconds"] = time.perf_counter() - start
        yield name, functools.partial(export_huggingface.translate, engine, tokenizer, **options)
        del engine


def time_engine(config, name, translate, sentences, ours, references) -> dict:
    """One engine's speed on the sentences, and how its output compares with ours."""
    out = {}
    for search, beam in SEARCHES:
        start = time.perf_counter()
        translate(sentences[: config.decode.batch_size], beam_size=beam)
        out[f"{name}_first_call_seconds_{search}"] = time.perf_counter() - start
        start = time.perf_counter()
        hypotheses = translate(sentences, beam_size=beam)
        seconds = time.perf_counter() - start
        same = sum(h == o for h, o in zip(hypotheses, ours[search], strict=True))
        out[f"{name}_seconds_{search}"] = seconds
        out[f"{name}_sentences_per_sec_{search}"] = len(sentences) / seconds
        out[f"{name}_same_as_ours_{search}"] = same / len(sentences)
        if references is not None:
            out[f"{name}_bleu_{search}"] = score(hypotheses, references, config)
        rate = len(sentences) / seconds
        print(f"{name} {search}: {rate:.1f} sentences/s, {same}/{len(sentences)} the same as ours")
    return out


def environment() -> dict:
    found, device = provenance.git_commit(), jax.devices()[0]
    return {
        "date": datetime.date.today().isoformat(),
        "commit": found["commit"][:7] if found else "",
        "device": f"{len(jax.devices())} x {device.device_kind} ({jax.default_backend()})",
        "device_kind": device.device_kind,
        "cpu_count": os.cpu_count(),
        **provenance.package_versions(),
    }


def check_flags(flags: dict) -> None:
    if flags["engine_threads"] < 0:
        raise SystemExit(f"--engine_threads={flags['engine_threads']}: must be >= 0")
    if flags["skip_training"]:
        if flags["variant"]:
            raise SystemExit("--variant times training steps: it cannot go with --skip_training")
        if not flags["decode_src"]:
            raise SystemExit("--skip_training measures decoding only: give --decode_src")
        needed = ["config"] + ([] if flags["vocab"] else ["src", "tgt"])
        for name in [] if flags["decode_workdir"] else needed:
            if not flags[name]:
                raise SystemExit(
                    f"--{name} is needed to decode an untrained model (or --decode_workdir)"
                )
        return
    k = flags["steps_per_call"]
    if k < 1:
        raise SystemExit(f"--steps_per_call={k}: must be >= 1")
    if k > 1 and (flags["steps"] % k or flags["warmup"] % k):
        raise SystemExit(
            f"--steps_per_call={k}: --steps={flags['steps']} and --warmup={flags['warmup']} "
            "must be multiples of it"
        )
    if k > 1 and not flags["packed"]:
        raise SystemExit(f"--steps_per_call={k} runs the trainer's Packed step: not --packed=false")
    if flags["variant"] and flags["variant_rounds"] < 1:
        raise SystemExit(f"--variant_rounds={flags['variant_rounds']}: must be >= 1")
    for name in ("config", "src", "tgt"):
        if not flags[name]:
            raise SystemExit(f"--{name} is required")


def benchmark_training_speed(flags: dict, config: Config, result: dict):
    """Adds the training figures to `result`; returns the tokenizer, graphdef and params."""
    dtype = resolve_dtype(config.model.compute_dtype)
    result["compute_dtype"] = jnp.dtype(dtype).name
    # The operands of the model's large products (model.matmul_dtype) set the peak.
    operands = product_dtype(config.model, dtype)
    accumulate = jnp.float32 if operands != jnp.dtype(dtype) else None
    result["matmul_dtype"] = operands.name
    peak, n = matmul_peak(operands, accumulate)
    result["peak_flops_per_sec"], result["peak_matmul_size"] = peak, n
    published = published_peak(jax.devices()[0].device_kind, operands.name)
    result["published_peak_flops_per_sec"] = published
    print(
        f"{result['device']}, JAX {result['jax']}; matmul peak {peak / 1e9:.1f} GFLOP/s "
        f"({n}x{n} {operands.name}{'' if accumulate is None else ' into float32'}); published "
        + ("peak unknown" if published is None else f"dense peak {published / 1e12:.1f} TFLOP/s")
    )

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = get_tokenizer(flags, config, pathlib.Path(tmp))
        train = benchmark_training(flags, config, tokenizer)
    graphdef, params = train.pop("_params")
    result.update(train)
    step_s = result["step_seconds_median"]
    result["model_flops_per_sec"] = result["model_flops_per_step"] / step_s
    steady = result["steady_step_seconds"]
    for key, seconds in (("", step_s), ("_steady", steady)):
        if seconds is None:
            continue
        if key:
            result[f"train_tgt_tokens_per_sec{key}"] = result["batch_tgt_tokens_median"] / seconds
        for padded in ("", "_padded"):
            flops_per_sec = result[f"model_flops_per_step{padded}"] / seconds
            result[f"mfu{padded}{key}"] = flops_per_sec / peak
            result[f"mfu_published{padded}{key}"] = published and flops_per_sec / published
    result["peak_memory_bytes"], result["peak_memory_source"] = peak_memory()
    return tokenizer, graphdef, params


def main(argv: list[str]) -> None:
    flags, overrides = parse_flags(argv, FLAGS, doc=__doc__)
    check_flags(flags)
    config = load_config(flags["config"], overrides) if flags["config"] else None
    result = {"config": flags["config"], "overrides": overrides, **environment()}

    variants = variant_configs(flags, overrides)  # refused now, not after the timings
    tokenizer = graphdef = params = None
    if not flags["skip_training"]:
        tokenizer, graphdef, params = benchmark_training_speed(flags, config, result)
        if variants:
            result["variants"] = benchmark_variants(
                flags, [("the config", config), *variants], tokenizer
            )

    if flags["decode_src"]:
        if flags["decode_workdir"]:
            graphdef, params, tokenizer, config, _ = load_model(flags["decode_workdir"])
            # The trained model's config, with the command line's decoding settings.
            for dotted, text in overrides.items():
                if dotted.startswith("decode."):
                    apply_override(config, dotted, text)
            result["decode_model"] = f"trained: {flags['decode_workdir']}"
        else:
            if tokenizer is None:  # with --vocab, check_flags let --src and --tgt go
                with tempfile.TemporaryDirectory() as tmp:
                    tokenizer = get_tokenizer(flags, config, pathlib.Path(tmp))
            if params is None or tokenizer.vocab_size < config.data.vocab_size:
                # The model the trainer would build with this vocabulary: every id it emits
                # decodes (the training figures' model may be wider, at the config's size).
                graphdef, params = init_params(config, tokenizer.vocab_size)
            else:
                params = sharding.local_copy(params)
            result["decode_model"] = "untrained (outputs run to the length limit)"
        result["decode_compute_dtype"] = jnp.dtype(resolve_dtype(config.model.compute_dtype)).name
        result.update(benchmark_decoding(flags, config, graphdef, params, tokenizer))
        if flags["skip_training"]:
            result["peak_memory_bytes"], result["peak_memory_source"] = peak_memory()

    print_table(result)
    if "variants" in result:
        print_variants(result["variants"])
    if flags["json"]:
        pathlib.Path(flags["json"]).write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {flags['json']}")


def percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


SPREAD = ("median", "min", "max")


def print_table(r: dict) -> None:
    rows = {}
    if "step_seconds_median" in r:
        median, low, high = (f"{1e3 * r[f'step_seconds_{k}']:.1f}" for k in SPREAD)
        rows["batch"] = f"{r['batch_layout']}; median {r['batch_tgt_tokens_median']:.0f} target, "
        rows["batch"] += f"{r['batch_src_tokens_median']:.0f} source tokens"
        rows["padding fraction"] = f"{r['padding_fraction']:.3f} target, "
        rows["padding fraction"] += f"{r['padding_fraction_src']:.3f} source"
        rows["vocabulary"] = f"{r['vocab_size_model']} ({r['vocab_size_tokenizer']} learned)"
        rows["step time"] = f"{median} ms over {r['timed_steps']} steps (min {low}, max {high})"
        if r["steady_step_seconds"] is None:
            rows["steady state"] = "off (--steady_rounds=0)"
        else:
            each = ", ".join(f"{1e3 * x:.1f}" for x in r["steady_step_seconds_rounds"])
            rows["steady state"] = (
                f"{r['steady_step_seconds'] * 1e3:.1f} ms/step, "
                f"{r['train_tgt_tokens_per_sec_steady']:.0f} target tokens/s, MFU "
                f"{percent(r['mfu_steady'])} of measured, {percent(r['mfu_published_steady'])} "
                f"of published (rounds: {each} ms)"
            )
            rows["host per step"] = (
                f"placing the batch {r['steady_put_batch_seconds'] * 1e3:.2f} ms, dispatching "
                f"the step {r['steady_dispatch_seconds'] * 1e3:.2f} ms (medians)"
            )
        rows["non-finite steps"] = f"{r['nonfinite_steps']} (loss or gradient; update skipped)"
        rows["target tokens/s"] = f"{r['train_tgt_tokens_per_sec']:.0f} (non-pad; source "
        rows["target tokens/s"] += f"{r['train_src_tokens_per_sec']:.0f})"
        rows["model FLOPs/step"] = f"{r['model_flops_per_step'] / 1e9:.1f} G real, "
        rows["model FLOPs/step"] += f"{r['model_flops_per_step_padded'] / 1e9:.1f} G padded"
        rows["MFU (measured peak)"] = (
            f"{percent(r['mfu'])} (padded {percent(r['mfu_padded'])}) of "
            f"{r['peak_flops_per_sec'] / 1e9:.0f} GFLOP/s, {r['matmul_dtype']} matmul"
        )
        published = r["published_peak_flops_per_sec"]
        rows["MFU (published peak)"] = (
            "n/a: no published peak for this device and dtype"
            if published is None
            else f"{percent(r['mfu_published'])} (padded {percent(r['mfu_published_padded'])}) "
            f"of {published / 1e12:.1f} TFLOP/s"
        )
    if "peak_memory_bytes" in r:
        rows["peak memory"] = (
            f"{r['peak_memory_bytes'] / 2**20:.0f} MiB ({r['peak_memory_source']})"
        )
    for name in ("beam4", "greedy") if "decode_sentences" in r else ():
        rows[f"decode {name}"] = (
            f"{r[f'decode_sentences_per_sec_{name}']:.1f} sentences/s, "
            f"{r[f'decode_tokens_per_sec_{name}']:.0f} tokens/s ({r['decode_sentences']} "
            f"sentences in {r[f'decode_seconds_{name}']:.2f} s; batch shapes compiled: "
            f"{r[f'decode_num_compiles_{name}']}, in {r[f'decode_compile_seconds_{name}']:.2f} s)"
        )
        rows["decode model"] = f"{r['decode_model']}, {r['decode_compute_dtype']}"
        if f"decode_bleu_{name}" in r:
            rows[f"ours BLEU {name}"] = str(r[f"decode_bleu_{name}"])
    for engine in r.get("engines", []):
        for name in ("beam4", "greedy"):
            bleu = r.get(f"{engine}_bleu_{name}")
            rows[f"{engine} {name}"] = (
                f"{r[f'{engine}_sentences_per_sec_{name}']:.1f} sentences/s "
                f"({r[f'{engine}_seconds_{name}']:.2f} s; first call "
                f"{r[f'{engine}_first_call_seconds_{name}']:.2f} s); the same as ours: "
                f"{percent(r[f'{engine}_same_as_ours_{name}'])}"
                + ("" if bleu is None else f"; BLEU {bleu}")
            )
    for engine, reason in r.get("engines_skipped", {}).items():
        rows[engine] = f"skipped: {reason}"
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    cli.run(main)
