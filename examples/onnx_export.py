"""Write an ONNX file for a model that has no weights, the way a user would bring one to echosim.

``torch.onnx.export`` runs on a model built on the ``meta`` device (so even a
GPT-3 175B exports in seconds), with ``optimize=False`` because the optimizer
would try to read weights. Initializers are then written as *external data that
is not there*: each keeps its name, shape and dtype and points at a weights file
that is never written. That is exactly an ``.onnx`` file whose ``.data`` file was
left behind, which echosim reads for shapes alone.

    python examples/onnx_export.py gpt3-125m gpt.onnx --seq-len 2048
    python examples/onnx_export.py tiny tiny-gpt.onnx

Batch and sequence axes are exported as dynamic dimensions named ``batch`` and
``seq``, bound at compile time from ``--micro-batch`` and ``--seq-len``.
"""

from __future__ import annotations

import argparse
import logging
import warnings
from pathlib import Path
from typing import Any

TINY = {"arch": "gpt", "layers": 2, "hidden": 64, "heads": 4, "vocab": 128, "seq_len": 16, "tied_embeddings": True}


def export_meta(module: Any, args: tuple[Any, ...], path: str | Path, *, dynamic: bool = True, opset: int = 23) -> Path:
    """Export ``module`` (on meta) called with ``args`` (meta tensors) to ``path`` with absent external weights."""
    import onnx
    import onnx_ir
    import torch

    path = Path(path)
    shapes = None
    if dynamic:
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
        shapes = tuple({0: batch, 1: seq} for _ in args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(
            module, args, dynamo=True, optimize=False, opset_version=opset, dynamic_shapes=shapes, verbose=False
        )
    assert program is not None
    initializers = []
    for value in program.model.graph.initializers.values():
        initializers.append((value.name, value.shape, value.dtype))
        value.const_value = None
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)
    proto = onnx_ir.serde.serialize_model(program.model)
    del proto.graph.initializer[:]
    offset = 0
    for name, shape, dtype in initializers:
        tensor = onnx.TensorProto(name=name, data_type=int(dtype), dims=[int(d) for d in shape])
        length = int(dtype.itemsize * max(1, _numel(shape)))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, val in (("location", f"{path.name}.data"), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=val)
        offset += length
        proto.graph.initializer.append(tensor)
    names = {t.name for t in proto.graph.initializer}
    kept = [v for v in proto.graph.value_info if v.name not in names]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    onnx.save(proto, str(path))
    return path


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a zoo name (see `echosim models`) or 'tiny'")
    parser.add_argument("out", help="the .onnx file to write")
    parser.add_argument("--seq-len", type=int, default=0, help="sequence length of the example input")
    args = parser.parse_args()

    import torch

    from echosim.frontend.zoo import ZOO, ArchConfig
    from echosim.frontend.zoo_modules import build_module

    cfg = ArchConfig(**TINY) if args.model == "tiny" else ZOO[args.model]
    if args.seq_len:
        cfg = cfg.with_(seq_len=args.seq_len)
    module = build_module(cfg)
    ids = torch.zeros(2, cfg.seq_len, dtype=torch.long, device="meta")
    print(export_meta(module, (ids, ids), args.out))


if __name__ == "__main__":
    main()
