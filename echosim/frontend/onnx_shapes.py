"""Make every ONNX shape concrete: infer, fold the shape arithmetic, infer again.

Exporters compute reshape targets at run time (``Shape -> Squeeze -> Concat ->
Reshape``), and ``onnx.shape_inference`` propagates such values only through a
few ops, so bound inputs can still leave symbolic shapes behind. Here the small
integer subgraphs that feed shapes are evaluated with numpy (``_EVAL``), their
results replace them as initializers, and inference runs again, until nothing
more folds. Weights are never read: only values with data in the file (or
computed from shapes) take part, and only small results are folded.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

MAX_FOLDED = 4096  # elements: shape vectors and small index tensors, never activations
MAX_ROUNDS = 8


def _attr(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _shapes(model: Any) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    g = model.graph
    for vi in [*g.input, *g.value_info, *g.output]:
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            out[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    for t in g.initializer:
        out[t.name] = tuple(t.dims)
    return out


def constant_value(node: Any) -> np.ndarray | None:
    import onnx.numpy_helper as nh

    for a in node.attribute:
        if a.name == "value":
            return nh.to_array(a.t)
        if a.name in ("value_int", "value_float"):
            return np.array(a.i if a.name == "value_int" else a.f)
        if a.name in ("value_ints", "value_floats"):
            return np.array(list(a.ints) if a.name == "value_ints" else list(a.floats))
    return None


def _axes(node: Any, vals: list[np.ndarray | None]) -> list[int] | None:
    if len(vals) > 1 and vals[1] is not None:
        return [int(a) for a in np.atleast_1d(vals[1])]
    got = _attr(node, "axes")
    return [int(a) for a in got] if got is not None else None


def _reshape(node: Any, v: list[Any]) -> np.ndarray:
    shape = [int(d) for d in v[1]]
    if not _attr(node, "allowzero", 0):
        shape = [v[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return v[0].reshape(shape)


def _slice(node: Any, v: list[Any]) -> np.ndarray:
    data, starts, ends = v[0], v[1], v[2]
    axes = list(v[3]) if len(v) > 3 and v[3] is not None else list(range(len(starts)))
    steps = list(v[4]) if len(v) > 4 and v[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=False):
        index[int(a)] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return a / b


def _cast(node: Any, v: list[Any]) -> np.ndarray:
    import onnx

    return v[0].astype(onnx.helper.tensor_dtype_to_np_dtype(int(_attr(node, "to", 7))))


def _squeeze(node: Any, v: list[Any]) -> np.ndarray:
    axes = _axes(node, v)
    return np.squeeze(v[0], axis=tuple(axes)) if axes else np.squeeze(v[0])


def _unsqueeze(node: Any, v: list[Any]) -> np.ndarray:
    out = v[0]
    for a in sorted(a % (out.ndim + len(_axes(node, v) or [])) for a in (_axes(node, v) or [])):
        out = np.expand_dims(out, a)
    return out


def _constant_of_shape(node: Any, v: list[Any]) -> np.ndarray:
    import onnx.numpy_helper as nh

    value = _attr(node, "value")
    fill = nh.to_array(value) if value is not None else np.array([0.0], dtype=np.float32)
    return np.full([int(d) for d in v[0]], fill.reshape(-1)[0], dtype=fill.dtype)


_EVAL: dict[str, Callable[[Any, list[Any]], np.ndarray]] = {
    "Identity": lambda n, v: v[0],
    "Cast": _cast,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Reshape": _reshape,
    "Concat": lambda n, v: np.concatenate([np.atleast_1d(x) for x in v], axis=int(_attr(n, "axis", 0))),
    "Gather": lambda n, v: np.take(v[0], v[1], axis=int(_attr(n, "axis", 0))),
    "Slice": _slice,
    "Add": lambda n, v: v[0] + v[1],
    "Sub": lambda n, v: v[0] - v[1],
    "Mul": lambda n, v: v[0] * v[1],
    "Div": lambda n, v: _div(v[0], v[1]),
    "Mod": lambda n, v: np.mod(v[0], v[1]),
    "Neg": lambda n, v: -v[0],
    "Abs": lambda n, v: np.abs(v[0]),
    "Max": lambda n, v: np.maximum.reduce(v),
    "Min": lambda n, v: np.minimum.reduce(v),
    "Equal": lambda n, v: np.equal(v[0], v[1]),
    "Less": lambda n, v: np.less(v[0], v[1]),
    "Greater": lambda n, v: np.greater(v[0], v[1]),
    "Not": lambda n, v: np.logical_not(v[0]),
    "And": lambda n, v: np.logical_and(v[0], v[1]),
    "Or": lambda n, v: np.logical_or(v[0], v[1]),
    "Where": lambda n, v: np.where(v[0], v[1], v[2]),
    "Range": lambda n, v: np.arange(v[0], v[1], v[2]),
    "ConstantOfShape": _constant_of_shape,
    "Expand": lambda n, v: v[0] * np.ones([int(d) for d in v[1]], dtype=v[0].dtype),
    "Transpose": lambda n, v: np.transpose(v[0], _attr(n, "perm")),
}


#: A Range that onnx.shape_inference's data propagation would spell out element by element.
MAX_RANGE = 2**24


class FoldLimitError(ValueError):
    """A constant or range whose size is over the limit; raised before anything is allocated."""


def _elements(shape: Any) -> int:
    dims = [int(d) for d in np.atleast_1d(shape)]
    return 0 if any(d < 0 for d in dims) else math.prod(dims)


def _range_count(v: list[Any]) -> int:
    start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in v[:3])
    if delta == 0 or not all(math.isfinite(x) for x in (start, limit, delta)):
        return 0
    return max(0, math.ceil((limit - start) / delta))


def _predicted_size(node: Any, v: list[Any]) -> int:
    """Elements ``node`` would produce from constant inputs ``v``, computed without building them."""
    op = node.op_type
    if op == "Range":
        return _range_count(v)
    if op == "ConstantOfShape":
        return _elements(v[0])
    if op == "Expand":
        return _elements(np.broadcast_shapes(np.shape(v[0]), tuple(int(d) for d in np.atleast_1d(v[1]))))
    if op == "Gather":
        axis = int(_attr(node, "axis", 0)) % max(1, np.ndim(v[0]))
        per_index = _elements(np.shape(v[0])) // max(1, np.shape(v[0])[axis] if np.ndim(v[0]) else 1)
        return per_index * _elements(np.shape(v[1]))
    arrays = [x for x in v if x is not None]
    if not arrays:
        return 0
    try:
        return _elements(np.broadcast_shapes(*(np.shape(x) for x in arrays)))
    except ValueError:
        return max(_elements(np.shape(x)) for x in arrays)


def check_ranges(model: Any) -> None:
    """Refuse a Range whose constant bounds make it longer than :data:`MAX_RANGE` before shape inference.

    onnx.shape_inference with data propagation materialises a Range's values (a 445-byte file
    allocated gigabytes); its bounds are known here when they are initializers or Constants.
    """
    import onnx.numpy_helper as nh

    g = model.graph
    known: dict[str, Any] = {}
    for t in g.initializer:
        if _elements(t.dims) <= MAX_FOLDED and t.data_location != 1:
            known[t.name] = nh.to_array(t)
    for node in g.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            value = constant_value(node)
            if value is not None and np.size(value) <= MAX_FOLDED:
                known[node.output[0]] = value
        elif node.op_type == "Range" and len(node.input) >= 3 and all(i in known for i in node.input[:3]):
            try:
                count = _range_count([known[i] for i in node.input[:3]])
            except (ValueError, TypeError, IndexError):
                continue
            if count > MAX_RANGE:
                raise FoldLimitError(
                    f"Range node {node.name or node.output[0]!r} spans {count} elements, over the limit of "
                    f"{MAX_RANGE} (2^24)"
                )


def _fold_once(model: Any) -> int:
    """Replace small values computable from constants and shapes by initializers; returns how many."""
    import onnx
    import onnx.numpy_helper as nh

    g = model.graph
    shapes = _shapes(model)
    known: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and np.prod(t.dims, dtype=np.int64) <= MAX_FOLDED:
            known[t.name] = nh.to_array(t)
    folded: dict[str, np.ndarray] = {}
    for node in g.node:
        out: np.ndarray | None = None
        try:
            if node.op_type == "Constant":
                out = constant_value(node)
            elif node.op_type in ("Shape", "Size") and node.input[0] in shapes:
                shape = np.array(shapes[node.input[0]], dtype=np.int64)
                if node.op_type == "Size":
                    out = np.array(int(np.prod(shape)), dtype=np.int64)
                else:
                    out = shape[_attr(node, "start", 0) : _attr(node, "end", None)]
            elif node.op_type in _EVAL and all((not i) or i in known for i in node.input):
                values = [known.get(i) if i else None for i in node.input]
                if _predicted_size(node, values) > MAX_FOLDED:  # sized before anything is allocated
                    continue
                out = _EVAL[node.op_type](node, values)
        except (ValueError, TypeError, IndexError, OverflowError):
            out = None
        if out is None or len(node.output) != 1 or np.size(out) > MAX_FOLDED:
            continue
        out = np.asarray(out)
        known[node.output[0]] = out
        if node.op_type != "Constant":
            folded[node.output[0]] = out
    if not folded:
        return 0
    keep = [n for n in g.node if not (len(n.output) == 1 and n.output[0] in folded)]
    del g.node[:]
    g.node.extend(keep)
    for name, value in folded.items():
        g.initializer.append(nh.from_array(value, name))
    return len(folded)


def infer_concrete(model: Any) -> Any:
    """Shape-infer ``model`` (inputs already bound), folding shape arithmetic until shapes settle."""
    import onnx

    for _ in range(MAX_ROUNDS):
        check_ranges(model)
        _forget_inferred(model)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
        if not _fold_once(model):
            break
    return model


def _forget_inferred(model: Any) -> None:
    """Drop recorded shapes of computed values (they may hold symbols); keep those of shape-only weights."""
    g = model.graph
    produced = {o for n in g.node for o in n.output}
    kept = [v for v in g.value_info if v.name not in produced]
    del g.value_info[:]
    g.value_info.extend(kept)
    for value in g.output:
        value.type.tensor_type.ClearField("shape")
