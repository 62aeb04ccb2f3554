"""The IR itself: types, verification, printing, repeat counts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from echosim.ir import DType, Graph, OpKind, Phase, TensorSpec, VerifyError, print_graph, verify
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, ParamAttrs


def small_graph() -> Graph:
    g = Graph("g", repeats={"layers.0": 3})
    x = g.add(OpKind.INPUT, (), TensorSpec((2, 4), DType.BF16), name="x")
    g.inputs.append(x)
    w = g.add(OpKind.PARAMETER, (), TensorSpec((8, 4), DType.BF16), ParamAttrs(), scope="layers.0.fc", name="w")
    y = g.add(OpKind.MATMUL, (x, w), TensorSpec((2, 8), DType.BF16), MatmulAttrs(2, 8, 4), scope="layers.0.fc")
    g.outputs = [y]
    return g


def test_dtype_parse_accepts_torch_spellings() -> None:
    assert DType.parse("torch.bfloat16") is DType.BF16
    assert DType.parse("half") is DType.FP16
    with pytest.raises(ValueError, match="unknown dtype 'int3'"):
        DType.parse("int3")


def test_ir_enums_hash_by_identity_and_survive_pickling() -> None:
    """The IR's enums hash as they compare (by identity), so keys of them work in dicts, sets and across pickling."""
    import pickle

    from echosim.ir.ops import Axis, Role

    for member in (OpKind.MATMUL, Phase.BACKWARD, Axis.FSDP, Role.GRAD_SYNC, DType.BF16):
        assert hash(member) == object.__hash__(member)
        assert pickle.loads(pickle.dumps(member)) is member
        assert {member: 1}[type(member)(member.value)] == 1
    assert OpKind.ALL_GATHER.is_collective and not OpKind.MATMUL.is_collective


def test_tensor_spec_bytes() -> None:
    spec = TensorSpec((2, 3, 4), DType.FP16)
    assert spec.numel == 24 and spec.nbytes == 48
    assert str(spec) == "fp16[2x3x4]"


def test_multiplicity_follows_repeat_prefix() -> None:
    g = small_graph()
    assert [g.multiplicity(n) for n in g] == [1, 3, 3]


def test_param_count_counts_each_repeat() -> None:
    assert small_graph().param_count() == 3 * 8 * 4


def test_printer_is_stable() -> None:
    assert print_graph(small_graph()) == (
        "graph g\n"
        "  repeat layers.0 x3\n"
        "  %0 = input() : bf16[2x4]  [fwd] - (x)\n"
        "  %1 = parameter() : bf16[8x4]  [fwd] layers.0.fc (w)\n"
        "  %2 = matmul(%0, %1) : bf16[2x8] {m=2 n=8 k=4}  [fwd] layers.0.fc\n"
        "  return %2\n"
    )


def test_verify_catches_wrong_attrs_and_names_the_pass() -> None:
    g = small_graph()
    g.replace(2, attrs=ElementwiseAttrs("add"))
    with pytest.raises(VerifyError, match="matmul cannot carry ElementwiseAttrs after pass 'broken'"):
        verify(g, after="broken")


def test_verify_catches_use_before_definition() -> None:
    g = small_graph()
    g.nodes = {k: g.nodes[k] for k in (2, 0, 1)}
    with pytest.raises(VerifyError, match="before it is defined"):
        verify(g)


def test_verify_catches_bad_output() -> None:
    g = small_graph()
    g.outputs = [99]
    with pytest.raises(VerifyError, match="output %99"):
        verify(g)


def test_graph_copy_is_independent() -> None:
    g = small_graph()
    h = g.copy()
    h.add(OpKind.ELEMENTWISE, (2,), TensorSpec((2, 8), DType.BF16), ElementwiseAttrs("gelu"), phase=Phase.FORWARD)
    assert len(g) == 3 and len(h) == 4
    assert g.dag.number_of_nodes() == 3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text("ab.0", max_size=4), min_size=1, max_size=3, unique=True), st.text("ab.0", max_size=7))
def test_block_of_is_the_prefix_or_its_dotted_child(prefixes: list[str], scope: str) -> None:
    """:meth:`Graph.block_of` (compares without building ``prefix + "."``) is the first repeated prefix that
    is the scope or a dotted parent of it."""
    g = Graph("g", dict.fromkeys(prefixes, 2))
    node = g[g.add(OpKind.INPUT, (), TensorSpec((1,), DType.FP32), scope=scope)]
    expected = next((p for p in prefixes if scope == p or scope.startswith(p + ".")), None)
    assert g.block_of(node) == expected


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add-param", "add-op", "to-param", "to-op", "copy", "reorder", "ask"]),
                          st.integers(0, 50)), max_size=30))  # fmt: skip
def test_params_kept_across_adds_replaces_and_copies_equal_a_fresh_scan(steps: list[tuple[str, int]]) -> None:
    """Graph.params is kept once asked for (adds append to it, copies share it, a replace or a new node table
    forgets it); it must equal a scan of the node table after any sequence of edits, and a copy's edits must not
    reach the original."""
    g = small_graph()
    graphs = [g]
    spec = TensorSpec((4,), DType.BF16)
    for what, k in steps:
        g = graphs[k % len(graphs)]
        nid = list(g.nodes)[k % len(g.nodes)]
        if what == "add-param":
            g.add(OpKind.PARAMETER, (), spec, ParamAttrs(), scope="layers.0.fc", name=f"p{k}")
        elif what == "add-op":
            g.add(OpKind.ELEMENTWISE, (nid,), spec, ElementwiseAttrs("relu"), name=f"e{k}")
        elif what == "to-param":
            g.replace(nid, op=OpKind.PARAMETER, inputs=(), attrs=ParamAttrs())
        elif what == "to-op":
            g.replace(nid, op=OpKind.VIEW)
        elif what == "copy":
            graphs.append(g.copy())
        elif what == "reorder":
            g.nodes = dict(reversed(list(g.nodes.items())))
        else:
            g.params()
        for h in graphs:
            scan = [n for n in h.nodes.values() if n.op is OpKind.PARAMETER]
            assert h.params() == scan and [n is m for n, m in zip(h.params(), scan, strict=True)] == [True] * len(scan)
            assert h.param_count() == sum(n.out.numel * h.multiplicity(n) for n in scan)


def _old_stamp(g: Graph) -> tuple[object, ...]:
    return (len(g.nodes), g._next, tuple(g.repeats.items()), len(g.inputs), len(g.outputs), len(g.grads),
            tuple(g.block_layers.items()))  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["repeats", "reorder", "same", "layers", "input", "output", "grad", "add",
                                           "replace", "ask"]), st.integers(1, 3)), max_size=25))  # fmt: skip
def test_derived_is_computed_again_exactly_when_the_graph_changes(steps: list[tuple[str, int]]) -> None:
    """Graph.derived keeps a value until a node is added or replaced or the repeats (their order too), block layers,
    inputs, outputs or gradients change: it is computed again exactly when a stamp of all of those differs."""
    g = small_graph()
    g.repeats = {"layers.0": 3, "layers.1": 2}
    calls = [0]

    def compute() -> int:
        calls[0] += 1
        return calls[0]

    g.derived("k", compute)
    last = _old_stamp(g)
    for what, k in steps:
        if what == "repeats":
            g.repeats["layers.0"] = k
        elif what == "reorder":
            g.repeats = dict(reversed(list(g.repeats.items())))
        elif what == "same":
            g.repeats = dict(g.repeats)
        elif what == "layers":
            g.block_layers = {"layers.0": k + 1, "layers.1": 2} if k > 1 else {}
        elif what == "input":
            g.inputs.append(0)
        elif what == "output":
            g.outputs = g.outputs[:1] * k
        elif what == "grad":
            g.grads[k] = 0
        elif what == "add":
            g.add(OpKind.ELEMENTWISE, (0,), TensorSpec((2, 4), DType.BF16), ElementwiseAttrs("relu"))
        elif what == "replace":
            g.replace(0, name=f"x{k}")
        before = calls[0]
        got = g.derived("k", compute)
        assert got == calls[0] and (calls[0] > before) == (_old_stamp(g) != last or what == "replace")
        last = _old_stamp(g)
