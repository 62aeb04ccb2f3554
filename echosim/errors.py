"""Errors echosim reports to users.

Anything raised as an :class:`EchosimError` is a problem with the input (a model,
a layout, a plugin), not a bug: the CLI prints it as one line and exits with 1.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
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


class TimeLimitError(EchosimError):
    """Work that ran past its wall-clock limit (a model capture, a plugin import)."""


@contextlib.contextmanager
def time_limit(seconds: float, what: str, env_var: str = "") -> Iterator[None]:
    """Raise :class:`TimeLimitError` naming ``what`` if the block runs longer than ``seconds``.

    A guard for code echosim does not control (a model file, a plugin) so a pre-commit hook
    never hangs. It uses ``SIGALRM``, so it applies only in the main thread of a POSIX
    process; elsewhere (a worker thread, Windows) the block runs unguarded. ``seconds <= 0``
    disables it. Only the outermost guard arms the timer: a nested one runs inside it.
    """
    global _armed
    main = threading.current_thread() is threading.main_thread()
    if seconds <= 0 or _armed or not main or not hasattr(signal, "setitimer"):
        yield
        return
    hint = f" (raise it with {env_var})" if env_var else ""

    def expire(signum: int, frame: Any) -> None:
        raise TimeLimitError(f"{what} ran past its {seconds:g} s limit{hint}")

    previous = signal.signal(signal.SIGALRM, expire)
    _armed = True
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        _armed = False


_armed = False


def limit_from_env(env_var: str, default_s: float) -> float:
    """Seconds from ``env_var`` (a number; 0 disables the guard), else ``default_s``."""
    text = os.environ.get(env_var, "").strip()
    if not text:
        return default_s
    try:
        value = float(text)
    except ValueError:
        raise EchosimError(f"{env_var}={text!r}: expected a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise EchosimError(f"{env_var}={text!r}: expected a number of seconds >= 0")
    return value
