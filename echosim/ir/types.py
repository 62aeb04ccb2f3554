"""Tensor types: a dtype and a shape, nothing more (no data ever lives in the IR)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum


class IdentityEnum(Enum):
    """An enum hashed by identity, as it compares: a member is one object per process.

    ``Enum.__hash__`` hashes the member's name in Python code; the IR's enums (op kinds, phases, axes, roles,
    dtypes) are hashed millions of times by a search (in every op's cost key and unit key), and identity
    is the same contract (members compare by identity) at C speed. Like a name's hash, an identity's varies
    between processes, so nothing may depend on the order of a set of members (nothing did before).
    """

    __hash__ = object.__hash__


class DType(IdentityEnum):
    """Element types the simulator costs; the value is the canonical short name."""

    FP32 = "fp32"
    TF32 = "tf32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    FP4 = "fp4"  # NVFP4 / MXFP4 elements: half a byte (TensorSpec.nbytes counts bits)
    INT8 = "int8"  # integer GEMM operands (MaxText AQT int8 on TPUs)
    INT64 = "int64"
    INT32 = "int32"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        """Bytes per element, rounded up (fp4 packs two per byte: :attr:`bits` is exact)."""
        return _ITEMSIZE[self]

    @property
    def bits(self) -> int:
        return 4 if self is DType.FP4 else 8 * _ITEMSIZE[self]

    @classmethod
    def parse(cls, text: str) -> DType:
        """Accept the short names and torch spellings (``float16``, ``torch.bfloat16``)."""
        key = text.strip().lower().removeprefix("torch.")
        key = _ALIASES.get(key, key)
        try:
            return cls(key)
        except ValueError:
            known = ", ".join(d.value for d in cls)
            raise ValueError(f"unknown dtype {text!r} (known: {known})") from None


_ITEMSIZE = {
    DType.FP32: 4,
    DType.TF32: 4,
    DType.FP16: 2,
    DType.BF16: 2,
    DType.FP8: 1,
    DType.FP4: 1,
    DType.INT8: 1,
    DType.INT64: 8,
    DType.INT32: 4,
    DType.BOOL: 1,
}

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8": "int8",
    "int64": "int64",
    "long": "int64",
    "int32": "int32",
    "int": "int32",
    "bool": "bool",
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """Shape and dtype of one SSA value."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return (self.numel * self.dtype.bits + 7) // 8

    def with_shape(self, shape: tuple[int, ...]) -> TensorSpec:
        return TensorSpec(tuple(shape), self.dtype)

    def __str__(self) -> str:
        dims = "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.dtype.value}[{dims}]"
