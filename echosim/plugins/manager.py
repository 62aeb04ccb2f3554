"""Load plugins and collect what they register into a :class:`Registry`.

Every :func:`load_registry` call builds a fresh ``pluggy.PluginManager``, so tests
can load any mix of plugins without global state. Built-ins load first and are
plugins like any other; then installed plugins (entry-point group ``echosim``);
then ``extra_plugins``. A plugin that raises on import or inside a hook is
reported by name in :attr:`Registry.errors` and the others keep working, as is a
contract violation (an invalid name or value: that hook's entries are dropped) and a
name another plugin registered first (skipped). ``$ECHOSIM_DISABLE_PLUGINS`` switches
installed plugins off, ``$ECHOSIM_PLUGINS`` allowlists them, and each plugin's import
and hooks run under a wall-clock limit (``$ECHOSIM_PLUGIN_TIMEOUT_S``).
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

from echosim.errors import PluginError, limit_from_env, time_limit
from echosim.plugins import hookspecs
from echosim.plugins.hookspecs import PASS_LEVELS, PassRegistration

if TYPE_CHECKING:
    import click

ENTRYPOINT_GROUP = "echosim"
#: ``1`` (or ``true``, ``yes``): load no installed plugin, only echosim's own (``echosim --no-plugins``).
DISABLE_ENV = "ECHOSIM_DISABLE_PLUGINS"
#: A comma-separated allowlist of installed plugins (entry-point names) to load; unset: all of them.
ALLOW_ENV = "ECHOSIM_PLUGINS"
#: Wall-clock limit on one plugin's import and on each of its registration hooks.
TIMEOUT_ENV = "ECHOSIM_PLUGIN_TIMEOUT_S"
TIMEOUT_S = 10.0

#: Dotted names of the modules that register echosim's own features.
BUILTIN_PLUGINS: list[str] = [
    "echosim.backends.plugin",
    "echosim.frontend.plugin",
    "echosim.passes.plugin",
    "echosim.timeline.plugin",
    "echosim.commands.cost",
    "echosim.commands.validate",
    "echosim.commands.calibrate",
    "echosim.commands.explain",
    "echosim.commands.diff",
]

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_NAME_RULE = "lowercase letters, digits, '-', '_', '.'"
_SUFFIX = re.compile(r"\.[a-z0-9][a-z0-9._-]*")
_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:")
_CORE_OWNER = "echosim"
_COMMAND_MODULES = "echosim.commands."  # the built-ins that add commands

#: Each kind of registration and the Registry table (and ``register_<table>`` hook) it fills.
_KINDS = {
    "backend": "backends",
    "model": "models",
    "frontend": "frontends",
    "pass": "passes",
    "schedule": "schedules",
}
#: kind -> (the register parameter holding the value, its check, what the check wants).
_VALUE_RULES: dict[str, tuple[str, Callable[[Any], bool], str]] = {
    "backend": ("factory", callable, "callable"),
    "model": ("factory", callable, "callable"),
    "frontend": ("loader", callable, "callable"),
    "pass": ("pass_cls", lambda value: isinstance(value.pass_cls, type), "a class"),
    "schedule": ("schedule", lambda value: callable(getattr(value, "orders", None)), "an object with orders()"),
}


@dataclass(frozen=True)
class Entry:
    """One registered thing and the plugin that registered it (for clash reports and listings)."""

    name: str
    value: Any
    owner: str
    description: str = ""


@dataclass(frozen=True)
class PluginInfo:
    """What ``echosim plugins`` lists about one loaded plugin."""

    name: str
    version: str | None
    hooks: tuple[str, ...]
    distribution: str | None = None


@dataclass
class Registry:
    """Everything the loaded plugins registered, by kind, each entry with its owner."""

    backends: dict[str, Entry] = field(default_factory=dict)
    models: dict[str, Entry] = field(default_factory=dict)
    frontends: dict[str, Entry] = field(default_factory=dict)
    passes: dict[str, Entry] = field(default_factory=dict)
    schedules: dict[str, Entry] = field(default_factory=dict)
    #: One line per plugin that failed to load or raised inside a hook.
    errors: list[str] = field(default_factory=list)
    _infos: list[PluginInfo] = field(default_factory=list, repr=False)
    _pipelines: dict[str, list[Entry]] = field(default_factory=dict, repr=False, compare=False)
    _pm: pluggy.PluginManager | None = field(default=None, repr=False, compare=False)

    def backend(self, name: str) -> Callable[[], object]:
        """The factory of backend ``name``."""
        return _lookup(self.backends, "backend", name).value

    def model(self, name: str) -> Callable[..., object]:
        """The factory of model ``name``."""
        return _lookup(self.models, "model", name).value

    def pass_class(self, name: str) -> type:
        """The class of pass ``name``."""
        return _lookup(self.passes, "pass", name).value.pass_cls

    def pass_pipeline(self, level: str) -> list[Entry]:
        """The passes of ``level`` in the order they run: ``after``/``before`` first, then registration order.

        An ``after`` or ``before`` that names no pass of the level, or constraints that
        contradict each other, are errors naming the plugin.
        """
        if level in self._pipelines:
            return list(self._pipelines[level])
        entries = [e for e in self.passes.values() if e.value.level == level]
        names = {e.name for e in entries}
        follows: dict[str, set[str]] = {e.name: set() for e in entries}
        for e in entries:
            reg: PassRegistration = e.value
            for other in (*reg.after, *reg.before):
                if other not in names:
                    raise PluginError(
                        f"plugin '{e.owner}': pass '{e.name}' is ordered against '{other}', "
                        f"which is not a registered {level}-level pass (known: {', '.join(sorted(names))})"
                    )
            follows[e.name].update(reg.after)
            for other in reg.before:
                follows[other].add(e.name)
        order: list[Entry] = []
        placed: set[str] = set()
        while len(order) < len(entries):
            ready = next((e for e in entries if e.name not in placed and follows[e.name] <= placed), None)
            if ready is None:
                stuck = ", ".join(sorted(names - placed))
                raise PluginError(f"the {level}-level passes {stuck} have contradicting after/before orders")
            order.append(ready)
            placed.add(ready.name)
        self._pipelines[level] = order
        return list(order)

    def schedule(self, name: str) -> object:
        """The schedule registered as ``name``."""
        return _lookup(self.schedules, "schedule", name).value

    def frontend(self, source: str) -> Callable[[str], object]:
        """The loader for ``source``: the longest scheme prefix it starts with, else the longest suffix."""
        return self.frontend_entry(source).value

    def frontend_entry(self, source: str) -> Entry:
        """The registration :meth:`frontend` picks for ``source`` (its key is the scheme or suffix)."""
        lowered = source.lower()
        schemes = [key for key in self.frontends if key.endswith(":") and lowered.startswith(key)]
        suffixes = [key for key in self.frontends if key.startswith(".") and lowered.endswith(key)]
        matches = schemes or suffixes
        if not matches:
            raise PluginError(f"unknown frontend for '{source}' (known: {_known(self.frontends)})")
        return self.frontends[max(matches, key=len)]

    def plugins(self) -> list[PluginInfo]:
        """The loaded plugins in load order (built-ins first)."""
        return list(self._infos)

    def add_commands(self, cli: click.Group) -> None:
        """Let plugins add subcommands to ``cli``; call once, after the built-in commands exist."""
        if self._pm is None:
            return
        owners = dict.fromkeys(cli.commands, _CORE_OWNER)
        for impl in self._pm.hook.register_commands.get_hookimpls():
            before = dict(cli.commands)
            try:
                with time_limit(_timeout(), f"plugin '{impl.plugin_name}' register_commands", TIMEOUT_ENV):
                    _call_impl(impl, {"cli": cli})
            except BaseException as exc:
                _reraise_interrupt(exc)
                cli.commands.clear()
                cli.commands.update(before)
                self.errors.append(_hook_failure(impl.plugin_name, "register_commands", exc))
                continue
            for name, command in list(cli.commands.items()):
                if name in before and before[name] is not command:
                    cli.commands[name] = before[name]  # the first registration stays
                    self.errors.append(
                        f"command '{name}' is registered by both '{owners[name]}' and '{impl.plugin_name}'; "
                        f"the one from '{impl.plugin_name}' is skipped"
                    )
                owners.setdefault(name, impl.plugin_name)


def load_registry(
    include_entrypoints: bool = True, extra_plugins: Sequence[object] = (), *, commands_only: bool = False
) -> Registry:
    """Load built-in, installed (unless ``include_entrypoints`` is false) and extra plugins.

    ``extra_plugins`` are modules or instances with ``@hookimpl`` methods, named by
    their ``__name__`` (or their class name); tests use them to load plugins that
    are not installed. ``commands_only``: of the built-ins only those that add commands,
    and no ``register_*`` table is filled (what the CLI needs to list its commands).
    """
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    registry = Registry(_pm=pm)
    versions: dict[str, tuple[str | None, str | None]] = {}
    from echosim import __version__

    builtins = [m for m in BUILTIN_PLUGINS if m.startswith(_COMMAND_MODULES)] if commands_only else BUILTIN_PLUGINS
    for module_name in list(builtins):
        module = _import_builtin(module_name)
        if module is not None:
            pm.register(module, name=module_name)
            versions[module_name] = (_CORE_OWNER, __version__)
    if include_entrypoints and not plugins_disabled():
        _load_entrypoints(pm, registry, versions)
    for plugin in extra_plugins:
        name = getattr(plugin, "__name__", None) or type(plugin).__name__
        try:
            pm.register(plugin, name=name)
        except BaseException as exc:
            _reraise_interrupt(exc)
            registry.errors.append(_load_failure(name, exc))
            continue
        versions[name] = (None, None)

    _report_unknown_hooks(pm, registry)
    for kind, table_name in _KINDS.items() if not commands_only else ():
        _run_register_hook(pm, registry, kind, table_name)

    for name, plugin in pm.list_name_plugin():
        distribution, version = versions.get(name, (None, None))
        hooks = tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))
        registry._infos.append(PluginInfo(name, version, hooks, distribution))
    return registry


def plugins_disabled() -> bool:
    """Whether ``$ECHOSIM_DISABLE_PLUGINS`` switches installed plugins off."""
    return os.environ.get(DISABLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def allowed_plugins() -> set[str] | None:
    """The entry-point names ``$ECHOSIM_PLUGINS`` allows; ``None`` when unset (all are loaded)."""
    text = os.environ.get(ALLOW_ENV)
    if text is None:
        return None
    return {name.strip() for name in text.split(",") if name.strip()}


def _timeout() -> float:
    try:
        return limit_from_env(TIMEOUT_ENV, TIMEOUT_S)
    except PluginError:
        raise
    except Exception:
        return TIMEOUT_S


def _reraise_interrupt(exc: BaseException) -> None:
    """A plugin may raise anything (SystemExit, a BaseException subclass) and is reported; Ctrl-C is not."""
    if type(exc) is KeyboardInterrupt or isinstance(exc, GeneratorExit):
        raise exc


@functools.lru_cache(maxsize=1)
def get_registry() -> Registry:
    """The registry of all plugins, loaded on first use; ``get_registry.cache_clear()`` reloads."""
    return load_registry()


def get_command_registry() -> Registry:
    """The plugins that may add commands, without building the other tables (cheap: for ``--help``)."""
    if get_registry.cache_info().currsize:
        return get_registry()
    return load_registry(commands_only=True)


def _import_builtin(module_name: str) -> object | None:
    """Import a built-in plugin module; ``None`` when that module (or its package) does not exist yet."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name or module_name.startswith(f"{exc.name}."):
            return None
        raise


def _load_entrypoints(
    pm: pluggy.PluginManager, registry: Registry, versions: dict[str, tuple[str | None, str | None]]
) -> None:
    """``pm.load_setuptools_entrypoints`` that reports a failing plugin by name instead of raising."""
    from echosim import dists  # the .dist-info folders read directly: importlib.metadata costs more

    seen: dict[str, str] = {}
    allowed = allowed_plugins()
    for ep in dists.entry_points(ENTRYPOINT_GROUP):
        dist = ep.dist
        dist_name = dist.name or "unknown"
        if ep.name in seen:
            # The same distribution found twice on sys.path is harmless; two projects are not.
            if _canonical(seen[ep.name]) != _canonical(dist_name):
                registry.errors.append(
                    f"plugin '{ep.name}' from '{dist_name}' not loaded: the name is taken by '{seen[ep.name]}'"
                )
            continue
        seen[ep.name] = dist_name
        if allowed is not None and ep.name not in allowed:
            continue
        try:
            with time_limit(_timeout(), f"plugin '{ep.name}' import", TIMEOUT_ENV):
                pm.register(ep.load(), name=ep.name)
        except BaseException as exc:
            _reraise_interrupt(exc)
            registry.errors.append(_load_failure(ep.name, exc))
            continue
        versions[ep.name] = (dist_name, dist.version)


def _report_unknown_hooks(pm: pluggy.PluginManager, registry: Registry) -> None:
    """A misspelt hook would otherwise be silently never called."""
    for hook_name, caller in vars(pm.hook).items():
        if hook_name.startswith("_") or caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if not impl.optionalhook:
                registry.errors.append(f"plugin '{impl.plugin_name}' implements unknown hook '{hook_name}'")


def _run_register_hook(pm: pluggy.PluginManager, registry: Registry, kind: str, table_name: str) -> None:
    """Call each plugin's implementation on its own, so a failure is reported by that plugin's name.

    A plugin's entries are kept only if its implementation returns: one that raises
    (anything, SystemExit included) or runs past ``$ECHOSIM_PLUGIN_TIMEOUT_S`` halfway
    leaves nothing behind. A contract violation (an invalid name or value) drops that
    hook's entries even if the plugin swallowed the :class:`PluginError` that ``register``
    raised; a name another plugin registered first is skipped. Each is one line in
    :attr:`Registry.errors` naming the plugin, and the core and the other plugins keep working.
    """
    hook_name = f"register_{table_name}"
    table: dict[str, Entry] = getattr(registry, table_name)
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        staging = _Staging(table, kind, impl.plugin_name)
        try:
            with time_limit(_timeout(), f"plugin '{impl.plugin_name}' {hook_name}", TIMEOUT_ENV):
                _call_impl(impl, {"register": _typed_register(kind, staging.add)})
        except BaseException as exc:
            _reraise_interrupt(exc)
            failure = str(staging.violations[0]) if staging.violations else None
            registry.errors.append(failure or _hook_failure(impl.plugin_name, hook_name, exc))
            continue
        if staging.violations:
            registry.errors.append(str(staging.violations[0]))
            continue
        registry.errors.extend(staging.skipped)
        table.update(staging.entries)


class _Staging:
    """What one plugin registers in one hook, validated at once and kept apart until the hook returns."""

    def __init__(self, table: dict[str, Entry], kind: str, owner: str) -> None:
        self.table, self.kind, self.owner = table, kind, owner
        self.entries: dict[str, Entry] = {}
        self.violations: list[PluginError] = []
        self.skipped: list[str] = []  # names another plugin registered first

    def add(self, name: str, value: Any, description: str = "") -> None:
        try:
            self._validate(name, value, description)
        except PluginError as exc:
            self.violations.append(exc)
            raise
        previous = self.table.get(name)
        if previous is not None:
            self.skipped.append(
                f"{self.kind} '{name}' is registered by both '{previous.owner}' and '{self.owner}'; "
                f"the one from '{self.owner}' is skipped"
            )
            return
        self.entries[name] = Entry(name, value, self.owner, description)

    def _validate(self, name: str, value: Any, description: str) -> None:
        kind, owner = self.kind, self.owner
        _check_name(kind, name, owner)
        if kind in _VALUE_RULES:
            field_name, is_valid, expected = _VALUE_RULES[kind]
            if not is_valid(value):
                got = type(value.pass_cls if kind == "pass" else value).__name__
                raise PluginError(f"plugin '{owner}': {kind} '{name}' {field_name} must be {expected}, got {got}")
        if not isinstance(description, str):
            raise PluginError(f"plugin '{owner}': {kind} '{name}' description must be a string")
        if kind == "pass":
            _check_pass(name, value, owner)
        previous = self.table.get(name) or self.entries.get(name)
        if previous is not None and previous.owner == owner:
            raise PluginError(f"{kind} '{name}' is registered twice by '{owner}'")


def _typed_register(kind: str, register: Callable[..., None]) -> Callable[..., None]:
    """The ``register`` callback with the parameter names the hookspec documents for ``kind``."""
    if kind == "model":

        def register_model(name: str, factory: Callable[..., object], description: str = "") -> None:
            register(name, factory, description)

        return register_model
    if kind == "backend":

        def register_backend(name: str, factory: Callable[[], object]) -> None:
            register(name, factory)

        return register_backend
    if kind == "frontend":

        def register_frontend(scheme_or_suffix: str, loader: Callable[[str], object]) -> None:
            register(scheme_or_suffix, loader)

        return register_frontend
    if kind == "pass":

        def register_pass(
            name: str,
            pass_cls: type,
            *,
            configure: Callable[[Any], object | None] | None = None,
            level: str = "graph",
            after: Sequence[str] = (),
            before: Sequence[str] = (),
            optional: bool = False,
        ) -> None:
            names = tuple(after) if not isinstance(after, str) else (after,)
            ahead = tuple(before) if not isinstance(before, str) else (before,)
            register(name, PassRegistration(pass_cls, configure, level, names, ahead, bool(optional)))

        return register_pass

    def register_schedule(name: str, schedule: object) -> None:
        register(name, schedule)

    return register_schedule


def _check_pass(name: str, reg: PassRegistration, owner: str) -> None:
    if reg.configure is not None and not callable(reg.configure):
        raise PluginError(f"plugin '{owner}': pass '{name}' configure must be callable or None")
    if reg.level not in PASS_LEVELS:
        raise PluginError(f"plugin '{owner}': pass '{name}' level {reg.level!r} is unknown (known: graph, stage)")
    if not all(isinstance(n, str) for n in (*reg.after, *reg.before)):
        raise PluginError(f"plugin '{owner}': pass '{name}' after/before must name passes")


def _call_impl(impl: pluggy.HookImpl, kwargs: dict[str, object]) -> None:
    if impl.hookwrapper or impl.wrapper:
        raise TypeError("hook wrappers are not supported for registration hooks")
    impl.function(*[kwargs[arg] for arg in impl.argnames])


def _check_name(kind: str, name: object, owner: str) -> None:
    if kind == "frontend":
        if not isinstance(name, str) or not (_SUFFIX.fullmatch(name) or _SCHEME.fullmatch(name)):
            raise PluginError(
                f"plugin '{owner}': frontend scheme_or_suffix {name!r} is invalid "
                "(use a suffix such as '.onnx' or a scheme such as 'hf:')"
            )
    elif not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PluginError(f"plugin '{owner}': {kind} name {name!r} is invalid (use {_NAME_RULE})")


def _lookup(table: dict[str, Entry], kind: str, name: str) -> Entry:
    entry = table.get(name)
    if entry is None:
        close = close_names(name, table)
        hint = f": did you mean {', '.join(close)}?" if close else ""
        raise PluginError(f"unknown {kind} '{name}'{hint} (known: {_known(table)})")
    return entry


def close_names(name: str, table: dict[str, Any]) -> list[str]:
    """Registered names a mistyped ``name`` most likely meant: those it begins (``h100`` -> ``h100-sxm``, ...),
    else up to three that difflib finds close."""
    import difflib

    prefixed = sorted(n for n in table if n.startswith(name)) if name else []
    return prefixed or difflib.get_close_matches(name, sorted(table), n=3, cutoff=0.6)


def _known(table: dict[str, Entry]) -> str:
    return ", ".join(sorted(table)) or "none"


def _canonical(project: str) -> str:
    return re.sub(r"[-_.]+", "-", project).lower()


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _load_failure(name: str, exc: BaseException) -> str:
    return f"plugin '{name}' failed to load: {_one_line(exc)}"


def _hook_failure(name: str, hook_name: str, exc: BaseException) -> str:
    return f"plugin '{name}' failed in {hook_name}: {_one_line(exc)}"
