"""The built-in backends register through the same hook a vendor's plugin uses.

Registering reads only the GPU device table (plain data) and the TPU/CPU names; the
cost models load when a backend is first built. The commands that use backends
(``cost``, ``validate``) live in :mod:`echosim.commands`, above this layer.
"""

from __future__ import annotations

from functools import partial

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterBackend

# Names only, so that registering does not import the TPU and CPU models.
TPU_NAMES = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
CPU_NAMES = ("cpu-x86", "epyc-9654")


def _gpu(name: str) -> object:
    from echosim.backends.devices import DEVICES
    from echosim.backends.gpu import GPUBackend

    return GPUBackend(DEVICES[name])


def _tpu(name: str) -> object:
    from echosim.backends.tpu import TPUS, TPUBackend

    return TPUBackend(TPUS[name])


def _cpu(name: str) -> object:
    from echosim.backends.cpu import CPUS, CPUBackend

    return CPUBackend(CPUS[name])


def _null() -> object:
    from echosim.backends.gpu import NullBackend

    return NullBackend()


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    from echosim.backends.devices import DEVICES

    for name in DEVICES:
        register(name, partial(_gpu, name))
    for name in TPU_NAMES:
        register(name, partial(_tpu, name))
    for name in CPU_NAMES:
        register(name, partial(_cpu, name))
    register("null", _null)
