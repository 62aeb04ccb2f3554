"""``echosim cost``: the time of one op (a matmul, an attention kernel, a memory-bound kernel
or a collective) on one backend, as the compiler would cost it.

Registered through ``register_commands`` like any plugin's commands. The commands parse,
call the backend and format; every user error ends as one line and exit status 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import click

from echosim.commands.options import calibration_option
from echosim.errors import one_line_errors
from echosim.plugins import hookimpl

DTYPES = ("bf16", "fp16", "fp8", "fp32")
#: matmul only: NVFP4 operands (e2m1, one e4m3 scale per 16), where the tensor cores take them.
MATMUL_DTYPES = (*DTYPES, "nvfp4")
COLLECTIVES = {
    "all_reduce": "ALL_REDUCE",
    "all_gather": "ALL_GATHER",
    "reduce_scatter": "REDUCE_SCATTER",
    "all_to_all": "ALL_TO_ALL",
    "broadcast": "BROADCAST",
    "send": "SEND",
    "recv": "RECV",
}


_guarded = one_line_errors(ValueError)  # user errors and argument checks end as one line


def _backend(ctx: click.Context, **settings: Any) -> Any:
    """The backend --backend names, under ``settings`` (a software stack its ``variant`` models), calibrated."""
    from echosim.backends.loading import GuardedBackend, load_backend

    name = ctx.meta.get("echosim.cost.backend") or ctx.obj["backend"]
    if not name:
        command = f"echosim cost {ctx.info_name} --backend NAME"
        raise click.UsageError(f"--backend is required (see `echosim backends`): {command}")
    backend = load_backend(name)
    if settings:
        inner = getattr(backend, "inner", backend)
        if not hasattr(inner, "variant"):
            raise click.ClickException(f"backend {name!r} models no other software stack ({', '.join(settings)})")
        backend = GuardedBackend(inner.variant(**settings), backend.name, backend.owner)
    calibration = ctx.obj["calibration"]
    if calibration:  # as compile applies it: NAME, FILE or FILE#NAME, fitted parameters and measured rows
        from echosim.calibrate import apply_calibration

        backend = apply_calibration(backend, calibration)
    return backend


def _emit(ctx: click.Context, result: dict[str, Any], as_json: bool) -> None:
    if as_json or ctx.obj["json"]:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    for key, value in result.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        click.echo(f"{key:>18}: {value}")


BACKEND_HELP = "Backend to cost on (see `echosim backends`); before or after the op's name."


def _json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """--json and --backend on each op, so that `echosim cost matmul --backend X` works as well."""
    fn = click.option("--backend", "_backend_name", expose_value=False, help=BACKEND_HELP, callback=_keep_backend)(fn)
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)


def _keep_backend(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value:
        ctx.meta["echosim.cost.backend"] = value
    return value


@click.group("cost")
@click.option("--backend", help=BACKEND_HELP)
@calibration_option(
    help="Use a calibration from `echosim calibrate` (NAME, FILE or FILE#NAME), as `echosim compile` does: its "
    "fitted parameters, its measured kernels answering first."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def cost(ctx: click.Context, backend: str | None, calibration: str | None, as_json: bool) -> None:
    """Cost one op on one backend: a matmul, an attention kernel, a memory-bound kernel or a collective."""
    ctx.obj = {"backend": backend, "calibration": calibration, "json": as_json}


def _node(op_name: str, attrs: Any, dtype: str) -> Any:
    from echosim.ir.graph import Node
    from echosim.ir.ops import OpKind
    from echosim.ir.types import DType, TensorSpec

    return Node(0, OpKind[op_name], (), TensorSpec((1,), DType(dtype)), attrs)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise click.ClickException(f"--{name.replace('_', '-')} must be positive, got {value}")


@cost.command("matmul")
@click.option("--m", type=int, required=True, help="Rows of the output.")
@click.option("--n", type=int, required=True, help="Columns of the output.")
@click.option("--k", type=int, required=True, help="Contracted dimension.")
@click.option("--batch", type=int, default=1, show_default=True, help="Independent products (bmm).")
@click.option("--dtype", type=click.Choice(MATMUL_DTYPES), default="bf16", show_default=True)
@click.option(
    "--run",
    "run_kind",
    type=click.Choice(("training", "short")),
    default="training",
    show_default=True,
    help="training: as a training step's GEMM runs for minutes (the library's pick at the power-limited clock); "
    "short: a benchmark of a few iterations (the autotuned rate, no sustained cap), what short-run cuBLAS picks "
    "reach at large shapes (benchmarks/aic_gemm_check.md).",
)
@_json_option
@click.pass_context
@_guarded
def cost_matmul(
    ctx: click.Context, m: int, n: int, k: int, batch: int, dtype: str, run_kind: str, as_json: bool
) -> None:
    """Time and TFLOP/s of (m x k) @ (k x n), --batch times."""
    from echosim.ir.ops import MatmulAttrs
    from echosim.layout import format_refusal

    _positive(m=m, n=n, k=k, batch=batch)
    short = {"autotuned_gemms": True, "sustained_gemms": False} if run_kind == "short" else {}
    backend = _backend(ctx, **short)
    if refusal := format_refusal(dtype, backend):
        raise click.ClickException(refusal)
    if dtype == "nvfp4":  # 16-bit tensors whose GEMM quantises its operands, as passes.precision marks it
        node = _node("MATMUL", MatmulAttrs(m, n, k, batch, precision=dtype), "bf16")
    else:
        node = _node("MATMUL", MatmulAttrs(m, n, k, batch), dtype)
    seconds = backend.op_time_s(node, 0)
    flops = 2.0 * batch * m * n * k
    result = {
        "backend": backend.name,
        "op": "matmul",
        "m": m,
        "n": n,
        "k": k,
        "batch": batch,
        "dtype": dtype,
        "run": run_kind,
        "time_s": seconds,
        "time_us": seconds * 1e6,
        "tflops": flops / seconds / 1e12,
        "fraction_of_peak": flops / seconds / backend.peak_flops(dtype),
    }
    _emit(ctx, result, as_json)


@cost.command("attention")
@click.option("--batch", type=int, required=True)
@click.option("--heads", type=int, required=True)
@click.option("--kv-heads", type=int, help="Key/value heads (default: --heads).")
@click.option("--seq", type=int, required=True, help="Query length (and key length unless --kv-seq).")
@click.option("--kv-seq", type=int, help="Key/value length.")
@click.option("--head-dim", type=int, default=128, show_default=True)
@click.option("--causal/--no-causal", default=True, show_default=True)
@click.option("--kernel", type=click.Choice(["flash", "math"]), default="flash", show_default=True)
@click.option("--backward", is_flag=True, help="Cost the backward kernel(s).")
@click.option("--dtype", type=click.Choice(DTYPES), default="bf16", show_default=True)
@_json_option
@click.pass_context
@_guarded
def cost_attention(
    ctx: click.Context,
    batch: int,
    heads: int,
    kv_heads: int | None,
    seq: int,
    kv_seq: int | None,
    head_dim: int,
    causal: bool,
    kernel: str,
    backward: bool,
    dtype: str,
    as_json: bool,
) -> None:
    """Time of one attention forward (or backward) at this shape."""
    from echosim.backends.compute import causal_fraction
    from echosim.ir.ops import AttentionAttrs, Phase

    kv_heads, kv_seq = kv_heads or heads, kv_seq or seq
    _positive(batch=batch, heads=heads, kv_heads=kv_heads, seq=seq, kv_seq=kv_seq, head_dim=head_dim)
    if heads % kv_heads:
        raise click.ClickException(f"--kv-heads {kv_heads} does not divide --heads {heads}")
    attrs = AttentionAttrs(batch, heads, kv_heads, seq, kv_seq, head_dim, causal=causal, flash=kernel == "flash")
    node = _node("ATTENTION", attrs, dtype)
    if backward:
        from dataclasses import replace

        node = replace(node, phase=Phase.BACKWARD)
    backend = _backend(ctx)
    seconds = backend.op_time_s(node, 0)
    flops = attrs.flops * (causal_fraction(seq, kv_seq) if causal else 1.0) * (2.5 if backward else 1.0)
    result = {
        "backend": backend.name,
        "op": "attention",
        "kernel": kernel,
        "backward": backward,
        "dtype": dtype,
        "time_s": seconds,
        "time_us": seconds * 1e6,
        "tflops": flops / seconds / 1e12,
    }
    if (padded := _flash_head_dim(backend, attrs)) != head_dim:
        result["kernel_head_dim"] = padded  # the FlashAttention template the call runs (compute.FLASH_KERNEL_HEAD_DIMS)
    _emit(ctx, result, as_json)


def _flash_head_dim(backend: Any, attrs: Any) -> int:
    """The head size a GPU backend's own flash kernel computes on for ``attrs`` (``attrs.head_dim`` elsewhere)."""
    from echosim.backends.compute import flash_family, flash_kernel_head_dim, flash_view
    from echosim.backends.devices import DeviceSpec

    dev = getattr(getattr(backend, "inner", backend), "device", None)
    if not attrs.flash or not isinstance(dev, DeviceSpec):
        return int(attrs.head_dim)
    view = flash_view(dev, attrs.kernel)  # the same view and template set compute.attention_time_s prices
    return flash_kernel_head_dim(flash_family(view, attrs.kernel), attrs)


@cost.command("memory")
@click.option("--bytes", "nbytes", type=int, required=True, help="Bytes read plus written.")
@_json_option
@click.pass_context
@_guarded
def cost_memory(ctx: click.Context, nbytes: int, as_json: bool) -> None:
    """Time of one memory-bound kernel (elementwise, norm, softmax) moving --bytes."""
    from echosim.ir.ops import ElementwiseAttrs

    if nbytes < 0:
        raise click.ClickException(f"--bytes must be non-negative, got {nbytes}")
    backend = _backend(ctx)
    seconds = backend.op_time_s(_node("ELEMENTWISE", ElementwiseAttrs("copy"), "bf16"), nbytes)
    result = {
        "backend": backend.name,
        "op": "memory",
        "bytes": nbytes,
        "time_s": seconds,
        "time_us": seconds * 1e6,
        "GBps": nbytes / seconds / 1e9 if seconds else 0.0,
    }
    _emit(ctx, result, as_json)


def placement_for(backend: Any, group: int, nodes: int | None, concurrent: int) -> Any:
    """Place ``group`` ranks on whole nodes of the backend's ``devices_per_node``; name what does not fit."""
    from echosim.backends.base import Placement

    if group < 1:
        raise click.ClickException(f"--group must be positive, got {group}")
    if concurrent < 1:
        raise click.ClickException(f"--concurrent must be positive, got {concurrent}")
    per_domain = backend.describe().get("devices_per_node")
    if nodes is None:
        nodes = math.ceil(group / per_domain) if per_domain else 1
    if nodes < 1:
        raise click.ClickException(f"--nodes must be positive, got {nodes}")
    if per_domain and group > nodes * per_domain:
        raise click.ClickException(
            f"a group of {group} {backend.name} devices is larger than the cluster "
            f"({nodes} node(s) x {per_domain} devices = {nodes * per_domain})"
        )
    if group % nodes:
        raise click.ClickException(f"a group of {group} does not divide evenly over {nodes} nodes")
    return Placement(group, nodes, group // nodes, concurrent)


def _collective(name: str) -> click.Command:
    @click.option("--bytes", "nbytes", type=int, required=True, help="Buffer size (nccl-tests convention).")
    @click.option("--group", type=int, required=True, help="Ranks in the communicator.")
    @click.option("--nodes", type=int, help="Nodes the group spans (default: as few as hold it).")
    @click.option("--concurrent", type=int, default=1, show_default=True, help="Sibling groups sharing each node.")
    @_json_option
    @click.pass_context
    @_guarded
    def command(ctx: click.Context, nbytes: int, group: int, nodes: int | None, concurrent: int, as_json: bool) -> None:
        from echosim.ir.ops import OpKind

        if nbytes < 0:
            raise click.ClickException(f"--bytes must be non-negative, got {nbytes}")
        backend = _backend(ctx)
        placement = placement_for(backend, group, nodes, concurrent)
        kind = OpKind[COLLECTIVES[name]]
        seconds = backend.collective_time_s(kind, nbytes, placement)
        factor = {"all_reduce": 2 * (group - 1) / group, "send": 1.0, "recv": 1.0, "broadcast": 1.0}.get(
            name, (group - 1) / group
        )
        result: dict[str, Any] = {
            "backend": backend.name,
            "op": name,
            "bytes": nbytes,
            "group": group,
            "nodes": placement.nodes,
            "per_node": placement.per_node,
            "time_s": seconds,
            "time_us": seconds * 1e6,
            "algbw_GBps": nbytes / seconds / 1e9 if seconds else 0.0,
            "busbw_GBps": nbytes * factor / seconds / 1e9 if seconds else 0.0,
        }
        result.update(_explain(backend, kind, nbytes, placement))
        _emit(ctx, result, as_json)

    command.__doc__ = f"Time and bus bandwidth of one {name} of --bytes over --group ranks."
    return cost.command(name)(command)


def _explain(backend: Any, kind: Any, nbytes: int, placement: Any) -> dict[str, Any]:
    """The algorithm and protocol an NCCL-style backend would pick, when it can say."""
    inner = getattr(backend, "inner", backend)
    inner = getattr(inner, "inner", inner)  # through a calibration wrapper
    explain = getattr(inner, "explain_collective", None)
    if not callable(explain) or nbytes == 0 or placement.size == 1:
        return {}
    return dict(explain(kind, nbytes, placement))


for _name in COLLECTIVES:
    _collective(_name)


@hookimpl
def register_commands(cli: click.Group) -> None:
    cli.add_command(cost)
