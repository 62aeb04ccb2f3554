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
    from echosim.frontend.zoo_torch import TORCH_ZOO

    for name, model in TORCH_ZOO.items():
        register(name, partial(lambda m: m, model), model.description)


def _load_hf(source: str) -> object:
    from echosim.frontend import hf

    return hf.load(source)


def _load_onnx(source: str) -> object:
    from echosim.frontend import onnx

    return onnx.load(source)


def _load_py(source: str) -> object:
    from echosim.frontend import pyfile

    return pyfile.load(source)


@hookimpl
def register_frontends(register: RegisterFrontend) -> None:
    # Each frontend module is imported when a model of its kind is loaded, not when the registry is built.
    register("hf:", _load_hf)
    register(".onnx", _load_onnx)
    register(".py", _load_py)
