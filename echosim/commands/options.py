"""Options that more than one command takes, defined once so that they mean the same everywhere.

``--calibration`` of ``echosim compile`` and ``echosim cost`` defaults to the database
named by ``$ECHOSIM_CALIBRATION`` (:data:`echosim.calibrate.db.ENV_VAR`): the command
line reads the environment, the library never does, so a Python caller gets exactly the
calibration it passes.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

ENV_VAR = "ECHOSIM_CALIBRATION"  # the same name as echosim.calibrate.db.ENV_VAR, without importing it

F = TypeVar("F", bound=Callable[..., Any])


def _environment_names_a_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A value taken from ``$ECHOSIM_CALIBRATION`` names a database file: a missing one is one line."""
    from_environment = ctx.get_parameter_source(param.name or "") is ParameterSource.ENVIRONMENT
    if value and from_environment and not Path(value).exists():
        raise click.ClickException(f"{ENV_VAR}={value}: no such file")
    return value


def calibration_option(help: str, **kwargs: Any) -> Callable[[F], F]:
    """``--calibration`` with ``$ECHOSIM_CALIBRATION`` as its default, shown in ``--help``."""
    return click.option(
        "--calibration",
        envvar=ENV_VAR,
        show_envvar=True,
        callback=_environment_names_a_file,
        help=help,
        **kwargs,
    )
