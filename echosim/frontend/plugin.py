"""The zoo and the frontends (``hf:``, ``.onnx``, ``.py``) register through the hooks a third-party plugin uses."""

from __future__ import annotations

from functools import partial

from echosim.plugins import hookimpl
from echosim.plugins.hookspecs import RegisterFrontend, RegisterModel


@hookimpl
def register_models(register: RegisterModel) -> None:
    from echosim.frontend.zoo import ZOO

    for name, cfg in ZOO.items():
        register(
            name, partial(lambda c: c, cfg), f"{cfg.arch}: {cfg.layers} layers, hidden {cfg.hidden} ({cfg.description})"
        )


@hookimpl
def register_frontends(register: RegisterFrontend) -> None:
    from echosim.frontend import hf, onnx, pyfile

    register("hf:", hf.load)
    register(".onnx", onnx.load)
    register(".py", pyfile.load)
