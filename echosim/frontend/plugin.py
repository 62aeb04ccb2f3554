"""The zoo registers its models through the same hook a third-party plugin uses."""

from __future__ import annotations

from functools import partial

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterModel


@hookimpl
def register_models(register: RegisterModel) -> None:
    from echosim.frontend.zoo import ZOO

    for name, cfg in ZOO.items():
        register(
            name, partial(lambda c: c, cfg), f"{cfg.arch}: {cfg.layers} layers, hidden {cfg.hidden} ({cfg.description})"
        )
