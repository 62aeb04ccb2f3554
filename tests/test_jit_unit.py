"""The compiled unit simulation (:mod:`echosim.timeline._jit_unit`) equals the Python one to the bit.

:func:`~echosim.timeline.streams.simulate_unit` is the oracle (the path ``ECHOSIM_JIT=0`` takes): on every unit of
real stage graphs (GPT-3-ish and Llama-ish, tensor parallelism with and without TP overlap's chunked edges, ZeRO-3 /
FSDP's gathers and reduce-scatters appended to the layers, the zero-bubble backward split) and on each backend's
overlap model and a stronger one, the compiled timing must have the same durations, busy seconds (in the same
order), critical end, carry, chunked edges and events, every float the same bits (compared by ``repr``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from echosim import memo
from echosim.backends.base import OverlapModel
from echosim.compiler import prepare
from echosim.plan import Cluster, Plan
from echosim.timeline import lower as lw
from echosim.timeline import streams
from echosim.timeline.streams import UnitArrays, UnitTiming, simulate_compiled, simulate_unit

pytest.importorskip("numba")

CASES = [
    ("gpt3-125m", Plan(tp=2, dp=4, global_batch=16, tp_overlap=True, sp=True), "a100-80gb"),
    ("gpt3-125m", Plan(tp=2, pp=2, dp=2, global_batch=16, tp_overlap=True, schedule="zb-h1"), "h100-sxm"),
    ("gpt3-125m", Plan(dp=8, zero=3, global_batch=16, recompute="full"), "a100-80gb"),
    ("llama3-8b", Plan(tp=4, dp=2, zero=3, global_batch=8, tp_overlap=True, sp=True), "h100-sxm"),
    ("llama3-8b", Plan(tp=2, pp=2, dp=2, zero=1, global_batch=8, recompute="selective"), "h100-sxm"),
]


def _bits(t: UnitTiming) -> str:
    """Every field of ``t`` with its floats' exact bits (``repr`` round-trips; ``==`` would equate -0.0 and 0.0)."""
    return repr((t.duration, list(t.busy.items()), t.events, t.critical_end, t.nodes, sorted(t.chunked), t.carry))


def _units(model: str, plan: Plan, backend: str) -> tuple[Any, list[tuple[Any, Any, list[Any]]]]:
    step = prepare(model, plan, Cluster(backend, 8))
    split_w = step.options.schedule.split_backward
    out = []
    for stage in step.stages:
        graph = lw._unit_graph(stage)  # as a search splits it: a ZeRO-3 stage's units extend its base graph's
        parts = [p for kind in lw.unit_parts(graph, split_w) for p in kind]
        out.append((graph, lw.Coster(graph, step.backend, step.where), parts))
    return step.backend, out


@pytest.mark.parametrize(("model", "plan", "backend"), CASES)
def test_compiled_unit_is_byte_identical_to_python(model: str, plan: Plan, backend: str) -> None:
    memo.clear_all()
    be, stages = _units(model, plan, backend)
    kernel = streams.compiled_unit()
    assert kernel is not None
    chunked = slowed = spilled = 0
    for overlap in (be.overlap(), OverlapModel(compute_slowdown=1.3, comm_slowdown=1.1, memory_bound_slowdown=1.5)):
        for graph, cost, parts in stages:
            for part in parts:
                cats = lw._categories(part)
                arrays = lw._unit_arrays(part)
                assert arrays is not None
                base = {n.id: cost(n) for n in part.nodes}
                for pipelined in (set(), lw._pipelined(part)):
                    want = simulate_unit(graph, part.nodes, cost, overlap, pipelined, categories=cats)
                    got = simulate_compiled(kernel, arrays, part.nodes, base, overlap, pipelined)
                    assert "_lazy" in got.__dict__  # events not built until read
                    assert _bits(got) == _bits(want)
                    assert got == want
                    chunked += bool(pipelined)
                    slowed += want.carry != 0.0 or any(e.duration != e.base for e in want.events)
                    spilled += want.duration > want.critical_end
    assert slowed  # the dilation ran on these units
    if plan.tp_overlap:
        assert chunked  # and TP overlap's chunked path
    if plan.zero == 3:
        assert spilled  # and the carry of spilled collectives
        assert any(p.prefix is not None for _, _, parts in stages for p in parts)  # units extending a layer's


def test_search_times_units_with_the_kernel_and_equal_to_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """``time_units`` takes the compiled path unless ``ECHOSIM_JIT=0``, and both give the same timings."""
    plan = Plan(tp=2, dp=4, zero=3, global_batch=16, tp_overlap=True, sp=True)
    step = prepare("gpt3-125m", plan, Cluster("h100-sxm", 8))
    got = []
    for jit in ("1", "0"):
        monkeypatch.setenv("ECHOSIM_JIT", jit)
        memo.clear_all()
        timed = [lw.time_units(s.graph, step.backend, step.where, step.options) for s in step.stages]
        lazy = any("_lazy" in u.__dict__ for t in timed for kind in t for u, _ in kind)
        assert lazy == (jit == "1")
        got.append([[_bits(u) for kind in t for u, _ in kind] for t in timed])
    assert got[0] == got[1]


def test_a_repeated_node_id_takes_the_python_path() -> None:
    """Positions name a unit's ops only when its ids are distinct: otherwise no arrays, and the Python path."""
    _, stages = _units("gpt3-125m", Plan(dp=8, global_batch=16), "a100-80gb")
    part = stages[0][2][0]
    assert UnitArrays.of(part.nodes + part.nodes[:1], lw._categories(part) * 2) is None


def test_one_compile_keeps_the_python_path_and_never_imports_numba() -> None:
    """Loading the kernel costs more than one layout's units save (``streams.PYTHON_UNITS``): a process that
    compiles one layout simulates its units in Python, and numba stays unimported."""
    script = (
        "import sys\n"
        "from echosim.compiler import compile\n"
        "from echosim.plan import Cluster, Plan\n"
        "from echosim.timeline import streams\n"
        "compile('gpt3-125m', Plan(tp=2, dp=4, zero=3, global_batch=16, tp_overlap=True), Cluster('h100-sxm', 8))\n"
        "assert 0 < streams._python_units[0] < streams.PYTHON_UNITS, streams._python_units\n"
        "assert 'numba' not in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ECHOSIM_JIT"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=Path(__file__).resolve().parents[1])
