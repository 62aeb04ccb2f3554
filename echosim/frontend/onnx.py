"""``.onnx`` sources: loaded with ``onnx``, shapes from ``onnx.shape_inference``, weights never read.

Weights may be absent: initializers whose external data file is missing, or
weights declared only by their shape, are read for their shapes alone. Symbolic
input dimensions are bound from ``--micro-batch`` (a dimension named like a
batch, or the first axis) and ``--seq-len`` (a dimension named like a sequence,
or the second axis of integer token ids); any other symbolic dimension is an
error that names it.

Ops map to IR through ``onnx_rules.RULES`` (MatMul, Gemm, Conv, Attention, the
normalisations, Softmax, Gelu, Einsum, LSTM, GRU, RNN, Gather as embedding, the
elementwise ops, Reshape/Transpose/Slice/... as views). An op with no rule is
costed as a memory-bound elementwise op and listed in the warnings. Scopes come
from the torch exporter's ``pkg.torch.onnx.name_scopes`` metadata, else from
``/model/layers.0/attn/MatMul``-style node names, so TP plan patterns apply.
Layers stored N times in the file are folded back to one by :func:`irfold.fold_layers`
(the chain proof every frontend's folding uses, see ``fold.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.errors import EchosimError
from echosim.frontend.fused import FusedKind
from echosim.frontend.irfold import layer_of
from echosim.frontend.onnx_rules import RULES, SHAPE_OPS
from echosim.frontend.onnx_values import INT32, INT64, OnnxValues, fused_module, scope_of
from echosim.ir.graph import Graph
from echosim.ir.ops import OpKind
from echosim.ir.types import DType

if TYPE_CHECKING:
    from echosim.frontend.spec import CaptureSpec

_BATCH_NAME = re.compile(r"batch|^(b|n|bs|bsz)$|^(b|n|bs|bsz)[_\d]", re.IGNORECASE)
_SEQ_NAME = re.compile(r"seq|sequence|len|token|time|step|^(s|t|l)$|position", re.IGNORECASE)


@dataclass
class OnnxModel:
    """An ONNX file, checked at load, captured once the spec binds its symbolic dimensions."""

    source: str
    path: Path
    proto: Any

    def capture(self, spec: CaptureSpec) -> tuple[Graph, list[str], int]:
        from echosim.frontend.attention_fuse import fuse_attention
        from echosim.frontend.irfold import fold_layers
        from echosim.frontend.loss import ensure_loss
        from echosim.frontend.messages import Note

        inferred, notes, samples = bind_and_infer(self.proto, self.path, spec)
        conv = _Onnx(inferred, DType.parse(spec.dtype), self.path.name, self.path)
        graph = fold_layers(fuse_attention(_scope_initializers(conv.run()), notes), notes)
        messages = list(conv.warnings)
        try:
            ensure_loss(graph, notes)
        except ValueError as exc:
            raise EchosimError(f"{self.path}: {exc}") from None
        graph.samples = samples
        return graph, [*messages, *(Note(n) for n in notes)], graph.param_count()


def load(source: str) -> OnnxModel:
    """The ``.onnx`` frontend loader: parse the file (no external data) and check it is a model."""
    import onnx
    from google.protobuf.message import DecodeError

    path = Path(source).expanduser()
    if not path.is_file():
        raise EchosimError(f"{source}: no such file")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise EchosimError(f"{path} is not a valid ONNX model (truncated or another format?): {exc}") from None
    if not proto.HasField("graph") or not proto.graph.node:
        raise EchosimError(f"{path} is not an ONNX model with a graph (empty or another format?)")
    _check_order(proto.graph, path)
    return OnnxModel(source, path, proto)


def _check_order(graph: Any, path: Path) -> None:
    """Every node reads values defined before it (ONNX requires topological order): a cycle or an
    undefined input is refused by name instead of compiling a graph that cannot run."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer} | {""}
    defined |= {t.name for t in getattr(graph, "sparse_initializer", ())}
    produced = {o for n in graph.node for o in n.output}
    for node in graph.node:
        for name in node.input:
            if name not in defined:
                why = (
                    "is produced only by a later node (a cycle, or nodes out of order)"
                    if name in produced
                    else ("is defined nowhere (not an input, initializer or node output)")
                )
                raise EchosimError(f"{path}: node {node.name or node.op_type!r} reads {name!r}, which {why}")
        defined.update(node.output)


# ---- binding symbolic dimensions ------------------------------------------------------------


def _dims(value_info: Any) -> list[Any]:
    t = value_info.type.tensor_type
    return list(t.shape.dim) if t.HasField("shape") else []


def bind_and_infer(proto: Any, path: Path, spec: CaptureSpec) -> tuple[Any, list[str], int]:
    """A copy of ``proto`` with symbolic input dims set from the spec, and every shape inferred; and the batch the
    file fixes where no input leaves it to ``--micro-batch`` (0: the micro-batch binds it)."""
    from echosim.frontend.onnx_shapes import infer_concrete

    model = type(proto)()
    model.CopyFrom(proto)
    init_names = {t.name for t in model.graph.initializer}
    notes: list[str] = []
    fixed_batch: int | None = None
    fixed_seq: int | None = None
    bound_batch = False
    for value in model.graph.input:
        if value.name in init_names:
            continue
        elem = value.type.tensor_type.elem_type
        # a time-major input (sequence first, an RNN's) names its batch on a later axis: axis 0 is not the batch
        named = [d.dim_param for d in _dims(value)[1:] if d.HasField("dim_param")]
        time_major = any(_BATCH_NAME.search(name) for name in named)
        for axis, dim in enumerate(_dims(value)):
            if dim.HasField("dim_value") and dim.dim_value <= 0:
                raise EchosimError(
                    f"{path}: input {value.name!r} has dimension {dim.dim_value} (axis {axis}); "
                    "sizes must be positive (leave a dimension symbolic to bind it)"
                )
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if axis == 0 and time_major:
                    fixed_seq = dim.dim_value
                elif axis == 0:
                    fixed_batch = dim.dim_value
                elif axis == 1 and elem in (INT64, INT32):
                    fixed_seq = dim.dim_value
                continue
            name = dim.dim_param if dim.HasField("dim_param") else ""
            role = _role(name, axis, elem)
            if role is None:
                raise EchosimError(
                    f"{path}: input {value.name!r} has symbolic dimension {name or '?'!r} (axis {axis}) "
                    "that --micro-batch and --seq-len do not bind"
                )
            if role == "seq" and not spec.seq_len:
                raise EchosimError(
                    f"{path}: input {value.name!r} has a symbolic sequence dimension {name or '?'!r}: "
                    "bind it with --seq-len"
                )
            dim.Clear()
            dim.dim_value = spec.micro_batch if role == "batch" else spec.seq_len
            bound_batch = bound_batch or role == "batch"
    if spec.seq_len and fixed_seq not in (None, spec.seq_len):
        notes.append(f"--seq-len {spec.seq_len} does not apply: {path.name} fixes the sequence at {fixed_seq}")
    samples = fixed_batch if fixed_batch is not None and not bound_batch else 0
    if spec.micro_batch != 1 and samples not in (0, spec.micro_batch):
        notes.append(f"--micro-batch {spec.micro_batch} does not apply: {path.name} fixes the batch at {samples}")
    try:
        inferred = infer_concrete(model)
    except Exception as exc:
        raise EchosimError(f"{path}: ONNX shape inference failed: {' '.join(str(exc).split())[:300]}") from None
    return inferred, notes, samples


def _scope_initializers(graph: Graph) -> Graph:
    """Initializers in the layer that reads them, for the fold's proof.

    torch's exporter stores a linear's weight transposed under a new name (``val_105``) that carries no module
    path: it takes its one reader's. And it stores identical initializers once (every RMSNorm weight of a freshly
    built model is ones), named for the first layer: one read from several layers belongs to none of them."""
    for n in list(graph):
        if n.op is not OpKind.PARAMETER:
            continue
        readers = {graph[u].scope for u in graph.users(n.id)}
        if not n.scope and len(readers) == 1:
            graph.replace(n.id, scope=next(iter(readers)))
        elif len({layer_of(r) for r in readers}) > 1:
            graph.replace(n.id, scope="")
    return graph


def _strip_wrapper(graph: Graph) -> Graph:
    """Drop a wrapper module's name (``m.`` in ``m.model.layers.0``) when every scope starts with it."""
    scopes = {n.scope for n in graph if n.scope}
    heads = {s.split(".", 1)[0] for s in scopes}
    if len(heads) != 1 or not scopes:
        return graph
    (head,) = heads
    rests = [s[len(head) + 1 :] for s in scopes if s != head]
    if not rests or any(r[:1].isdigit() for r in rests):
        return graph
    for n in list(graph):
        if n.scope:
            scope = "" if n.scope == head else n.scope[len(head) + 1 :]
            name = n.name[len(head) + 1 :] if n.op is OpKind.PARAMETER and n.name.startswith(head + ".") else n.name
            graph.replace(n.id, scope=scope, name=name)
    return graph


def _role(name: str, axis: int, elem: int) -> str | None:
    if name and _BATCH_NAME.search(name):
        return "batch"
    if name and _SEQ_NAME.search(name):
        return "seq"
    if axis == 0:
        return "batch"
    if axis == 1 and elem in (INT64, INT32):
        return "seq"
    return None


# ---- conversion ---------------------------------------------------------------------------------


class _Onnx(OnnxValues):
    """The main loop: walk the graph in order, fuse single-kernel modules, dispatch each op to its rule."""

    # -- main loop ---------------------------------------------------------------------------
    def run(self) -> Graph:
        g = self.proto.graph
        for t in g.initializer:
            if t.name not in self.params:
                self.static.add(t.name)
        for v in g.input:
            if v.name in self.inits or v.name in self.params:
                continue
            self.env[v.name] = self.graph.add(OpKind.INPUT, (), self.spec(v.name), name=v.name)
            self.graph.inputs.append(self.env[v.name])
        live = self._live()
        compute = []
        for node in g.node:  # shape arithmetic and constants are static: never costed
            if not any(o in live for o in node.output):
                continue
            if (
                node.op_type == "Constant"
                or node.op_type in SHAPE_OPS
                or (node.input and all((not i) or i in self.static for i in node.input))
            ):
                self.static.update(node.output)
            else:
                compute.append(node)
        fused = self._plan_fusion(compute, live)
        for node in compute:
            if node.output and node.output[0] in self.aliases:
                self.env[node.output[0]] = self.env[self.aliases[node.output[0]]]
                continue
            if id(node) in fused:
                self._emit_fused(node, fused[id(node)])
                continue
            rule = RULES.get(node.op_type)
            if rule is None:
                self.unknown_op(node)
            else:
                rule(self, node)
            first = self.env.get(node.output[0]) if node.output else None
            for extra in node.output[1:]:  # further outputs (TopK indices, LSTM states): views of the first
                if extra and extra not in self.env and first is not None:
                    self.env[extra] = self.graph.add(OpKind.VIEW, [first], self.spec(extra, node, like=first),
                                                     scope=scope_of(node), name=extra)  # fmt: skip
        self.graph.outputs = [v for v in (self.value(o.name) for o in g.output) if v is not None]
        for op, count in self._unknown.items():
            if count > 1:
                self.warnings.append(f"({op} occurs {count} times)")
        return _strip_wrapper(self.graph)

    # -- modules that run as one kernel (see fused.py) -------------------------------------------
    def _plan_fusion(self, compute: list[Any], live: set[str]) -> dict[int, tuple[str, FusedKind, list[str], str]]:
        """Each call of a single-kernel module: member node -> (module path, kind, inputs, output)."""
        groups: list[tuple[str, FusedKind, list[Any]]] = []
        for node in compute:
            hit = fused_module(node)
            if hit is None:
                continue
            if groups and groups[-1][0] == hit[0] and groups[-1][2][-1] is compute[compute.index(node) - 1]:
                groups[-1][2].append(node)
            else:
                groups.append((hit[0], hit[1], [node]))
        graph_outputs = {o.name for o in self.proto.graph.output}
        plan: dict[int, tuple[str, FusedKind, list[str], str]] = {}
        for path, kind, members in groups:
            made = {o for m in members for o in m.output}
            outs = [
                o for o in made if o in graph_outputs or any(
                    id(u) not in {id(m) for m in members} and any(o2 in live for o2 in u.output)
                    for u in self.consumers.get(o, [])
                )
            ]  # fmt: skip
            ins = [i for m in members for i in m.input if i and i not in made and i not in self.static]
            ins = list(dict.fromkeys(ins))
            if len(outs) != 1 or not [i for i in ins if i not in self.params]:
                continue
            for m in members:
                plan[id(m)] = (path, kind, ins, outs[0])
        return plan

    def _emit_fused(self, node: Any, fused: tuple[str, FusedKind, list[str], str]) -> None:
        path, kind, ins, out = fused
        if out not in node.output:
            return
        data = [i for i in ins if i not in self.params][: kind.data_inputs]
        params = [i for i in ins if i in self.params] if kind.op is OpKind.NORM else []
        values = [v for v in (self.value(i) for i in [*data, *params]) if v is not None]
        name = path.rsplit(".", 1)[-1] or out
        self.env[out] = self.graph.add(kind.op, values, self.spec(out, node), kind.attrs, scope=path, name=name)

    def _live(self) -> set[str]:
        live = {o.name for o in self.proto.graph.output}
        for node in reversed(list(self.proto.graph.node)):
            if any(o in live for o in node.output):
                live.update(i for i in node.input if i)
        return live
