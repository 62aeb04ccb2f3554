"""The optimizer offloaded to the host (``--offload-optimizer``): memory, the step's time, refusals, configs.

Closed forms: the device keeps no optimizer state (DeepSpeed's own estimate for ZeRO-2 with CPU offload counts only
the 16-bit weights); the step costs the rank's parameters' fp32 gradients down and fp32 weights back over the host
link, and fp32 AdamW's traffic through the host's DRAM, which the host's GPUs share."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from echosim.backends.compute import HOST_LINK_BYTES_PER_PARAM, host_optimizer_time_s, offload_refusal
from echosim.backends.devices import DEVICES
from echosim.cli import cli
from echosim.configs import ConfigError, read_args, read_source
from echosim.passes.data_parallel import ADAM_FP32_BYTES_PER_PARAM

_GPT = ["gpt3-1.3b", "--devices", "16", "--global-batch", "16", "--dtype", "fp16", "--framework", "deepspeed"]


def _compile(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["compile", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _refused(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.mark.parametrize("backend", ["a100-80gb", "h100-sxm", "gb200"])
def test_the_step_is_the_host_closed_form(backend: str) -> None:
    """ZeRO-2 over 16 ranks: each rank's 1/16 of the parameters, 8 bytes each over its host link and 32 through its
    host's DRAM at the host's bandwidth over the GPUs it holds."""
    got = _compile(*_GPT, "--backend", backend, "--zero", "2", "--offload-optimizer")
    dev = DEVICES[backend]
    local = math.ceil(got["params"] / 16)
    link = local * HOST_LINK_BYTES_PER_PARAM / (dev.host_link_GBps * 1e9)
    sharing = dev.gpus_per_host or dev.devices_per_node
    host = local * ADAM_FP32_BYTES_PER_PARAM * sharing / (dev.host_memory_GBps * 1e9)
    assert got["breakdown"]["optimizer"] == pytest.approx(link + host, rel=1e-5)  # the JSON rounds to 6 digits
    assert host_optimizer_time_s(dev, local, ADAM_FP32_BYTES_PER_PARAM, 16) == pytest.approx(link + host, rel=1e-12)


def test_the_device_keeps_no_optimizer_state() -> None:
    on = _compile(*_GPT, "--backend", "a100-80gb", "--zero", "2", "--offload-optimizer")["memory"][0]
    off = _compile(*_GPT, "--backend", "a100-80gb", "--zero", "2")["memory"][0]
    assert on["optimizer"] == 0 < off["optimizer"]
    assert (on["params"], on["grads"], on["activations"]) == (off["params"], off["grads"], off["activations"])
    # DeepSpeed's estimate_zero2_model_states_mem_needs(cpu_offload=True): 2 bytes a parameter on the GPU (its
    # 16-bit weights); echosim also keeps the rank's 16-bit gradient partition, 2 / dp bytes a parameter
    params = _compile(*_GPT, "--backend", "a100-80gb", "--zero", "2")["params"]
    assert on["params"] == pytest.approx(2 * params, rel=1e-3)
    assert on["grads"] == pytest.approx(2 * params / 16, rel=1e-3)


def test_one_gpu_that_could_not_hold_the_optimizer_now_fits() -> None:
    """ZeRO-Offload's own case: Llama 3 8B on one H100 (DeepSpeed, bf16, ZeRO-2, full recompute). Its 12 bytes a
    parameter of fp32 state do not fit; offloaded, the one rank has its host's whole DRAM bandwidth to itself."""
    flags = ["llama3-8b", "--backend", "h100-sxm", "--devices", "1", "--zero", "2", "--global-batch", "4",
             "--seq-len", "4096", "--recompute", "full", "--framework", "deepspeed", "--dtype", "bf16"]  # fmt: skip
    off, on = _compile(*flags), _compile(*flags, "--offload-optimizer")
    assert not off["fits"] and on["fits"]
    dev, params = DEVICES["h100-sxm"], on["params"]
    host = params * HOST_LINK_BYTES_PER_PARAM / (dev.host_link_GBps * 1e9)
    host += params * ADAM_FP32_BYTES_PER_PARAM / (dev.host_memory_GBps * 1e9)  # no other GPU of the job shares it
    assert on["breakdown"]["optimizer"] == pytest.approx(host, rel=1e-5)
    assert on["step_time_s"] - off["step_time_s"] == pytest.approx(host - off["breakdown"]["optimizer"], rel=1e-3)
    # the host's memory: the fp32 master, two moments and gradient of every parameter, 16 bytes each
    assert f"about {params * 16 / 2**30:,.1f} GiB of optimizer state in" in " ".join(on["notes"])


def test_refusals_are_one_line() -> None:
    base = ["compile", "gpt3-125m", "--devices", "2", "--offload-optimizer"]
    assert "--zero 1 or higher" in _refused(*base, "--backend", "h100-sxm")
    assert "not a GPU backend" in _refused(*base, "--backend", "tpu-v5p", "--zero", "1")
    assert "not a GPU backend" in _refused(*base, "--backend", "cpu-x86", "--zero", "1")


def test_a_device_without_host_figures_is_refused() -> None:
    bare = replace(DEVICES["h100-sxm"], name="bare", host_memory_GBps=None)
    assert offload_refusal(bare) == "device 'bare' has no host_memory_GBps figure"
    assert offload_refusal(DEVICES["h100-sxm"]) == ""
    with pytest.raises(ValueError, match="no host_memory_GBps"):
        host_optimizer_time_s(bare, 10, 32, 1)


def test_every_builtin_gpu_has_host_figures() -> None:
    for dev in DEVICES.values():
        assert offload_refusal(dev) == "", dev.name
        # a host link is slower than the GPU's own memory and its NVLink; the host's DRAM slower than HBM
        assert dev.host_link_GBps < dev.nvlink_GBps and dev.host_memory_GBps < dev.hbm_stream_GBps


def test_search_offloads_every_layout() -> None:
    result = CliRunner().invoke(cli, ["search", "llama3-8b", "--backend", "h100-sxm", "--devices", "8",
                                      "--global-batch", "8", "--seq-len", "4096", "--offload-optimizer",
                                      "--space", "tp=1,2", "--space", "pp=1", "--space", "cp=1", "--space",
                                      "mb=1", "--space", "recompute=full", "--space", "zero=0,1",
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["layouts"]
    assert all("--zero 1 or higher" in r["reason"] for r in rows if r["zero"] == 0)
    ran = [r for r in rows if r["simulated"]]
    assert ran and all(r["zero"] >= 1 for r in ran)
    best = min(ran, key=lambda r: r["step_time_s"])
    flags = ["llama3-8b", "--backend", "h100-sxm", "--devices", "8", "--global-batch", "8", "--seq-len", "4096",
             "--offload-optimizer", "--tp", str(best["tp"]), "--zero", str(best["zero"]), "--micro-batch", "1",
             "--recompute", "full"]  # fmt: skip
    assert _compile(*flags)["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-5)


# ---- framework configs ----------------------------------------------------------------------------------------


def _deepspeed(tmp_path: Path, zero: dict[str, Any]) -> Any:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 16, "zero_optimization": zero, "bf16": {"enabled": True}}))
    return read_source(f"deepspeed:{path}")


def test_deepspeed_offload_optimizer(tmp_path: Path) -> None:
    cpu = _deepspeed(tmp_path, {"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": True}})
    assert cpu.options["offload_optimizer"] is True and not [n for n in cpu.notes if "offload" in n]
    none = _deepspeed(tmp_path, {"stage": 2, "offload_optimizer": {"device": "none"}})
    assert "offload_optimizer" not in none.options
    nvme = _deepspeed(tmp_path, {"stage": 3, "offload_optimizer": {"device": "nvme"}})
    assert "offload_optimizer" not in nvme.options and any("nvme" in n and "not modelled" in n for n in nvme.notes)
    stage0 = _deepspeed(tmp_path, {"stage": 0, "offload_optimizer": {"device": "cpu"}})
    assert "offload_optimizer" not in stage0.options and any("only under ZeRO" in n for n in stage0.notes)
    ratio = _deepspeed(tmp_path, {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}})
    assert ratio.options["offload_optimizer"] is True and any("partial offload" in n for n in ratio.notes)


_ARGS = ("--num-layers 8 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
         "--micro-batch-size 1 --global-batch-size 8 --bf16 --vocab-size 1000 --use-distributed-optimizer")  # fmt: skip


def test_megatron_optimizer_cpu_offload() -> None:
    got = read_args(f"{_ARGS} --use-precision-aware-optimizer --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d")
    assert got.options["offload_optimizer"] is True and got.options["zero"] == 1
    with pytest.raises(ConfigError, match="needs --use-precision-aware-optimizer"):
        read_args(f"{_ARGS} --optimizer-cpu-offload")
    offload = "--use-precision-aware-optimizer --optimizer-cpu-offload"
    part = read_args(f"{_ARGS} {offload} --optimizer-offload-fraction 0.5")
    assert any("partial offload" in n for n in part.notes)
    with pytest.raises(ConfigError, match="is not a number"):
        read_args(f"{_ARGS} {offload} --optimizer-offload-fraction x")
    alone = read_args(f"{_ARGS} --optimizer-offload-fraction 0.5")
    assert "offload_optimizer" not in alone.options and any("ignored" in n for n in alone.notes)


def test_diff_names_the_offload_as_the_cause(tmp_path: Path) -> None:
    flags = ["llama3-8b", "--backend", "h100-sxm", "--devices", "1", "--zero", "2", "--global-batch", "4",
             "--seq-len", "4096", "--recompute", "full", "--framework", "deepspeed", "--dtype", "bf16"]  # fmt: skip
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_compile(*flags)))
    b.write_text(json.dumps(_compile(*flags, "--offload-optimizer")))
    result = CliRunner().invoke(cli, ["diff", str(a), str(b)])
    assert result.exit_code == 0, result.output
    for term in ("optimizer ", "memory.optimizer", "memory.transient"):
        line = next(x for x in result.output.splitlines() if x.startswith(term))
        assert line.endswith("offload_optimizer off -> on"), line


def test_search_compares_offloading_with_not() -> None:
    """--space offload_optimizer=false,true: one GPU, Llama 3 8B. Only the offloaded layouts fit, every ZeRO stage
    alike with one replica (DeepSpeed's are listed apart: it keeps other state under ZeRO), none without ZeRO."""
    flags = ["search", "llama3-8b", "--backend", "h100-sxm", "--devices", "1", "--global-batch", "4", "--seq-len",
             "4096", "--framework", "deepspeed", "--dtype", "bf16", "--space", "zero=0,1,2,3", "--space", "mb=1",
             "--space", "recompute=full", "--space", "schedule=1f1b", "--space", "offload_optimizer=false,true",
             "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, flags)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["layouts"]
    got = sorted((r["zero"], r["offload_optimizer"], r["fits"]) for r in rows)
    assert got == [(0, False, False), (1, False, False), (1, True, True), (2, False, False), (2, True, True),
                   (3, False, False), (3, True, True)]  # fmt: skip
    best = json.loads(result.output)["best"][0]
    for zero in ("1", "2", "3"):  # the stages the one listed stands for
        got = _compile("llama3-8b", "--backend", "h100-sxm", "--devices", "1", "--global-batch", "4", "--seq-len",
                       "4096", "--framework", "deepspeed", "--dtype", "bf16", "--zero", zero, "--micro-batch", "1",
                       "--recompute", "full", "--offload-optimizer")  # fmt: skip
        assert got["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-5)
        assert got["memory"][0]["peak"] == pytest.approx(best["peak_bytes"], rel=1e-5)


# ---- ZeRO-3's weight shards in host memory (--offload-params) ---------------------------------------------------


def _fsdp_gathers(offload: bool) -> tuple[list[Any], Any]:
    from echosim.compiler import prepare
    from echosim.plan import Cluster, Plan
    from echosim.timeline.lower import Coster

    plan = Plan(dp=8, zero=3, micro_batch=1, global_batch=8, dtype="bf16", framework="deepspeed",
                offload_params=offload, offload_optimizer=offload)  # fmt: skip
    step = prepare("gpt3-1.3b", plan, Cluster("h100-sxm", 8))
    graph = step.stages[0].graph
    gathers = [n for n in graph if n.op.value == "all_gather" and n.name.startswith("fsdp.param_all_gather")]
    coster = Coster(graph, step.backend, step.where)
    return [(n.attrs, coster(n)) for n in gathers], step


def test_each_gather_first_fetches_the_rank_shard_over_the_host_link() -> None:
    on, _ = _fsdp_gathers(True)
    off, _ = _fsdp_gathers(False)
    assert on and len(on) == len(off)
    link = DEVICES["h100-sxm"].host_link_GBps * 1e9
    for (a, s_on), (b, s_off) in zip(on, off, strict=True):
        assert a.host_bytes == a.bytes // 8 and b.host_bytes == 0
        assert s_on - s_off == pytest.approx(a.host_bytes / link, rel=1e-9)
        assert f"host_bytes={a.host_bytes}" in str(a)


def test_the_device_keeps_no_weight_shard() -> None:
    zero3 = [*_GPT, "--backend", "h100-sxm", "--zero", "3", "--offload-optimizer"]
    on = _compile(*zero3, "--offload-params")["memory"][0]
    off = _compile(*zero3)["memory"][0]
    assert on["params"] == 0 < off["params"]
    assert (on["grads"], on["optimizer"], on["activations"]) == (off["grads"], off["optimizer"], off["activations"])
    notes = " ".join(_compile(*zero3, "--offload-params")["notes"])
    assert "of optimizer state and weight shards in its memory (8 ranks x 18 B per parameter" in notes


def test_offloaded_weights_need_zero_3() -> None:
    line = _refused("compile", "gpt3-125m", "--devices", "2", "--backend", "h100-sxm", "--zero", "2",
                    "--offload-params")  # fmt: skip
    assert "--offload-params" in line and "--zero 3" in line
    assert "not a GPU backend" in _refused("compile", "gpt3-125m", "--devices", "2", "--backend", "tpu-v5p",
                                           "--zero", "3", "--offload-params")  # fmt: skip


def test_deepspeed_offload_param(tmp_path: Path) -> None:
    both = _deepspeed(
        tmp_path, {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}
    )
    assert both.options["offload_params"] is True and both.options["offload_optimizer"] is True
    stage2 = _deepspeed(tmp_path, {"stage": 2, "offload_param": {"device": "cpu"}})
    assert "offload_params" not in stage2.options and any("only under ZeRO stage 3" in n for n in stage2.notes)
    nvme = _deepspeed(tmp_path, {"stage": 3, "offload_param": {"device": "nvme"}})
    assert "offload_params" not in nvme.options and any("nvme" in n and "not modelled" in n for n in nvme.notes)


def test_torchtitan_cpu_offload(tmp_path: Path) -> None:
    """training.enable_cpu_offload is FSDP2's CPUOffloadPolicy: weight shards and optimizer on the host, with FSDP."""
    text = (Path(__file__).parent / "data" / "configs" / "torchtitan" / "llama3_8b.toml").read_text()
    text = text.replace("[training]", "[training]\nenable_cpu_offload = true", 1)
    path = tmp_path / "job.toml"
    path.write_text(text)
    cfg = read_source(f"torchtitan:{path}")
    assert cfg.options["zero"] == 3
    assert cfg.options["offload_params"] is True and cfg.options["offload_optimizer"] is True
    alone = tmp_path / "alone.toml"
    alone.write_text(text.replace("data_parallel_shard_degree = -1", "data_parallel_shard_degree = 1"))
    cfg = read_source(f"torchtitan:{alone}")
    assert "offload_params" not in cfg.options and any("applies with FSDP only" in n for n in cfg.notes)


def test_search_figures_equal_compile_with_offloaded_weights() -> None:
    flags = ["llama3-8b", "--backend", "h100-sxm", "--devices", "8", "--global-batch", "8", "--seq-len", "4096"]
    result = CliRunner().invoke(cli, ["search", *flags, "--offload-params", "--offload-optimizer", "--space",
                                      "tp=1,2", "--space", "pp=1", "--space", "cp=1", "--space", "mb=1",
                                      "--space", "recompute=full", "--space", "zero=2,3", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["layouts"]
    assert all("--zero 3" in r["reason"] for r in rows if r["zero"] == 2)
    ran = [r for r in rows if r["simulated"]]
    assert ran and all(r["zero"] == 3 for r in ran)
    for r in ran:
        got = _compile(*flags, "--offload-params", "--offload-optimizer", "--tp", str(r["tp"]), "--zero", "3",
                       "--micro-batch", "1", "--recompute", "full", *(["--sp"] if r["sp"] else []),
                       "--schedule", r["schedule"], *(["--tp-overlap"] if r["tp_overlap"] else []))  # fmt: skip
        assert got["step_time_s"] == pytest.approx(r["step_time_s"], rel=1e-5)


def test_a_search_that_offloads_on_a_tpu_is_one_line() -> None:
    line = _refused("search", "llama3-8b", "--backend", "tpu-v5p", "--devices", "8", "--global-batch", "8",
                    "--space", "offload_optimizer=false,true")  # fmt: skip
    assert line == "Error: --offload-optimizer: backend 'tpu-v5p': not a GPU backend"


def test_an_overlapped_offload_takes_the_slowest_of_its_three_parts() -> None:
    """Megatron-Core's --overlap-cpu-optimizer-d2h-h2d pipelines the copies and the host step over parameter
    groups: each direction of the link carries its 4 bytes a parameter while the host steps another group."""
    flags = [*_GPT, "--backend", "a100-80gb", "--zero", "2", "--offload-optimizer"]
    serial = _compile(*flags)["breakdown"]["optimizer"]
    overlapped = _compile(*flags, "--offload-overlap")["breakdown"]["optimizer"]
    dev = DEVICES["a100-80gb"]
    local = math.ceil(_compile(*flags)["params"] / 16)
    one_way = local * 4 / (dev.host_link_GBps * 1e9)
    dram = local * ADAM_FP32_BYTES_PER_PARAM * 8 / (dev.host_memory_GBps * 1e9)
    assert serial == pytest.approx(2 * one_way + dram, rel=1e-5)
    assert overlapped == pytest.approx(max(one_way, dram), rel=1e-5)
    line = _refused("compile", "gpt3-125m", "--devices", "2", "--backend", "h100-sxm", "--zero", "1",
                    "--offload-overlap")  # fmt: skip
    assert "give --offload-optimizer" in line


def test_megatron_overlap_flag_is_read() -> None:
    got = read_args(f"{_ARGS} --use-precision-aware-optimizer --optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d")
    assert got.options["offload_overlap"] is True and not [n for n in got.notes if "overlap-cpu" in n]
    alone = read_args(f"{_ARGS} --overlap-cpu-optimizer-d2h-h2d")
    assert "offload_overlap" not in alone.options
    assert any("--overlap-cpu-optimizer-d2h-h2d: read only with --optimizer-cpu-offload" in n for n in alone.notes)


def test_hosts_that_cannot_hold_the_offloaded_state_are_named() -> None:
    """Each host holds its ranks' share of the offloaded state (16 B a parameter of optimizer state, 2 of 16-bit
    weights): more than the reference host's system memory (DeviceSpec.host_memory_GB: a DGX A100 320GB's 1 TB) is a
    warning, and twice the hosts halve the share; a part without the figure is not checked."""
    from echosim.backends.loading import load_backend
    from echosim.layout import host_state
    from echosim.plan import Plan

    backend = load_backend("a100-40gb")
    params = 70_000_000_000
    one_host = Plan(dp=8, zero=3, offload_optimizer=True, offload_params=True)
    note, over = host_state(params, one_host, backend)
    need_gib = params * 18 / 2**30
    assert f"{need_gib:,.1f} GiB of optimizer state and weight shards" in note
    assert over.startswith(f"offload: each host needs about {need_gib:,.0f} GiB") and "931 GiB (1 TB)" in over
    assert host_state(params, replace(one_host, dp=16), backend)[1] == ""  # 587 GiB a host
    assert host_state(params, one_host, load_backend("a100-80gb"))[1] == ""  # a DGX A100 640GB's 2 TB
    assert host_state(params, one_host, load_backend("h800"))[1] == ""  # no figure: no check
    assert [d.name for d in DEVICES.values() if d.host_link_GBps and d.host_memory_GB is None] == [
        "h100-96gb", "h800", "b300", "gb300"
    ]  # fmt: skip


def test_a_search_rejects_offloads_the_hosts_cannot_hold() -> None:
    args = ["search", "llama3-70b", "--backend", "a100-40gb", "--devices", "8", "--global-batch", "8", "--seq-len",
            "4096", "--offload-optimizer", "--offload-params", "--zero", "3", "--recompute", "full", "--space",
            "pp=1", "--space", "vpp=1", "--space", "tp=1", "--micro-batches", "1"]  # fmt: skip
    line = _refused(*args)
    assert "by host memory" in line and "more than the 931 GiB (1 TB) of system memory" in line
    result = CliRunner().invoke(cli, [*args[:5], "16", "--global-batch", "16", *args[8:], "--json"])
    assert result.exit_code == 0, result.output
    assert any(r["simulated"] for r in json.loads(result.output)["layouts"])
    # the weights alone (2 B a parameter, 140 GB a host) fit the hosts: judged by what they take, not the optimizer's
    # 16 more (these layouts then fail on the device, which keeps the optimizer); with it offloaded, the hosts refuse
    weights = [a for a in args if a != "--offload-optimizer"]
    assert "by memory lower bound" in _refused(*weights) and "host memory" not in _refused(*weights)
    both = _refused(*weights, "--space", "offload_optimizer=false,true")
    assert "(9 by memory lower bound, 9 by host memory)" in both


def test_a_change_whose_hosts_cannot_hold_the_offload_is_no_way_out() -> None:
    """explain (and compile's "cheapest change that fits") do not offer a layout whose device memory suffices when its
    hosts cannot hold the offloaded state: it does not fit, and says why."""
    from echosim.compiler import compile as compile_fn
    from echosim.explain.whatif import simulate
    from echosim.plan import Cluster, Plan

    plan = Plan(dp=8, zero=3, offload_optimizer=True, offload_params=True, global_batch=8, seq_len=4096,
                recompute="full")  # fmt: skip
    cluster = Cluster("a100-40gb", 8)
    base = compile_fn("llama3-70b", plan, cluster)
    (outcome,) = simulate("llama3-70b", plan, cluster, [replace(plan, grad_dtype="bf16")], compile_fn, base)
    assert outcome.report.fits and not outcome.fits  # 31.7 GiB of 40 on the device; 1,183 GiB of 931 on the host
    assert outcome.host.startswith("offload: each host needs about 1,183 GiB") and outcome.as_dict()["host"]
