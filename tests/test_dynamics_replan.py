"""Re-planning: the bytes a layout switch moves (closed form) and the replan command."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import TINY_RWKV, check_whole_warning_carried
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.cli import cli
from echosim.dynamics.replan import Shape, held_fractions, kept, reshard

W, OPT = 2.0e9, 12.0e9  # weights and optimizer state of a 1B-parameter model, Megatron mixed precision


def test_same_layout_moves_nothing() -> None:
    s = Shape(tp=4, pp=2, dp=8, zero=1)
    assert reshard(s, s, W, OPT) == {"bytes": 0.0, "max_device_bytes": 0.0}


def test_doubling_tp_on_two_devices() -> None:
    # one device held everything; now two tensor-parallel halves: the new device receives half
    moved = reshard(Shape(1, 1, 1, 0), Shape(2, 1, 1, 0), W, OPT)
    assert moved["bytes"] == pytest.approx((W + OPT) / 2) and moved["max_device_bytes"] == pytest.approx((W + OPT) / 2)


def test_zero1_growing_dp_moves_only_optimizer_slices() -> None:
    # dp 2 -> 4, ZeRO-1: weights are replicated (new ranks receive them whole), optimizer slices re-cut
    moved = reshard(Shape(1, 1, 2, 1), Shape(1, 1, 4, 1), W, OPT)
    # ranks 0, 1 keep their weights and the part of their old half that is in their new quarter;
    # ranks 2, 3 are new: they receive the weights and a quarter of the optimizer state each.
    # rank 0: new [0, 1/4) inside old [0, 1/2): keeps it. rank 1: new [1/4, 1/2) vs old [1/2, 1): receives it.
    assert moved["bytes"] == pytest.approx(OPT / 4 + 2 * (W + OPT / 4))


@settings(max_examples=200, deadline=None)
@given(
    old=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.integers(1, 8), st.integers(0, 3)),
    new=st.tuples(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.integers(1, 8), st.integers(0, 3)),
)
def test_kept_never_exceeds_what_is_held_or_needed(old: tuple, new: tuple) -> None:
    a, b = Shape(*old), Shape(*new)
    need_total = 0.0
    for rank in range(b.world):
        kw, ko = kept(a, b, rank)
        nw, no = held_fractions(b, rank)
        hw, ho = held_fractions(a, rank) if rank < a.world else (0.0, 0.0)
        assert -1e-12 <= kw <= min(nw, hw) + 1e-12 and -1e-12 <= ko <= min(no, ho) + 1e-12
        need_total += nw * W + no * OPT
    moved = reshard(a, b, W, OPT)
    assert 0 <= moved["bytes"] <= need_total + 1e-3
    if a == b:
        assert moved["bytes"] == 0


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_replan_command() -> None:
    args = ["replan", "llama3-8b", "--from", "--backend h100-sxm --tp 8 --pp 2 --dp 4 --global-batch 64",
            "--devices", "32", "--json"]  # fmt: skip
    code, out = run(*args)
    assert code == 0, out
    r = json.loads(out)
    assert r["from"]["devices"] == 64 and r["devices"] == 32
    assert r["keep"]["tp"] == 8 and r["keep"]["dp"] == 2
    best = r["best"]
    assert best["tp"] * best["pp"] * best["dp"] == 32
    assert best["step_time_s"] <= r["keep"]["step_time_s"]
    assert best["switch"]["bytes"] > 0 and best["switch"]["time_s"] > 0
    gain = r["keep"]["step_time_s"] - best["step_time_s"]
    extra = best["switch"]["time_s"] - r["keep"]["switch"]["time_s"]
    assert r["payback_steps"] * gain >= extra - 1e-9
    assert run(*args)[1] == out  # byte-identical


def test_a_derived_global_batch_is_the_batch_every_layout_runs() -> None:
    """--from without --global-batch: the batch is dp x micro-batch of the old layout (4 here), and the kept shape
    and the best layout run it too; the kept shape ran 8 sequences and the best 4, steps that compared nothing."""
    code, out = run("replan", "llama3-8b", "--from", "--backend h100-sxm --tp 2 --dp 4", "--devices", "16", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert "global batch 4 is not a multiple of micro-batch*dp = 1*8" in r["keep"]["reason"]
    best = r["best"]
    assert 4 % (best["dp"] * best["micro_batch"]) == 0 and best["tp"] * best["pp"] * best["dp"] == 16
    code, text = run("replan", "llama3-8b", "--from", "--backend h100-sxm --tp 2 --dp 4", "--devices", "16")
    assert text.strip().endswith("re-planning is the only way on: the old shape cannot run on 16 devices")
    assert text.startswith("from TP 2 PP 1 DP 4 on 8 x h100-sxm: step 0.4916 s (does not fit in memory")
    # no layout of 12 devices divides ResNet-50's 2,048 images (not a kept 3,072 against a found 6,144): the old
    # layout goes on on 8 of them, the other 4 idle, and nothing moves
    args = ["replan", "resnet50", "--from", "--backend a100-80gb --dp 8 --micro-batch 256", "--devices", "12"]
    code, out = run(*args, "--json")
    assert code == 0, out
    r = json.loads(out)
    assert "divides the global batch 2048" in r["best"]["reason"] and "switch" not in r["best"]
    fewer = r["keep_fewer"]
    assert (fewer["devices"], fewer["dp"], fewer["micro_batch"]) == (8, 8, 256)
    assert fewer["step_time_s"] == r["from"]["step_time_s"] and fewer["switch"]["bytes"] == 0
    assert r["payback_steps"] is None
    code, text = run(*args)
    assert text.strip().endswith(
        "keeping the shape on 8 of the 12 devices is the only way on: no layout of all 12 runs"
    )
    assert "keep the shape on 8 of them (4 idle): TP 1 PP 1 DP 8: step 0.1023 s" in text
    code, out = run("replan", "resnet50", "--from", "--backend a100-80gb --dp 8 --micro-batch 256", "--devices", "16")
    assert code == 0 and "(1 layout simulated)" in out and out.strip().endswith("the best layout found"), out


def test_replan_carries_the_best_layouts_warnings() -> None:
    """What compile warns of for the layout replan recommends is printed too (RWKV's receptance linears run whole)."""
    args = ("replan", TINY_RWKV, "--from", "--backend h100-sxm --tp 2 --dp 2 --global-batch 8 --seq-len 16",
            "--devices", "8", "--space", "tp=2")  # fmt: skip
    check_whole_warning_carried(run, args, "warning: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "--tp eight", "--devices", "8"], "--from '--tp eight'"),
        (["--from", "--tp 8", "--devices", "0"], "--devices must be at least 1"),
        (["--from", "--tp 8", "--devices", "8", "--space", "tp"], "--space"),
    ],
)
def test_replan_bad_input_is_one_line(args: list[str], message: str) -> None:
    code, out = run("replan", "llama3-8b", *args)
    assert code != 0 and message in out and "Traceback" not in out
    assert len(out.strip().splitlines()) == 1


def test_row_wise_tables_regrown_by_torchrec_s_even_split() -> None:
    """Row-wise over 16 ranks, then 32: rank r held rows [r/16, (r+1)/16) and needs [r/32, (r+1)/32). Only rank 0's
    new rows lie inside its old ones; every other rank receives its whole new shard, rows and Adagrad state."""
    from echosim.dynamics.replan import table_holdings, table_moves
    from echosim.passes.embedding_sharding import Table, place

    tables = [Table(0, 1, "t0", 1 << 20, 128, 4, 4096, 2048, 8), Table(2, 3, "t1", 3 << 18, 64, 4, 4096, 2048, 8)]
    cap = 80 * 2**30
    old = table_holdings(place(tables, "row", 16, 8, cap), tables, 8)
    new = table_holdings(place(tables, "row", 32, 8, cap), tables, 8)
    moves = table_moves(old, new)
    share = sum(t.held_bytes for t in tables) / 32
    assert moves[0] == 0 and moves[1:] == pytest.approx([share] * 31)
    assert table_moves(old, old) == [0.0] * 16
    back = table_moves(new, old)  # 32 -> 16: rank r keeps its 1/32 where it lies in its new 1/16 (r = 0 only)
    assert back[0] == pytest.approx(sum(t.held_bytes for t in tables) / 32) and back[1] == pytest.approx(2 * share)


def test_replan_moves_a_recommendation_model_s_tables_and_keeps_its_whole_batch() -> None:
    """DLRM-DCNv2 from 16 H100 to 8: the tables of ranks 8-15 must reach ranks 0-7 (the switch used to move 0 GB);
    its micro-batch stays each device's whole share of the global batch (4,096 on 8, 1,024 on 32)."""
    from echosim.compiler import _backend, _load_model
    from echosim.dynamics.replan import _sharded_tables
    from echosim.passes.embedding_sharding import place
    from echosim.plan import Plan
    from echosim.plugins import get_registry

    flags = "--backend h100-sxm --dp 16 --global-batch 32768 --micro-batch 2048 --embedding-sharding auto"
    code, out = run("replan", "dlrm-dcnv2", "--from", flags, "--devices", "8", "--json")
    assert code == 0, out
    r = json.loads(out)
    assert r["keep"]["micro_batch"] == 4096 and r["best"]["micro_batch"] == 4096
    plan = Plan(dp=16, micro_batch=2048, global_batch=32768, embedding_sharding="auto")
    tables = _sharded_tables("dlrm-dcnv2", plan)
    placement = place(tables, "auto", 16, 8, _backend("h100-sxm", get_registry()).memory_bytes())
    # what ranks 8-15 held of the tables not replicated everywhere has to reach ranks 0-7
    leaving = sum(s.storage(tables[s.table]) for shards in placement.ranks[8:] for s in shards if s.kind != "data")
    assert r["keep"]["switch"]["bytes"] >= leaving > 10e9
    # the checkpoint holds the tables as sharded (rows and row-wise Adagrad), not with the dense Adam state
    sparse = [t for t, kind in zip(tables, placement.kinds, strict=True) if kind != "data"]
    params = _load_model("dlrm-dcnv2", plan, get_registry())[2]
    dense = params - sum(t.rows * t.dim for t in sparse)
    assert r["checkpoint_bytes"] == dense * 14 + sum(t.held_bytes for t in sparse)  # Megatron bf16: 2 + 12 bytes
    assert r["checkpoint_bytes"] < 0.3 * params * 14  # 53 GB; 366 GB with every table under Adam
    code, out = run("replan", "dlrm-dcnv2", "--from", flags.replace("auto", "row"), "--devices", "32", "--json")
    assert code == 0, out
    assert json.loads(out)["best"]["micro_batch"] == 1024


def test_replan_to_the_same_count_moves_no_table() -> None:
    """The old layout's tables are placed on the node its compile used (GB200's 72-GPU domain, not a default of 8):
    the same layout on the same count moves nothing. It moved 49.8 GB when the old placement took 8-rank hosts."""
    flags = "--backend gb200 --dp 16 --global-batch 32768 --micro-batch 2048 --embedding-sharding table_row"
    code, out = run("replan", "dlrm-dcnv2", "--from", flags, "--devices", "16", "--json")
    assert code == 0, out
    assert json.loads(out)["keep"]["switch"]["bytes"] == 0.0


def test_replan_names_how_each_layout_shards_its_tables() -> None:
    """With --space embedding_sharding=..., the best layout may shard the tables another way than the kept shape:
    replan's rows said only 'TP 1 PP 1 DP 8' for both, and the JSON had no sharding at all."""
    flags = "--backend h100-sxm --dp 16 --global-batch 32768 --micro-batch 2048 --embedding-sharding auto"
    args = ["replan", "dlrm-dcnv2", "--from", flags, "--devices", "8", "--space", "embedding_sharding=row,table,auto"]
    code, out = run(*args, "--json")
    assert code == 0, out
    r = json.loads(out)
    assert r["from"]["embedding_sharding"] == r["keep"]["embedding_sharding"] == "auto"
    assert r["best"]["embedding_sharding"] in ("row", "table", "auto")
    code, text = run(*args)
    label = {"row": "row-wise", "table": "table-wise", "auto": "auto-sharded"}[r["best"]["embedding_sharding"]]
    assert "keep the shape on 8: TP 1 PP 1 DP 8, micro-batch 4096, auto-sharded tables: step" in text
    assert f"TP 1 PP 1 DP 8, micro-batch 4096, {label} tables: step" in text
    code, out = run("replan", "llama3-8b", "--from", "--backend h100-sxm --tp 2 --dp 4 --global-batch 64", "--devices",
                    "16", "--json")  # fmt: skip
    assert "embedding_sharding" not in json.loads(out)["best"]  # a model without sharded tables: no such key


def test_replan_weighs_keeping_the_shape_on_fewer_devices() -> None:
    """An LSTM LM from 8 to 12 A100s at 256 sequences of 32 a rank: 12 ranks cannot share the batch, and the only
    layouts of all 12 run its linears whole on 3 tensor-parallel ranks, twice the step. Before, replan recommended
    one of them as "the only way on"; the old layout on 8 of the 12 (4 idle) moves nothing and stays as fast."""
    args = ["replan", "lstm-lm", "--from", "--backend a100-80gb --dp 8 --global-batch 256 --micro-batch 32 "
            "--seq-len 35", "--devices", "12"]  # fmt: skip
    code, out = run(*args, "--json")
    assert code == 0, out
    r = json.loads(out)
    fewer, best = r["keep_fewer"], r["best"]
    assert fewer["devices"] == 8 and fewer["switch"]["bytes"] == 0
    assert best["tp"] * best["dp"] == 12 and best["step_time_s"] > 1.5 * fewer["step_time_s"]
    assert r["step_gain_s"] < 0 and r["payback_steps"] is None
    code, text = run(*args)
    assert "keeping the shape on 8 of the 12 devices is faster than any layout of all of them" in text
    # where every device can run the kept shape there is no such row
    code, out = run("replan", "lstm-lm", "--from", "--backend a100-80gb --dp 8 --global-batch 256 --micro-batch 32 "
                    "--seq-len 35", "--devices", "4", "--json")  # fmt: skip
    assert code == 0 and "keep_fewer" not in json.loads(out)
