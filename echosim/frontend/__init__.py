"""Model -> IR. Zoo names resolve through the plugin registry; capture is torch.fx on meta."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError

if TYPE_CHECKING:
    from echosim.ir.graph import Graph
    from echosim.plan import Plan


def capture_named(model: str, plan: Plan) -> tuple[Graph, list[str], int]:
    """Capture a registered model for one micro-batch; returns (graph, warnings, total params)."""
    from echosim.plugins import get_registry

    factory = get_registry().model(model)
    return capture_object(factory(), plan, model)


def capture_object(obj: Any, plan: Plan, name: str) -> tuple[Graph, list[str], int]:
    import torch

    from echosim.frontend.fx import CaptureError, capture_module
    from echosim.frontend.zoo import ArchConfig, build_module
    from echosim.ir.types import DType
    from echosim.passes.flops import param_count

    layers = 0
    if isinstance(obj, ArchConfig):
        cfg = obj.with_(seq_len=plan.seq_len or obj.seq_len)
        _check_arch(cfg, plan)
        # Two layers are enough for the fold to prove the block repeats; the count is known.
        layers = cfg.layers
        module = build_module(cfg.with_(layers=min(cfg.layers, 2)))
        seq = cfg.seq_len
    elif isinstance(obj, torch.nn.Module):
        module, seq = obj, plan.seq_len or 2048
    else:
        raise EchosimError(f"model {name!r}: factory returned {type(obj).__name__}, not an ArchConfig or nn.Module")
    ids = torch.zeros(plan.micro_batch, seq, dtype=torch.long, device="meta")
    try:
        dtype = DType.BF16 if plan.dtype == "fp8" else DType.parse(plan.dtype)  # fp8: 16-bit activations
        cap = capture_module(module, (ids, ids), dtype=dtype, name=name)
    except CaptureError as exc:
        raise EchosimError(str(exc)) from None
    if layers > 2:
        (block,) = cap.graph.repeats
        cap.graph.repeats[block] = layers
    return cap.graph, cap.warnings, param_count(cap.graph)


def _check_arch(cfg: Any, plan: Plan) -> None:
    """Layout constraints that need the architecture, named as users think of them."""
    from echosim.plan import PlanError

    if cfg.heads % plan.tp:
        raise PlanError(f"tp={plan.tp} does not divide attention heads ({cfg.heads})")
    if cfg.n_kv_heads % plan.tp:
        raise PlanError(f"tp={plan.tp} does not divide key/value heads ({cfg.n_kv_heads})")
    if plan.pp > cfg.layers:
        raise PlanError(f"pp={plan.pp} exceeds the number of layers ({cfg.layers})")
    if plan.pp * plan.vpp > cfg.layers:
        raise PlanError(f"pp*vpp={plan.pp * plan.vpp} exceeds the number of layers ({cfg.layers})")
    _check_sequence_and_experts(cfg, plan)


def _check_sequence_and_experts(cfg: Any, plan: Plan) -> None:
    """Context, sequence and expert parallel rules ("cp=3 does not divide seq_len 8192")."""
    from echosim.passes.base import LayoutError
    from echosim.passes.context_parallel import check_sequence
    from echosim.plan import PlanError

    seq = cfg.seq_len
    if plan.cp > 1:
        try:
            check_sequence(plan.cp, seq, plan.cp_balance)
        except LayoutError as exc:
            raise PlanError(str(exc)) from None
    if plan.sp and (seq // plan.cp) % plan.tp:
        raise PlanError(f"sequence parallelism: tp={plan.tp} does not divide the {seq // plan.cp} tokens per rank")
    experts = getattr(cfg, "experts", 0)
    if plan.ep > 1 and not experts:
        raise PlanError(f"ep={plan.ep} needs a mixture-of-experts model ({cfg.arch} has no routed experts)")
    if experts and experts % plan.ep:
        raise PlanError(f"ep={plan.ep} does not divide experts {experts}")
