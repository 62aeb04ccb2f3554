"""Model -> IR. A MODEL string is a registered name (the zoo) or a source a frontend loads.

Resolution order: a registered model name; then a registered frontend by scheme
(``hf:``) or file suffix (``.onnx``, and ``.py`` for ``path.py:factory``). A
loader returns something :func:`capture_object` can capture for a plan:

* an object with ``capture(plan) -> (graph, warnings, params)`` (what echosim's own
  ``hf:``, ``.onnx`` and ``.py`` loaders return),
* an ``nn.Module`` (captured with torch.export, falling back to torch.fx),
* an :class:`~echosim.frontend.zoo.ArchConfig`, or an IR ``Graph``.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError

if TYPE_CHECKING:
    from echosim.ir.graph import Graph
    from echosim.plan import Plan

# "path/to/file.py:factory" (the factory may be dotted: "module_attr.build")
PY_SOURCE = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_][\w.]*)$")


class Note(str):
    """A frontend message that informs rather than warns; the report lists it under ``notes``."""

    __slots__ = ()


def split_notes(messages: list[str]) -> tuple[list[str], list[str]]:
    """(warnings, notes) from a frontend's messages."""
    return [m for m in messages if not isinstance(m, Note)], [str(m) for m in messages if isinstance(m, Note)]


def capture_named(model: str, plan: Plan) -> tuple[Graph, list[str], int]:
    """Capture a registered model or a frontend source for one micro-batch: (graph, messages, total params)."""
    from echosim.plugins import get_registry

    registry = get_registry()
    if model in registry.models:
        return capture_object(registry.model(model)(), plan, model)
    loader = _frontend_for(model, registry)
    try:
        return capture_object(loader(model), plan, model)
    except EchosimError:
        raise
    except Exception as exc:  # a model no rule foresaw must still end in one line, not a traceback
        message = " ".join(str(exc).split())[:300]
        raise EchosimError(f"{model}: could not be converted ({type(exc).__name__}: {message})") from None


def _frontend_for(model: str, registry: Any) -> Any:
    from echosim.errors import PluginError

    match = PY_SOURCE.match(model)
    key = match.group("path") if match else model
    try:
        return registry.frontend(key)
    except PluginError:
        frontends = ", ".join(sorted(registry.frontends)) or "none"
        raise EchosimError(
            f"unknown model {model!r}: not a registered name (see `echosim models`) and no frontend "
            f"({frontends}) takes it; use NAME, path.py:factory, hf:config.json or model.onnx"
        ) from None


def capture_object(obj: Any, plan: Plan, name: str) -> tuple[Graph, list[str], int]:
    from echosim.frontend.zoo import ArchConfig
    from echosim.ir.graph import Graph

    capture = getattr(obj, "capture", None)
    if callable(capture) and not isinstance(obj, type):
        return capture(plan)
    if isinstance(obj, Graph):
        from echosim.passes.flops import param_count

        return obj, [], param_count(obj)
    if isinstance(obj, ArchConfig):
        return _capture_arch(obj, plan, name)
    import torch

    if isinstance(obj, torch.nn.Module):
        from echosim.frontend.pyfile import capture_module_for_plan

        return capture_module_for_plan(obj, None, plan, name)
    raise EchosimError(f"model {name!r}: got {type(obj).__name__}, not an ArchConfig, nn.Module or IR graph")


def _capture_arch(cfg: Any, plan: Plan, name: str) -> tuple[Graph, list[str], int]:
    cfg = cfg.with_(seq_len=plan.seq_len or cfg.seq_len)
    _check_arch(cfg, plan)
    graph, warnings, params = _capture_arch_cached(cfg, plan.micro_batch, plan.dtype, name)
    return graph, list(warnings), params


@functools.lru_cache(maxsize=16)
def _capture_arch_cached(cfg: Any, micro_batch: int, dtype_name: str, name: str) -> tuple[Graph, tuple[str, ...], int]:
    """One capture per (architecture, micro-batch, dtype): ``search`` compiles many layouts of one model.

    Passes never modify the graph they are given (they copy), so sharing it is safe.
    """
    import torch

    from echosim.frontend.fx import CaptureError, capture_module
    from echosim.frontend.zoo import build_module
    from echosim.ir.types import DType
    from echosim.passes.flops import param_count

    # Two layers are enough for the fold to prove the block repeats; the count is known.
    module = build_module(cfg.with_(layers=min(cfg.layers, 2)))
    ids = torch.zeros(micro_batch, cfg.seq_len, dtype=torch.long, device="meta")
    try:
        dtype = DType.BF16 if dtype_name == "fp8" else DType.parse(dtype_name)  # fp8: 16-bit activations
        cap = capture_module(module, (ids, ids), dtype=dtype, name=name)
    except CaptureError as exc:
        raise EchosimError(str(exc)) from None
    if cfg.layers > 2:
        (block,) = cap.graph.repeats
        cap.graph.repeats[block] = cfg.layers
    return cap.graph, tuple(cap.warnings), param_count(cap.graph)


def _check_arch(cfg: Any, plan: Plan) -> None:
    """Layout constraints that need the architecture, named as users think of them."""
    from echosim.plan import PlanError

    if cfg.arch == "moe" and not (getattr(cfg, "experts", 0) >= 1 and getattr(cfg, "top_k", 0) >= 1):
        raise EchosimError(f"a moe model needs routed experts and top_k >= 1 (got {cfg.experts} and {cfg.top_k})")
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


def plan_messages(graph: Graph, plan: Plan) -> list[str]:
    """What the tensor-parallel plan makes of this model, for the report.

    A model none of whose module paths the plan matches runs data parallel only (a
    note; with ``--tp`` above 1 an error). Expert weights (3-D, one slice per expert)
    have no tensor-parallel rule: with ``--tp`` above 1 every rank computes every expert.
    """
    from echosim.ir.ops import MatmulAttrs, OpKind
    from echosim.passes.tensor_parallel import DEFAULT_TP_PLAN, style_for
    from echosim.plan import PlanError

    targets = [n for n in graph if n.op in (OpKind.MATMUL, OpKind.EMBEDDING) and style_for(n.scope, DEFAULT_TP_PLAN)]
    if not targets:
        if plan.tp > 1:
            raise PlanError(
                f"tp={plan.tp}: no module path of {graph.name!r} matches the tensor-parallel plan "
                "(*.q_proj, *.o_proj, *.gate_proj, *.down_proj, embed_tokens, lm_head, ...): use --tp 1"
            )
        return [Note("no tensor-parallel plan matches this model's module paths: it runs data parallel only")]
    experts = {
        n.scope
        for n in graph
        if isinstance(n.attrs, MatmulAttrs) and n.attrs.batch > 1 and len(n.inputs) > 1
        and graph[n.inputs[1]].op is OpKind.PARAMETER and len(graph[n.inputs[1]].out.shape) == 3
        and not style_for(n.scope, DEFAULT_TP_PLAN)
    }  # fmt: skip
    if experts and plan.tp > 1:
        return [
            f"experts ({', '.join(sorted(experts)[:2])}{', ...' if len(experts) > 2 else ''}) are replicated on all "
            f"{plan.tp} tensor-parallel ranks: tensor and expert parallelism split only the zoo's MoE models"
        ]
    return []
