"""scripts/profile_summary.py on hand-written traces: what it sums, and each event's own time."""

import gzip
import json

import pytest

from scripts import profile_summary


def write_trace(path, processes: dict[int, str], events: list[dict]):
    meta = [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
        for pid, name in processes.items()
    ]
    meta += [
        {"ph": "M", "name": "thread_name", "pid": e["pid"], "tid": e["tid"], "args": {"name": "t"}}
        for e in events
    ]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": meta + [{"ph": "X", **e} for e in events]}, f)
    return path


def op(name, ts, dur, tid=1, pid=1, hlo=True):
    args = {"hlo_op": name} if hlo else {}
    return {"name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_a_cpu_trace_sums_the_xla_ops_alone_each_by_its_own_time_and_by_kind(tmp_path):
    events = [
        op("ThunkExecutor::Execute", 0, 100, hlo=False),  # the executor's span around the ops
        op("block_until_ready", 0, 120, tid=9, hlo=False),  # Python waiting
        op("ynn_fusion.3", 0, 10),
        op("ynn_fusion.7", 10, 5, tid=2),
        op("while.1", 20, 30),  # its body's two ops run inside it, on its thread
        op("copy.2", 25, 4),
        op("copy.9", 30, 6),
        op("end: copy", 36, 1, hlo=False),
    ]
    path = write_trace(tmp_path / "perfetto_trace.json.gz", {1: "/host:CPU"}, events)
    summary = profile_summary.summarise(path)
    assert summary["scope"] == "XLA ops on the host's threads"
    totals = {row["name"]: row["total_us"] for row in summary["top"]}
    # The while loop keeps only its own 20 us: its body's 10 us are the copies'.
    expected = {"ynn_fusion.3": 10, "ynn_fusion.7": 5, "while.1": 20, "copy.2": 4, "copy.9": 6}
    assert totals == expected
    assert summary["summed_us"] == 45
    kinds = {row["kind"]: (row["total_us"], row["calls"]) for row in summary["kinds"]}
    assert kinds == {"ynn_fusion": (15, 2), "while": (20, 1), "copy": (10, 2)}
    assert [row["kind"] for row in summary["kinds"]] == ["while", "ynn_fusion", "copy"]


def test_a_trace_without_op_names_sums_every_event_without_counting_nested_time_twice(tmp_path):
    events = [
        op("train_step", 0, 100, hlo=False),
        op("dispatch", 10, 30, hlo=False),
        op("wait", 50, 40, hlo=False),
        op("other_thread", 0, 7, tid=2, hlo=False),
    ]
    path = write_trace(tmp_path / "trace.json.gz", {1: "/host:CPU"}, events)
    summary = profile_summary.summarise(path)
    assert summary["scope"].startswith("every event")
    totals = {row["name"]: row["total_us"] for row in summary["top"]}
    assert totals == {"train_step": 30, "dispatch": 30, "wait": 40, "other_thread": 7}
    assert summary["summed_us"] == 107  # the busy time of the two threads, nothing twice


def test_a_gpu_trace_sums_the_device_streams_alone(tmp_path):
    events = [
        op("fusion.1", 0, 8, pid=2, hlo=False),
        op("gemm.4", 8, 12, pid=2, hlo=False),
        op("ThunkExecutor::Execute", 0, 50, pid=1),  # a host event, even one naming an op
    ]
    processes = {1: "/host:CPU", 2: "/device:GPU:0"}
    path = write_trace(tmp_path / "trace.json.gz", processes, events)
    summary = profile_summary.summarise(path)
    assert summary["scope"] == "device streams"
    assert {row["name"] for row in summary["top"]} == {"fusion.1", "gemm.4"}
    assert summary["summed_us"] == 20


def test_a_damaged_trace_is_refused_with_its_name(tmp_path):
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
        f.write("not json")
    with pytest.raises(SystemExit, match="perfetto_trace.json.gz: not a readable trace"):
        profile_summary.summarise(path)
    path.write_text("not gzip either")
    with pytest.raises(SystemExit, match="not a readable trace"):
        profile_summary.summarise(path)
