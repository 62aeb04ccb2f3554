"""Errors echosim reports to users.

Anything raised as an :class:`EchosimError` is a problem with the input (a model,
a layout, a plugin), not a bug: the CLI prints it as one line and exits with 1.
"""

from __future__ import annotations


class EchosimError(Exception):
    """Base class for every user-facing error; the CLI shows its message, never a traceback."""


class PluginError(EchosimError):
    """A plugin broke the registration contract (clashing or invalid names) or a name is unknown."""
