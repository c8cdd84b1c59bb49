"""Where a profiled step's time went: device ops from a JAX profiler trace, summed by name.

    python -m scripts.profile_summary DIR [--top=30] [--json=PATH]

DIR is a `jax.profiler.trace(DIR, create_perfetto_trace=True)` directory (scripts/benchmark.py
--profile=DIR writes one); its newest `perfetto_trace.json.gz` is read. Summed: on a GPU the
events of the device's streams (processes named "/device:..."); on a CPU the XLA ops on the
host's threads (events naming an `hlo_op`, one per op in JAX 0.10; the executor's spans and
Python's frames hold the same time again); in a CPU trace without op names, every complete
event. Each event counts its own time, less the events nested in it on its thread (a `while` op
less its body's), so nothing counts twice. Two tables, each row's total, share, calls and mean:
by kind (the name less its number, `ynn_fusion.155` -> `ynn_fusion`) and the largest ops.
Standard library only: it runs wherever the trace file is copied.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import re

SCOPES = {True: "XLA ops on the host's threads", False: "every event, host threads included"}


def find_trace(root: pathlib.Path) -> pathlib.Path:
    if root.is_file():
        return root
    found = sorted(root.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(
            f"{root}: no perfetto_trace.json.gz under it (profile with create_perfetto_trace=True)"
        )
    return found[-1]


def summarise(trace_path: pathlib.Path, top: int = 30) -> dict:
    """Time per op name and per kind (see above), in microseconds, largest first."""
    opener = gzip.open if trace_path.suffix == ".gz" else open
    try:
        with opener(trace_path, "rt", encoding="utf-8") as f:
            trace = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SystemExit(f"{trace_path}: not a readable trace ({err})") from None
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    meta = [(e, e.get("args", {}).get("name", "")) for e in events if e.get("ph") == "M"]
    names = {e["pid"]: name for e, name in meta if e.get("name") == "process_name"}
    threads = {(e["pid"], e["tid"]): name for e, name in meta if e.get("name") == "thread_name"}
    device_pids = {pid for pid, name in names.items() if "/device:" in name}
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    named_ops = not device_pids and any(is_xla_op(e) for e in complete)
    kept = [
        e
        for e in complete
        if (not device_pids or e.get("pid") in device_pids) and (not named_ops or is_xla_op(e))
    ]
    per_thread: collections.Counter[str] = collections.Counter()
    totals: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    first, last = None, None
    for e, own in zip(kept, self_times(kept)):
        totals[e["name"]] += own
        where = f"{names.get(e['pid'], e['pid'])} / {threads.get((e['pid'], e.get('tid')), '')}"
        per_thread[where] += own
        calls[e["name"]] += 1
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
    summed = sum(totals.values())
    kinds: collections.Counter[str] = collections.Counter()
    kind_calls: collections.Counter[str] = collections.Counter()
    for name, us in totals.items():
        kinds[op_kind(name)] += us
        kind_calls[op_kind(name)] += calls[name]

    def row(us: float, count: int) -> dict:
        return {"total_us": round(us, 1), "share": us / summed if summed else 0.0, "calls": count}

    by_kind = [{"kind": k, **row(us, kind_calls[k])} for k, us in kinds.most_common(top)]
    rows = [
        {"name": name, **row(us, calls[name]), "mean_us": round(us / calls[name], 2)}
        for name, us in totals.most_common(top)
    ]
    return {
        "trace": str(trace_path),
        "device_processes": sorted(names[p] for p in device_pids),
        "scope": "device streams" if device_pids else SCOPES[named_ops],
        "summed_us": round(summed, 1),
        "span_us": round(last - first, 1) if first is not None else 0.0,
        "distinct_ops": len(totals),
        "op_calls": sum(calls.values()),
        "per_thread_us": {k: round(v, 1) for k, v in per_thread.most_common(12)},
        "kinds": by_kind,
        "top": rows,
    }


def self_times(events: list[dict]) -> list[float]:
    """Each event's duration less the events nested in it on its own thread (microseconds).

    A CPU op that runs others (XLA's `while` and `call` thunks, the body's ops inside them) and a
    host span around its callees would otherwise count the same time twice.
    """
    own = [float(e["dur"]) for e in events]
    by_thread: dict = collections.defaultdict(list)
    for i, e in enumerate(events):
        by_thread[(e.get("pid"), e.get("tid"))].append(i)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (float(events[i]["ts"]), -float(events[i]["dur"])))
        open_spans: list[tuple[float, int]] = []  # (end, index), innermost last
        for i in indices:
            start = float(events[i]["ts"])
            end = start + float(events[i]["dur"])
            while open_spans and open_spans[-1][0] <= start:
                open_spans.pop()
            if open_spans and end <= open_spans[-1][0]:
                own[open_spans[-1][1]] -= float(events[i]["dur"])
            open_spans.append((end, i))
    return own


def is_xla_op(event: dict) -> bool:
    return "hlo_op" in event.get("args", {})


def op_kind(name: str) -> str:
    """An op's name less its number: `ynn_fusion.155` and `ynn_fusion` -> `ynn_fusion`."""
    return re.sub(r"\.\d+$", "", name)


def print_summary(summary: dict) -> None:
    print(f"trace {summary['trace']}")
    print(
        f"time summed {summary['summed_us'] / 1e3:.1f} ms over a span of "
        f"{summary['span_us'] / 1e3:.1f} ms; {summary['distinct_ops']} distinct ops, "
        f"{summary.get('op_calls', 0)} calls"
    )
    if "scope" in summary:
        print(f"summed: {summary['scope']}")
    for where, us in summary["per_thread_us"].items():
        print(f"{us / 1e3:9.2f} ms  on {where}")
    if summary.get("kinds"):
        print("by kind (an op's name less its number):")
        for row in summary["kinds"]:
            ms, share = row["total_us"] / 1e3, 100 * row["share"]
            print(f"{ms:9.2f} ms {share:5.1f}% {row['calls']:6d} x  {row['kind'][:110]}")
        print("largest ops:")
    for row in summary["top"]:
        ms, share, mean = row["total_us"] / 1e3, 100 * row["share"], row["mean_us"]
        print(f"{ms:9.2f} ms {share:5.1f}% {row['calls']:6d} x {mean:9.1f} us  {row['name'][:110]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="a profile directory or a perfetto_trace.json.gz")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    if args.top < 1:
        parser.error(f"--top={args.top}: give 1 or more rows")
    summary = summarise(find_trace(pathlib.Path(args.dir)), args.top)
    print_summary(summary)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
