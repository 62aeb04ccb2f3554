"""The hooks a plugin can implement, and the ``register`` callbacks they receive.

Every hook hands the plugin a ``register`` callback instead of the registry, so
the core alone validates names and reports clashes (the simonw/llm pattern).
Built-in backends and frontends implement these same hooks; nothing is special
about them. Each hook is called once per :func:`echosim.plugins.load_registry`
call (``register_commands`` once per CLI group), after every plugin is loaded.

Write a plugin as a module with functions marked ``@hookimpl``::

    from echosim.plugins import hookimpl

    @hookimpl
    def register_backends(register):
        register("my-gpu", MyGpuBackend)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    import click

PROJECT_NAME = "echosim"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


class RegisterBackend(Protocol):
    def __call__(self, name: str, factory: Callable[[], object]) -> None: ...


class RegisterModel(Protocol):
    def __call__(self, name: str, factory: Callable[..., object], description: str = "") -> None: ...


class RegisterFrontend(Protocol):
    def __call__(self, scheme_or_suffix: str, loader: Callable[[str], object]) -> None: ...


#: Where a pass runs: on the whole model before the pipeline split, or on each pipeline stage after it.
PASS_LEVELS = ("graph", "stage")


@dataclass(frozen=True)
class PassRegistration:
    """A registered pass: its class, how a plan configures it, and where it goes in the pipeline."""

    pass_cls: type
    configure: Callable[[Any], object | None] | None = None
    level: str = "graph"
    after: tuple[str, ...] = ()
    before: tuple[str, ...] = ()
    optional: bool = False  # runs only when the plan names it (``--pass NAME``)

    def build(self, plan: Any) -> object | None:
        """The pass instance for ``plan`` (``None``: it does not apply); without ``configure``, ``pass_cls()``."""
        return self.configure(plan) if self.configure is not None else self.pass_cls()


class RegisterPass(Protocol):
    def __call__(
        self,
        name: str,
        pass_cls: type,
        *,
        configure: Callable[[Any], object | None] | None = None,
        level: str = "graph",
        after: Sequence[str] = (),
        before: Sequence[str] = (),
        optional: bool = False,
    ) -> None: ...


class RegisterSchedule(Protocol):
    def __call__(self, name: str, schedule: object) -> None: ...


@hookspec
def register_backends(register: RegisterBackend) -> None:
    """Register hardware backends (devices and clusters that cost a graph).

    Called once while the registry loads. Call ``register(name, factory)`` for each
    backend: ``factory()`` takes no arguments and returns an object that follows
    ``echosim.backends.base.Backend``. It is called only when the backend is used,
    so import heavy dependencies inside it, not at module level.

    :param register: ``register(name: str, factory: Callable[[], object])``.
        Names use lowercase letters, digits, ``-``, ``_`` and ``.``; a name that
        another plugin already registered is an error naming both plugins.
    """


@hookspec
def register_models(register: RegisterModel) -> None:
    """Register named models (the zoo: ``echosim compile NAME`` and ``echosim models``).

    Called once while the registry loads. Call ``register(name, factory,
    description)`` for each model: ``factory(**options)`` builds it when asked,
    keyword options (layers, hidden, seq, ...) override its defaults, and
    ``description`` is the one line ``echosim models`` prints.

    :param register: ``register(name: str, factory: Callable[..., object], description: str = "")``.
    """


@hookspec
def register_frontends(register: RegisterFrontend) -> None:
    """Register loaders that turn a model source into an IR graph.

    Called once while the registry loads. Call ``register(scheme_or_suffix,
    loader)`` with a file suffix (``".onnx"``) or a scheme ending in a colon
    (``"hf:"``); ``loader(source)`` receives the whole source string, for example
    ``"model.onnx"`` or ``"hf:meta-llama/Llama-3.1-8B"``. A matching scheme wins
    over a matching suffix; among several matches the longest key wins.

    The loader returns an object with ``capture(spec) -> (graph, messages,
    total_params)``, where ``spec`` is an ``echosim.frontend.CaptureSpec``
    (``micro_batch``, ``seq_len``, ``dtype``: what a capture needs, never the
    parallel layout); or an ``nn.Module``, an IR ``Graph`` or a zoo ``ArchConfig``.

    :param register: ``register(scheme_or_suffix: str, loader: Callable[[str], object])``.
    """


@hookspec
def register_passes(register: RegisterPass) -> None:
    """Register graph passes; the compiler builds its pass pipeline from these alone.

    Called once while the registry loads. Call ``register(name, pass_cls, *, configure,
    level, after, before)`` with the pass class itself (a frozen dataclass whose fields
    are its options and whose ``run(graph)`` returns a new graph). ``configure(plan)``
    returns the instance a plan needs, or ``None`` when the pass does not apply (default:
    ``pass_cls()``). ``level`` is ``"graph"`` (the whole model, before the pipeline split)
    or ``"stage"`` (each pipeline stage, after it). ``after`` and ``before`` name passes of
    the same level this one must follow or precede; among passes free to go anywhere,
    registration order decides (built-ins register first). An ``optional`` pass runs only
    when the plan asks for it by name (``--pass NAME``, ``Plan(passes=(NAME,))``).

    :param register: ``register(name: str, pass_cls: type, *, configure=None, level="graph",
        after=(), before=(), optional=False)``. A name another plugin took, an unknown level,
        or an ``after``/``before`` naming no pass of that level is an error naming the plugin.
    """


@hookspec
def register_schedules(register: RegisterSchedule) -> None:
    """Register pipeline schedules (GPipe, 1F1B, interleaved, zero-bubble, ...).

    Called once while the registry loads. Call ``register(name, schedule)`` with an object
    like :class:`echosim.timeline.schedule.Schedule`: ``orders(pp, microbatches, vpp)``
    returns each pipeline rank's list of ``(kind, virtual_stage, microbatch)`` blocks
    (``kind`` is ``"F"`` or ``"B"``); optional attributes ``interleaved`` (it takes
    ``--vpp`` above 1) and ``split_backward`` (its ``B`` is the input-gradient half and the
    weight-gradient halves are deferred, as in zero-bubble schedules). ``--schedule NAME``
    selects it.

    :param register: ``register(name: str, schedule: object)``.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``echosim`` command line.

    Called once when the CLI builds its group, after the built-in commands exist.
    Add commands with ``@cli.command()`` or ``cli.add_command(...)``; a command
    whose name is already taken is an error naming both owners. Keep imports
    inside the command function so that ``echosim --help`` stays fast.

    :param cli: the top-level ``click.Group``.
    """
