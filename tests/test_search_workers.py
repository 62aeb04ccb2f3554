"""A search with several worker processes (``workers``, ``--executor ray``): each holds whole groups of the layouts
that share stage graphs (:func:`echosim.layout_search._shards`), and its output is the one-process search's, byte for
byte."""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import threading
from collections import Counter
from typing import Any

import pytest

from echosim import fast_eval, layout_search, memo
from echosim.commands.search import dumps_indented, result_json
from echosim.layout_search import Evaluated, _first, _group_cost, _plan_key, _shard_key, _shards, search
from echosim.plan import Cluster, Plan

SPACE = {"tp": (1, 2), "pp": (1, 2, 4), "cp": (1, 2), "mb": (1, 2), "zero": (0, 1), "vpp": (1, 2), "sp": (False, True)}


def _cold_json(workers: int, executor: str = "local") -> tuple[str, Counter[str]]:
    """The search's ``--json`` text and fast-path fallbacks, every cache emptied first (the workers do their own
    cold work, not inherit the parent's)."""
    memo.clear_all()
    fast_eval.FALLBACKS.clear()
    result = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SPACE, workers=workers,
                    executor=executor)  # fmt: skip
    return dumps_indented(result_json(result, 5)), Counter(fast_eval.FALLBACKS)


def test_two_workers_write_the_same_json_as_one() -> None:
    one, fallbacks_one = _cold_json(1)
    two, fallbacks_two = _cold_json(2)
    assert '"simulated": 0' not in one
    assert two == one
    assert fallbacks_two == fallbacks_one  # the workers' counts come back to the parent


def test_ctrl_c_with_workers_keeps_what_was_simulated() -> None:
    """Progress and Ctrl-C act per batch with worker processes too: an interrupt after the second batch ends the search
    with the layouts of the batches received."""
    calls: list[int] = []

    def interrupt(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == 2:
            raise KeyboardInterrupt

    result = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SPACE, workers=2,
                    progress=interrupt)  # fmt: skip
    assert result.interrupted and result.simulated == calls[-1] < len(result.enumeration.to_simulate)
    assert result.best is not None and result.best.ok


def _full_path_calls(monkeypatch: pytest.MonkeyPatch, slower: bool) -> list[tuple[int, int]]:
    """The full path's evaluations (the re-check's, ``fast`` False) recorded as (process id, layouts) in this process;
    ``slower``: the full path disagrees with the fast one, its layouts of tensor parallelism 2 a third slower (the
    re-check's top then changes, as it would if the fast path were wrong). Workers forked afterwards inherit both."""
    calls: list[tuple[int, int]] = []
    evaluate = layout_search._evaluate

    def recorded(model: Any, plans: list[Plan], *args: Any, **kwargs: Any) -> list[Evaluated]:
        out = evaluate(model, plans, *args, **kwargs)
        if kwargs.get("fast", args[2] if len(args) > 2 else False):
            return out
        calls.append((os.getpid(), len(plans)))
        if not slower:
            return out
        return [dataclasses.replace(e, step_time_s=e.step_time_s * 4 / 3, tokens_per_s=e.tokens_per_s * 3 / 4,
                                    samples_per_s=e.samples_per_s * 3 / 4)
                if e.ok and e.plan.tp == 2 else e for e in out]  # fmt: skip

    monkeypatch.setattr(layout_search, "_evaluate", recorded)
    return calls


def test_workers_recheck_their_own_top() -> None:
    """With workers, each re-checks its shard's top layouts after its last batch (on its warm caches, while the
    others run): the parent evaluates none by the full path, and the report is the one-process search's."""
    one, _ = _cold_json(1)
    with pytest.MonkeyPatch.context() as mp:
        calls = _full_path_calls(mp, slower=False)
        two, _ = _cold_json(2)
    assert two == one
    assert calls == []  # the workers' calls are recorded in their own processes only


@pytest.mark.parametrize("workers", [2, 3])
def test_recheck_that_changes_the_top_is_the_same_with_workers(workers: int) -> None:
    """A full path that disagrees with the fast one moves layouts out of the top and brings others in, re-checked in
    further rounds: the outcome (figures, ranking, counts) is the one-process search's with any number of workers,
    whichever process evaluated which layout."""
    with pytest.MonkeyPatch.context() as mp:
        calls = _full_path_calls(mp, slower=True)
        one, _ = _cold_json(1)
        parent = list(calls)
        calls.clear()
        many, _ = _cold_json(workers)
    assert len(parent) >= 2  # the top changed: more than one round in one process
    assert many == one
    with pytest.MonkeyPatch.context() as mp:
        _full_path_calls(mp, slower=False)
        unchanged, _ = _cold_json(1)
    assert unchanged != one  # the disagreement reached the report


def test_first_is_the_sorted_prefix() -> None:
    """The re-check's top ``n`` (sorting only the layouts up to the ``n``-th objective) equals the full sort's
    prefix, ties at the cut broken by plan as the full sort does; with a NaN objective, the full sort itself."""
    plans = _plans()
    times = [1.0, 2.0, 2.0, 2.0, 3.0, 0.5]
    items = [Evaluated(p, 64, step_time_s=times[i % len(times)], fits=True, simulated=True) for i, p in
             enumerate(plans)]  # fmt: skip
    key = layout_search.objective_key("step-time")
    for n in (1, 5, 20, len(items), len(items) + 3):
        assert _first(items, key, n) == sorted(items, key=lambda c: (key(c), _plan_key(c.plan)))[:n]
    items[3] = dataclasses.replace(items[3], step_time_s=math.nan)
    assert _first(items, key, 20) == sorted(items, key=lambda c: (key(c), _plan_key(c.plan)))[:20]


def test_workers_have_exited_when_the_search_returns() -> None:
    """A worker is let go once its calls have returned and exits while the parent re-checks and ranks; the search
    returns only when every worker has exited (their CPU time is then the process's children's)."""
    search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SPACE, workers=2)
    assert not [t for t in threading.enumerate() if t.name.startswith("echosim-worker-")]
    import multiprocessing

    assert multiprocessing.active_children() == []


def test_parent_collects_little_while_workers_run() -> None:
    """While the workers' results come in, the parent's own objects (model, enumeration, imports) are frozen and
    its threshold is a batch's, as in a one-process search: its collections scan only what came in (GPT-3 175B's
    full space: 0.33 of the parent's 1.0 CPU-s meanwhile went to collections); both are handed back at the end."""
    import gc

    seen: list[tuple[int, int]] = []

    def progress(done: int, total: int) -> None:
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))

    before = gc.get_threshold()
    search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SPACE, workers=2, progress=progress)
    assert seen and all(frozen > 0 and threshold == layout_search._BATCH_GC_THRESHOLD for frozen, threshold in seen)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before


def test_workers_are_let_go_for_the_caller_to_join() -> None:
    """The batches' generator does not wait for the workers to exit: it hands the caller a started thread per
    worker shutting its pool down (the caller joins them after its re-check and ranking)."""
    probe = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space=SPACE, sample=slice(0, 0))
    plans = probe.enumeration.to_simulate
    exiting: list[threading.Thread] = []
    batches = list(layout_search._run_local("gpt3-125m", plans, probe.cluster, 0.9, 2, True, None, exiting))
    assert sum(map(len, batches)) == len(plans)
    assert len(exiting) == 2
    for t in exiting:
        t.join()


@pytest.mark.slow
def test_ray_actors_write_the_same_json_as_one_process() -> None:
    ray = pytest.importorskip("ray")
    one, _ = _cold_json(1)
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    try:
        remote, _ = _cold_json(1, executor="ray")  # one actor per CPU of the Ray cluster: two shards
        capped, _ = _cold_json(4, executor="ray")  # no more actors than CPUs (each holds one until the search ends)
    finally:
        ray.shutdown()
    assert remote == one
    assert capped == one


def _plans() -> list[Plan]:
    """Layouts of 64 devices over the fields a shard key reads and those it does not (dp, ZeRO, schedule, TP
    overlap), in an enumeration-like order."""
    out = []
    for tp, pp, cp, mb, zero, schedule, overlap in itertools.product(
        (1, 2, 4, 8), (1, 2, 4, 8), (1, 2), (1, 2, 4), (0, 1, 2), ("1f1b", "gpipe"), (False, True)
    ):
        if overlap and tp == 1:
            continue
        out.append(Plan(tp=tp, pp=pp, cp=cp, dp=64 // (tp * pp * cp), micro_batch=mb, zero=zero, schedule=schedule,
                        tp_overlap=overlap))  # fmt: skip
    return out


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_shards_hold_whole_groups_balanced(workers: int) -> None:
    """Every layout in exactly one shard, in its input order; a group (:func:`_shard_key`) never split; no shard
    costs more than the mean plus the largest group (longest processing time first, Graham's bound)."""
    plans = _plans()
    shards = _shards(plans, workers)
    assert len(shards) == workers
    assert sorted(map(plans.index, itertools.chain(*shards))) == list(range(len(plans)))
    for shard in shards:
        assert [plans.index(p) for p in shard] == sorted(plans.index(p) for p in shard)
    owner: dict[object, int] = {}
    for w, shard in enumerate(shards):
        for p in shard:
            assert owner.setdefault(_shard_key(p), w) == w
    groups: dict[object, list[Plan]] = {}
    for p in plans:
        groups.setdefault(_shard_key(p), []).append(p)
    costs = [_group_cost(m) for m in groups.values()]
    loads = [sum(_group_cost(groups[k]) for k in {_shard_key(p) for p in s}) for s in shards]
    assert sum(loads) == sum(costs)
    assert max(loads) <= sum(costs) / workers + max(costs)
    assert _shards(plans, workers) == shards  # deterministic


def test_a_group_is_a_layers_op_shapes_and_collectives() -> None:
    """Layouts that differ in pipeline split, data parallelism, ZeRO stage, micro-batch, recompute, schedule or TP
    overlap alone share their layers' op shapes and collectives: one group. A different tensor, sequence, context or
    expert parallelism is another group."""
    base = Plan(tp=2, pp=4, dp=8, micro_batch=1)
    same = [Plan(tp=2, pp=4, dp=8, micro_batch=1, zero=1), Plan(tp=2, pp=4, dp=8, micro_batch=1, schedule="gpipe"),
            Plan(tp=2, pp=4, dp=8, micro_batch=1, tp_overlap=True), Plan(tp=2, pp=4, dp=16, micro_batch=1),
            Plan(tp=2, pp=8, dp=8, micro_batch=1, vpp=2), Plan(tp=2, pp=4, dp=8, micro_batch=2),
            Plan(tp=2, pp=4, dp=8, micro_batch=1, recompute="full")]  # fmt: skip
    other = [Plan(tp=4, pp=4, dp=8, micro_batch=1), Plan(tp=2, pp=4, dp=8, micro_batch=1, sp=True),
             Plan(tp=2, pp=4, dp=8, cp=2, micro_batch=1), Plan(tp=2, pp=4, dp=8, ep=2, micro_batch=1)]  # fmt: skip
    assert all(_shard_key(p) == _shard_key(base) for p in same)
    assert all(_shard_key(p) != _shard_key(base) for p in other)


def test_a_groups_cost_counts_its_stage_families() -> None:
    """A group's estimate: each layout, and each stage family (pipeline split, micro-batch, recompute) 40 layouts'
    worth; the ZeRO stages and schedules of one family add layouts only."""
    family = [Plan(tp=2, pp=4, dp=8, zero=z, schedule=s) for z in (0, 1, 2) for s in ("1f1b", "gpipe")]
    assert _group_cost(family) == 6 + 40
    assert _group_cost([*family, Plan(tp=2, pp=8, dp=4), Plan(tp=2, pp=4, dp=8, micro_batch=2)]) == 8 + 3 * 40
