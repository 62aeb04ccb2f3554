"""echosim's plugin system: pluggy hooks that hand plugins a ``register`` callback.

Importing this package loads only pluggy; plugins are imported when a registry is
built (:func:`load_registry`, or the memoised :func:`get_registry`).
"""

from __future__ import annotations

from echosim.errors import EchosimError, PluginError
from echosim.plugins.hookspecs import hookimpl, hookspec
from echosim.plugins.manager import Entry, PluginInfo, Registry, get_command_registry, get_registry, load_registry

__all__ = [
    "EchosimError",
    "Entry",
    "PluginError",
    "PluginInfo",
    "Registry",
    "get_command_registry",
    "get_registry",
    "hookimpl",
    "hookspec",
    "load_registry",
]
