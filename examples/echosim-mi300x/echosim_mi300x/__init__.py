"""echosim plugin: the AMD Instinct MI300X backend (entry point ``mi300x`` in group ``echosim``).

Registering costs nothing: the spec and the model load when the backend is first used.
"""

from __future__ import annotations

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterBackend

__version__ = "0.1.0"


def _mi300x() -> object:
    from echosim_mi300x.model import MI300XBackend
    from echosim_mi300x.spec import MI300X

    return MI300XBackend(MI300X)


@hookimpl
def register_backends(register: RegisterBackend) -> None:
    register("mi300x", _mi300x)
