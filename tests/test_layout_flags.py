"""A layout written as compile flags means the same to every command: plan -> flags -> plan is the identity."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.commands.options import parse_layout_flags
from echosim.errors import EchosimError
from echosim.plan import DEFAULT_CLUSTER, DEFAULT_PLAN, Cluster, Plan, PlanError, plan_flags

plans = st.builds(
    Plan,
    tp=st.sampled_from([1, 2, 8]),
    pp=st.sampled_from([1, 4]),
    dp=st.sampled_from([1, 2, 16]),
    micro_batch=st.sampled_from([1, 2]),
    global_batch=st.sampled_from([0, 64]),
    seq_len=st.sampled_from([0, 4096]),
    dtype=st.sampled_from(["fp32", "fp16", "bf16", "fp8"]),
    recompute=st.sampled_from(["none", "selective", "full"]),
    schedule=st.sampled_from(["1f1b", "zb-h1", "interleaved"]),
    attention=st.sampled_from(["flash", "math"]),
    pp_balance=st.sampled_from(["uniform", "cost"]),
    sp=st.booleans(),
    cp=st.sampled_from([1, 2]),
    ep=st.sampled_from([1, 4]),
    zero=st.integers(0, 3),
    vpp=st.sampled_from([1, 2]),
    tp_overlap=st.booleans(),
    cp_comm=st.sampled_from(["p2p", "all_gather"]),
    cp_balance=st.booleans(),
    moe_capacity_factor=st.sampled_from([0.0, 1.25, 1 / 3]),
    moe_imbalance=st.sampled_from([1.0, 1.5]),
    passes=st.sampled_from([(), ("demo-pass",)]),
    framework=st.sampled_from(["eager", "nemo", "maxtext"]),
)
clusters = st.builds(
    Cluster,
    backend=st.sampled_from(["a100-80gb", "h100-sxm"]),
    devices=st.sampled_from([0, 64, 1024]),
    devices_per_node=st.sampled_from([4, 8]),
)


@settings(max_examples=60, deadline=None)
@given(plans, clusters)
def test_flags_parse_back_to_the_same_plan_and_cluster(plan: Plan, cluster: Cluster) -> None:
    if cluster.devices == 0:
        cluster = Cluster(cluster.backend, plan.world, cluster.devices_per_node)
    flags = shlex.join(plan_flags(plan, cluster))
    assert parse_layout_flags("gpt3-1.3b", flags, "--a") == ("gpt3-1.3b", plan, cluster)


def test_the_default_run_written_as_flags() -> None:
    flags = plan_flags(DEFAULT_PLAN, DEFAULT_CLUSTER)
    assert shlex.join(flags) == (
        "--tp 8 --pp 16 --dp 8 --global-batch 1536 --seq-len 2048 --dtype fp16 --recompute full --attention math"
    )
    assert parse_layout_flags("gpt3-175b", shlex.join(flags), "--a")[1:] == (DEFAULT_PLAN, DEFAULT_CLUSTER)


def test_bad_flags_are_one_line() -> None:
    with pytest.raises(EchosimError, match=r"--a '--tp eight': Invalid value for '--tp': 'eight' is not a valid"):
        parse_layout_flags("gpt3-1.3b", "--tp eight", "--a")
    with pytest.raises(EchosimError, match=r"--b '--tpp 2': No such option '--tpp'"):
        parse_layout_flags("gpt3-1.3b", "--tpp 2", "--b")
    with pytest.raises(EchosimError, match="No closing quotation"):
        parse_layout_flags("gpt3-1.3b", "--schedule '1f1b", "--b")
    with pytest.raises(PlanError, match="overlap_dp=False has no compile flag"):
        plan_flags(Plan(overlap_dp=False), Cluster())
