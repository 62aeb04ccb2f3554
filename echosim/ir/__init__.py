"""The typed IR: tensors, ops, graphs, verification and a stable printer."""

from echosim.ir.graph import Graph, Node
from echosim.ir.ops import OpKind, Phase
from echosim.ir.printer import print_graph
from echosim.ir.types import DType, TensorSpec
from echosim.ir.verify import VerifyError, verify

__all__ = ["DType", "Graph", "Node", "OpKind", "Phase", "TensorSpec", "VerifyError", "print_graph", "verify"]
