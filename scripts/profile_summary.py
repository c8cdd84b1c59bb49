"""Where a profiled step's time went: device ops from a JAX profiler trace, summed by name.

    python -m scripts.profile_summary DIR [--top=30] [--json=PATH]

DIR is a `jax.profiler.trace(DIR, create_perfetto_trace=True)` directory (scripts/benchmark.py
--profile=DIR writes one); the newest `perfetto_trace.json.gz` under it is read. Events on a
device's streams (process names holding "/device:") are summed by op name; on a machine with no
device process (a CPU run) every complete event is summed instead, host threads included. The
table gives each name's total, share of the summed time, calls and mean; it uses the standard
library only, so it runs anywhere the trace file can be copied.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib


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
    """Totals per op name on the device streams, in microseconds, largest first."""
    opener = gzip.open if trace_path.suffix == ".gz" else open
    with opener(trace_path, "rt", encoding="utf-8") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {
        e["pid"]: e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    device_pids = {pid for pid, name in names.items() if "/device:" in name}
    threads = {
        (e["pid"], e["tid"]): e.get("args", {}).get("name", "")
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    per_thread: collections.Counter[str] = collections.Counter()
    totals: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    first, last = None, None
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        if device_pids and e.get("pid") not in device_pids:
            continue
        totals[e["name"]] += float(e["dur"])
        where = f"{names.get(e['pid'], e['pid'])} / {threads.get((e['pid'], e.get('tid')), '')}"
        per_thread[where] += float(e["dur"])
        calls[e["name"]] += 1
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        first = start if first is None else min(first, start)
        last = end if last is None else max(last, end)
    summed = sum(totals.values())
    rows = [
        {
            "name": name,
            "total_us": round(us, 1),
            "share": us / summed if summed else 0.0,
            "calls": calls[name],
            "mean_us": round(us / calls[name], 2),
        }
        for name, us in totals.most_common(top)
    ]
    return {
        "trace": str(trace_path),
        "device_processes": sorted(names[p] for p in device_pids),
        "summed_us": round(summed, 1),
        "span_us": round(last - first, 1) if first is not None else 0.0,
        "distinct_ops": len(totals),
        "op_calls": sum(calls.values()),
        "per_thread_us": {k: round(v, 1) for k, v in per_thread.most_common(12)},
        "top": rows,
    }


def print_summary(summary: dict) -> None:
    print(f"trace {summary['trace']}")
    print(
        f"time summed {summary['summed_us'] / 1e3:.1f} ms over a span of "
        f"{summary['span_us'] / 1e3:.1f} ms; {summary['distinct_ops']} distinct ops, "
        f"{summary.get('op_calls', 0)} calls"
    )
    for where, us in summary["per_thread_us"].items():
        print(f"{us / 1e3:9.2f} ms  on {where}")
    for row in summary["top"]:
        print(
            f"{row['total_us'] / 1e3:9.2f} ms {100 * row['share']:5.1f}% "
            f"{row['calls']:6d} x {row['mean_us']:9.1f} us  {row['name'][:110]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dir", help="a profile directory or a perfetto_trace.json.gz")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    summary = summarise(find_trace(pathlib.Path(args.dir)), args.top)
    print_summary(summary)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
