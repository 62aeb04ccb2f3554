"""Errors echosim reports to users.

Anything raised as an :class:`EchosimError` is a problem with the input (a model,
a layout, a plugin), not a bug: the CLI prints it as one line and exits with 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class EchosimError(Exception):
    """Base class for every user-facing error; the CLI shows its message, never a traceback."""


class PluginError(EchosimError):
    """A plugin broke the registration contract (clashing or invalid names) or a name is unknown."""


def one_line_errors(*also: type[Exception]) -> Callable[[F], F]:
    """Decorate a click command so user errors end as one line and exit status 1.

    :class:`EchosimError` always; ``also`` adds types a command treats as bad input
    (``ValueError`` from argument checks, for instance).
    """
    caught = (EchosimError, *also)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            import click

            try:
                return fn(*args, **kwargs)
            except caught as exc:
                raise click.ClickException(" ".join(str(exc).split())) from None

        return wrapper  # type: ignore[return-value]

    return decorate
