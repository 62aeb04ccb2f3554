"""An echosim plugin that adds a graph pass and a pipeline schedule, through the hooks the built-ins use.

* ``no-dropout`` (optional: ``--pass no-dropout``): train with dropout probability 0, as
  most LLM pre-training recipes do; each dropout op becomes a free view, so neither its
  kernel nor its mask is costed. It runs on the whole model before autodiff.
* ``2f2b`` (``--schedule 2f2b``): 1F1B with its steady state taken two micro-batches at a
  time (two forwards, then two backwards), which gives point-to-point transfers a
  block of compute to hide behind at the cost of one more micro-batch in flight.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from echosim.ir.graph import Graph
from echosim.ir.ops import ElementwiseAttrs, NoAttrs, OpKind
from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterPass, RegisterSchedule
from echosim.timeline.schedule import Block, Schedule, one_f_one_b


@dataclass(frozen=True)
class NoDropout:
    """Dropout with p=0: the op keeps its value flowing but costs nothing and saves no mask."""

    name: ClassVar[str] = "no-dropout"

    def run(self, graph: Graph) -> Graph:
        g = graph.copy()
        for node in graph:
            if isinstance(node.attrs, ElementwiseAttrs) and node.attrs.fn == "dropout":
                g.replace(node.id, op=OpKind.VIEW, attrs=NoAttrs(), inputs=node.inputs[:1])
        return g


def two_f_two_b(pp: int, m: int, vpp: int = 1) -> list[list[Block]]:
    """1F1B's warm-up and drain; in between, forwards and backwards go in pairs."""
    orders = []
    for seq in one_f_one_b(pp, m):
        out: list[Block] = []
        i = 0
        while i < len(seq):
            pair = seq[i : i + 4]
            kinds = [kind for kind, _, _ in pair]
            if kinds == ["F", "B", "F", "B"]:  # the steady state: F B F B -> F F B B
                out += [pair[0], pair[2], pair[1], pair[3]]
                i += 4
            else:
                out.append(seq[i])
                i += 1
        orders.append(out)
    return orders


@hookimpl
def register_passes(register: RegisterPass) -> None:
    register("no-dropout", NoDropout, optional=True, before="autodiff")


@hookimpl
def register_schedules(register: RegisterSchedule) -> None:
    register("2f2b", Schedule("2f2b", two_f_two_b, description="1F1B with paired steady-state blocks"))
