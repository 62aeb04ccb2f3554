"""A minimal third-party echosim plugin: one model and one backend.

echosim finds it through the ``echosim`` entry point in pyproject.toml; nothing
here runs until a registry is loaded, and the backend is built only when used.
"""

from __future__ import annotations

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterBackend, RegisterModel

TINY_MODEL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 1000, "seq": 128}


@hookimpl
def register_models(register: RegisterModel) -> None:
    register("demo-tiny", tiny_model, description="a two-layer toy transformer")


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register("demo-null", NullBackend)


def tiny_model(**overrides: int) -> dict[str, int | str]:
    """Zoo-style parameters; keyword options override the defaults."""
    unknown = set(overrides) - set(TINY_MODEL)
    if unknown:
        raise TypeError(f"demo-tiny has no option(s) {sorted(unknown)}")
    return {"name": "demo-tiny", **TINY_MODEL, **overrides}


class NullBackend:
    """A device on which everything is free: the whole pipeline runs, every time is zero."""

    name = "demo-null"

    def op_time_s(self, node: object, io_bytes: int) -> float:
        return 0.0

    def collective_time_s(self, kind: object, nbytes: int, placement: object) -> float:
        return 0.0

    def overlap(self) -> object:
        from echosim.backends.base import OverlapModel

        return OverlapModel()

    def memory_bytes(self) -> int:
        return 80 * 2**30

    def peak_flops(self, dtype: str) -> float:
        return 1e15
