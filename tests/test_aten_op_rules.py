"""Rules for the torch ops a hand-written model reaches for beyond the layers (broadcasting, stacking, reductions,
losses, vector products, FFTs), and what an op with no rule does to the graph.

Before these rules, ``F.mse_loss(out, target)`` (which exports as ``broadcast_tensors`` then ``mse_loss``) lost
the model's output: the tuple-valued op had no rule, its items no IR value, and compile stopped with "no
floating-point output to train on". An op that still has no rule is one memory-bound kernel whose items are views
of it, so the data keeps flowing to the loss.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from click.testing import CliRunner
from torch import nn

from echosim.cli import cli
from echosim.frontend.aten import capture_export
from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, MatmulAttrs, OpKind
from echosim.ir.types import DType

Fn = Callable[[torch.Tensor], torch.Tensor]

#: Each is applied to ``x @ w`` (8 x 16), so its output depends on the parameter.
OPS: dict[str, Fn] = {
    "broadcast_to": lambda x: torch.broadcast_to(x[:1], x.shape),
    "atleast_2d": lambda x: torch.atleast_2d(x),
    "meshgrid": lambda x: torch.meshgrid(x[0], x[1], indexing="ij")[1],
    "broadcast_tensors": lambda x: torch.broadcast_tensors(x[:1], x)[0],
    "hstack": lambda x: torch.hstack([x, x]),
    "vstack": lambda x: torch.vstack([x, x]),
    "tile": lambda x: x.tile(2, 1),
    "cumprod": lambda x: torch.cumprod(x, 0),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, 0),
    "cummax": lambda x: torch.cummax(x, 0)[0],
    "argsort": lambda x: x.gather(0, torch.argsort(x, 0)),
    "std": lambda x: torch.std(x, 0),
    "var_mean": lambda x: torch.var_mean(x, 0)[1],
    "prod": lambda x: torch.prod(x, 0),
    "median": lambda x: torch.median(x, 0).values,
    "trace": lambda x: torch.trace(x[:, :8]),
    "addcmul": lambda x: torch.addcmul(x, x, x),
    "lerp": lambda x: torch.lerp(x, x.flip(0), 0.5),
    "nan_to_num": lambda x: torch.nan_to_num(x),
    "scatter_reduce": lambda x: x.scatter_reduce(0, torch.zeros_like(x, dtype=torch.long), x, "amax"),
    "diag_embed": lambda x: torch.diag_embed(x[0]),
    "kron": lambda x: torch.kron(x[:2, :2], x[:2, :2]),
    "outer": lambda x: torch.outer(x[0], x[1]),
    "mv": lambda x: torch.mv(x, x[0]),
    "dot": lambda x: torch.dot(x[0], x[1]),
    "cdist": lambda x: torch.cdist(x, x),
    "rfft": lambda x: torch.fft.rfft(x, dim=1).abs(),
    "irfft": lambda x: torch.fft.irfft(x, n=30, dim=1),
    "fft2": lambda x: torch.fft.fft2(x).real,
    "grid_sample": lambda x: F.grid_sample(x[None, None], x[None, :4, :8].reshape(1, 4, 4, 2)),
    "im2col": lambda x: F.unfold(x[None, None], 2),
    "kl_div": lambda x: F.kl_div(x.log_softmax(1), x.softmax(1).detach(), reduction="batchmean"),
    "cosine_embedding_loss": lambda x: F.cosine_embedding_loss(x, x.flip(0), torch.ones(8)),
    "triplet_margin_loss": lambda x: F.triplet_margin_loss(x, x.flip(0), x.roll(1, 0)),
    "margin_ranking_loss": lambda x: F.margin_ranking_loss(x, x.flip(0), torch.ones_like(x)),
    "poisson_nll_loss": lambda x: F.poisson_nll_loss(x, x.detach()),
    "hinge_embedding_loss": lambda x: F.hinge_embedding_loss(x, torch.ones_like(x)),
}


class Apply(nn.Module):
    def __init__(self, fn: Fn) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(16, 16))
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x @ self.w).float().sum()


def capture(fn: Fn, dtype: DType = DType.FP32) -> tuple[Graph, list[str]]:
    with torch.device("meta"):
        model, x = Apply(fn), torch.zeros(8, 16)
    cap = capture_export(model, model, (x,), dtype=dtype, name="m")
    return cap.graph, cap.warnings


def reaches(graph: Graph, start: int, goal: int) -> bool:
    """Whether ``goal`` reads ``start``, directly or through other nodes."""
    users: dict[int, list[int]] = {}
    for node in graph:
        for i in node.inputs:
            users.setdefault(i, []).append(node.id)
    todo, seen = [start], {start}
    while todo:
        nid = todo.pop()
        if nid == goal:
            return True
        for u in users.get(nid, []):
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return False


@pytest.mark.parametrize("name", sorted(OPS))
def test_an_op_has_a_rule_and_the_output_still_reads_the_weight(name: str) -> None:
    graph, warnings = capture(OPS[name])
    assert not [w for w in warnings if "no rule" in w], warnings
    assert len(graph.outputs) == 1
    weight = next(n.id for n in graph if n.op is OpKind.PARAMETER)
    assert reaches(graph, weight, graph.outputs[0])


def test_an_op_with_no_rule_is_one_kernel_and_its_items_flow_on() -> None:
    """``frexp`` returns (mantissa, exponent) and has no rule: its mantissa still reaches the output."""
    graph, warnings = capture(lambda x: torch.frexp(x)[0])
    assert [w for w in warnings if "no rule for aten.frexp" in w]
    frexp = [n for n in graph if n.op is OpKind.ELEMENTWISE and str(n.attrs) == "frexp"]
    assert len(frexp) == 1 and frexp[0].out.shape == (8, 16)
    weight = next(n.id for n in graph if n.op is OpKind.PARAMETER)
    assert reaches(graph, weight, graph.outputs[0])
    assert reaches(graph, frexp[0].id, graph.outputs[0])


def test_broadcast_tensors_items_are_views_of_their_own_input() -> None:
    """No kernel, and item ``i`` reads input ``i`` only: a row broadcast against the matrix stays a row."""

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Parameter(torch.zeros(1, 16))
            self.b = nn.Parameter(torch.zeros(8, 16))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            a, b = torch.broadcast_tensors(self.a * x[:1], self.b * x)
            return (a * b).sum()

    with torch.device("meta"):
        model, x = Two(), torch.zeros(8, 16)
    graph = capture_export(model, model, (x,), dtype=DType.FP32, name="m").graph
    views = [n for n in graph if n.op is OpKind.VIEW and n.out.shape == (8, 16)]
    assert len(views) == 1  # the row, expanded; the matrix is already (8, 16): no node at all
    (row,) = views[0].inputs
    assert graph[row].out.shape == (1, 16) and views[0].out.shape == (8, 16)
    product = next(n for n in graph if n.op is OpKind.ELEMENTWISE and views[0].id in n.inputs)
    assert graph[product.inputs[1]].out.shape == (8, 16) and graph[product.inputs[1]].op is OpKind.ELEMENTWISE


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("outer", MatmulAttrs(m=16, n=16, k=1)),
        ("mv", MatmulAttrs(m=8, n=1, k=16)),
        ("dot", MatmulAttrs(m=1, n=1, k=16)),
        ("cdist", MatmulAttrs(m=8, n=8, k=16)),
    ],
)
def test_vector_products_are_gemms_with_their_closed_form_flops(name: str, expected: MatmulAttrs) -> None:
    graph, _ = capture(OPS[name])
    products = [n.attrs for n in graph if n.op is OpKind.MATMUL][1:]  # the first is x @ w
    assert products == [expected]


@pytest.mark.parametrize(
    ("fn", "transforms", "points", "real_side"),
    [
        (lambda x: torch.fft.rfft(x, dim=1).abs(), 8, 16, True),  # 16 real points -> 9 complex, per row
        (lambda x: torch.fft.irfft(x, n=30, dim=1), 8, 30, True),  # -> 30 real points, per row
        (lambda x: torch.fft.fft(x, dim=0).real, 16, 8, False),  # per column
        (lambda x: torch.fft.fft2(x).real, 1, 8 * 16, False),
    ],
)
def test_an_fft_costs_5_n_log2_n_per_transform(fn: Fn, transforms: int, points: int, real_side: bool) -> None:
    """5 N log2 N FLOPs per complex transform of N points, half for a real-to-complex one (and back).

    The cost is held per output element (rounded to an integer), and a real-to-complex transform has N/2 + 1
    complex outputs, not N/2: hence the tolerance, 2/N for those."""
    graph, _ = capture(fn)
    (fft,) = [n for n in graph if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn.startswith("fft_")]
    expected = (2.5 if real_side else 5.0) * points * math.log2(points) * transforms
    got = fft.attrs.flops_per_element * fft.out.numel
    assert got == pytest.approx(expected, rel=2 / points + 0.03)


def test_a_model_trained_on_mse_compiles(tmp_path: object) -> None:
    """The regression: ``F.mse_loss(out, target)`` exported as ``broadcast_tensors`` + ``mse_loss``."""
    from pathlib import Path

    path = Path(str(tmp_path)) / "denoise.py"
    path.write_text(
        "import torch\n"
        "from torch import nn\n"
        "import torch.nn.functional as F\n"
        "class Denoise(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.net = nn.Sequential(nn.Conv2d(4, 32, 3, padding=1), nn.SiLU(), nn.Conv2d(32, 4, 3, padding=1))\n"
        "    def forward(self, x, noise):\n"
        "        return F.mse_loss(self.net(x), noise)\n"
        "def model():\n"
        "    return Denoise(), [(('batch', 4, 32, 32), torch.float32), (('batch', 4, 32, 32), torch.float32)]\n"
    )
    result = CliRunner().invoke(cli, ["compile", f"{path}:model", "--backend", "h100-sxm", "--json"])
    assert result.exit_code == 0, result.output
    assert "no rule" not in result.output


class LoopedExperts(nn.Module):
    """A mixture of experts as research code often writes it: each expert runs the rows routed to it."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(16, 4)
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = self.gate(x).argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows = torch.where(idx == i)[0]
            out = out.index_add(0, rows, expert(x[rows]))
        return out.sum()


class MaskedRows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x[x.sum(-1) > 0] @ self.w).sum()


@pytest.mark.parametrize(
    ("model", "op", "line"),
    [(LoopedExperts, "aten.where", "rows = torch.where(idx == i)[0]"), (MaskedRows, "aten.index", "x[x.sum(-1) > 0]")],
)
def test_a_size_only_the_data_decides_is_named_at_the_line_that_makes_it(model: type, op: str, line: str) -> None:
    from echosim.frontend.spec import CaptureError

    with torch.device("meta"):
        module, x = model(), torch.zeros(8, 16)
    with pytest.raises(CaptureError) as err:
        capture_export(module, module, (x,), dtype=DType.FP32, name="m", where="test_aten_op_rules.py")
    message = str(err.value)
    assert message.startswith(f"{op} at test_aten_op_rules.py:")
    assert line in message and "size depends on tensor values" in message and "\n" not in message


@pytest.mark.parametrize(("fn", "copies"), [(lambda x: x.roll(1, 0), 1), (lambda x: x.roll((1, 2), (0, 1)), 2),
                                            (lambda x: x.roll(3), 1)])  # fmt: skip
def test_a_roll_is_one_copy_per_rolled_dimension(fn: Fn, copies: int) -> None:
    """ATen rolls one dimension, then the result over the next (roll_common): Swin's two-axis shift is two copies."""
    graph, _ = capture(fn)
    rolls = [n for n in graph if isinstance(n.attrs, ElementwiseAttrs) and n.attrs.fn == "roll"]
    assert len(rolls) == copies and all(n.out.shape == (8, 16) for n in rolls)
    assert all(graph[b.inputs[0]].id == a.id for a, b in itertools.pairwise(rolls))  # a chain
