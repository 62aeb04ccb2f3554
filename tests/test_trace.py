"""The Perfetto trace is valid Chrome trace-event JSON: required fields, non-negative durations, nesting per thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import COSTED_LAYOUTS

from echosim.compiler import Compiled, lower
from echosim.plan import Cluster
from echosim.timeline.trace import chrome_trace, detailed_blocks, write_trace

LAYOUTS = COSTED_LAYOUTS
TOLERANCE_US = 1e-6


def _lower(name: str) -> Compiled:
    model, plan, devices = LAYOUTS[name]
    return lower(model, plan, Cluster("h100-sxm", devices))


def check_trace_events(trace: dict) -> dict[tuple[int, int], list[dict]]:
    """Assert what the Chrome trace-event format requires; return the complete slices per (pid, tid)."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] in ("ms", "ns")
    threads: dict[tuple[int, int], list[dict]] = {}
    named: set[tuple[int, int]] = set()
    for e in trace["traceEvents"]:
        assert isinstance(e["name"], str) and e["ph"] in ("X", "M") and isinstance(e["pid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index")
            if e["name"] == "thread_name":
                named.add((e["pid"], e["tid"]))
            continue
        assert isinstance(e["tid"], int) and isinstance(e["cat"], str) and isinstance(e["args"], dict)
        assert isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        threads.setdefault((e["pid"], e["tid"]), []).append(e)
    assert set(threads) <= named  # every thread that holds slices has a name
    for key, spans in threads.items():
        stack: list[float] = []  # ends of the open slices
        for e in sorted(spans, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"] + TOLERANCE_US:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + TOLERANCE_US, f"{key}: {e['name']} overlaps its neighbour"
            stack.append(end)
    return threads


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_the_trace_is_valid_and_every_thread_nests(name: str) -> None:
    c = _lower(name)
    trace = json.loads(json.dumps(chrome_trace(c.costed, LAYOUTS[name][0])))
    threads = check_trace_events(trace)
    assert {pid for pid, _ in threads} == set(range(c.costed.pp))  # one process per pipeline stage
    spans = [e for s in threads.values() for e in s]
    last = max(e["ts"] + e["dur"] for e in spans)
    assert last == pytest.approx(c.report.step_time_s * 1e6, rel=1e-6)
    blocks = [e for e in spans if e["cat"] in ("forward", "backward", "weight-gradient")]
    assert len(blocks) == len(c.costed.blocks) and all(e["tid"] == 0 for e in blocks)


def test_ops_carry_their_op_scope_flops_bytes_and_slowdown() -> None:
    c = _lower("tp-overlap+sp")
    trace = chrome_trace(c.costed, "llama3-8b")
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {"compute", "comm", "p2p"} <= names
    ops = [e for e in trace["traceEvents"] if e["ph"] == "X" and "op" in e["args"]]
    assert ops and all({"op", "scope", "flops", "bytes", "slowdown", "base_us", "layer", "microbatch"} <= set(e["args"])
                       for e in ops)  # fmt: skip
    matmuls = [e for e in ops if e["args"]["op"] == "matmul"]
    assert matmuls and all(e["args"]["flops"] > 0 for e in matmuls)
    assert {"layers.0.attn.q_proj", "lm_head"} <= {e["args"]["scope"] for e in matmuls}
    collectives = [e for e in ops if e["tid"] >= 10]
    assert collectives and all(e["args"]["axis"] == "tp" and e["args"]["group"] == 4 for e in collectives)
    assert any(e["args"]["slowdown"] > 1.0 for e in ops)  # compute beside communication is dilated


def test_op_detail_stays_within_its_budget_and_the_blocks_are_always_there() -> None:
    c = _lower("1f1b")
    full = chrome_trace(c.costed)
    ops = lambda t: [e for e in t["traceEvents"] if e["ph"] == "X" and "op" in e["args"]]  # noqa: E731
    assert len(detailed_blocks(c.costed)) == len(c.costed.blocks)  # a small step is drawn whole
    for budget in (0, 1000, 5000):
        trace = chrome_trace(c.costed, max_op_events=budget)
        assert len(ops(trace)) <= budget
        assert [e for e in trace["traceEvents"] if e.get("cat") == "forward"] == [
            e for e in full["traceEvents"] if e.get("cat") == "forward"
        ]
        check_trace_events(trace)
    assert "micro-batches 0, 4, 7 of 8" in chrome_trace(c.costed, max_op_events=4000)["otherData"]["op_detail"]


def test_the_trace_file_is_deterministic(tmp_path: Path) -> None:
    c = _lower("zb-h1")
    for i in range(2):
        write_trace(c.costed, tmp_path / f"{i}.json", "gpt3-1.3b")
    assert (tmp_path / "0.json").read_bytes() == (tmp_path / "1.json").read_bytes()
