"""The built-in backends register through the same hook a vendor's plugin uses.

Registering reads only the device table (plain data); the cost models load when a
backend is first built.
"""

from __future__ import annotations

from functools import partial

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterBackend


def _gpu(name: str) -> object:
    from echosim.backends.devices import DEVICES
    from echosim.backends.gpu import GPUBackend

    return GPUBackend(DEVICES[name])


def _null() -> object:
    from echosim.backends.gpu import NullBackend

    return NullBackend()


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    from echosim.backends.devices import DEVICES

    for name in DEVICES:
        register(name, partial(_gpu, name))
    register("null", _null)
