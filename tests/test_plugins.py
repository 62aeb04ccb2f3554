"""The plugin contract: what plugins can register, and how the core reports their mistakes."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import subprocess
import sys
import textwrap
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import pytest

from echosim.errors import EchosimError
from echosim.plugins import PluginError, Registry, get_registry, hookimpl, hookspecs, load_registry, manager
from echosim.timeline.schedule import Schedule, gpipe

SCHEDULE = Schedule("test-gpipe", gpipe)

HOOKS = {
    "register_backends",
    "register_models",
    "register_frontends",
    "register_passes",
    "register_schedules",
    "register_commands",
}


def make_plugin(name: str, **hooks: Callable[..., None]) -> object:
    """An in-test plugin called ``name`` implementing ``hooks``."""
    return types.SimpleNamespace(__name__=name, **{hook: hookimpl(fn) for hook, fn in hooks.items()})


def backends_plugin(name: str, *backends: str) -> object:
    def register_backends(register: Callable[..., None]) -> None:
        for backend in backends:
            register(backend, object)

    return make_plugin(name, register_backends=register_backends)


def load(*plugins: object) -> Registry:
    return load_registry(include_entrypoints=False, extra_plugins=plugins)


@pytest.fixture
def no_builtins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Isolate from echosim's own plugins, whose names would otherwise mix into the assertions."""
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", [])


@pytest.fixture
def write_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str, str], None]]:
    """Write an importable module into a temporary directory on sys.path; forget it afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        monkeypatch.delitem(sys.modules, name, raising=False)

    yield write
    for path in tmp_path.glob("*.py"):
        sys.modules.pop(path.stem, None)


# -- hookspecs ------------------------------------------------------------------------------------


def hookspec_functions() -> dict[str, Callable[..., None]]:
    return {
        name: fn
        for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
        if hasattr(fn, f"{hookspecs.PROJECT_NAME}_spec")
    }


def test_hookspecs_are_the_documented_set() -> None:
    assert set(hookspec_functions()) == HOOKS


@pytest.mark.parametrize("name", sorted(HOOKS))
def test_every_hookspec_is_typed_and_says_when_it_is_called(name: str) -> None:
    fn = hookspec_functions()[name]
    signature = inspect.signature(fn)
    assert all(p.annotation is not inspect.Parameter.empty for p in signature.parameters.values())
    assert signature.return_annotation == "None"
    doc = inspect.getdoc(fn) or ""
    assert "Called once" in doc
    assert ":param" in doc


def test_importing_the_plugin_package_loads_no_plugin_and_nothing_heavy() -> None:
    code = (
        "import sys, echosim.plugins\n"
        "heavy = ('click', 'torch', 'onnx', 'networkx', 'rich', 'importlib.metadata')\n"
        "loaded = [m for m in sys.modules if m.startswith(heavy) or m.endswith('.plugin')]\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# -- registering ----------------------------------------------------------------------------------


def test_each_kind_is_registered_with_its_owner(no_builtins: None) -> None:
    class Plan:
        pass

    def register_models(register: Callable[..., None]) -> None:
        register("tiny", dict, description="a toy")

    registry = load(
        backends_plugin("vendor", "gpu-x"),
        make_plugin("zoo", register_models=register_models),
        make_plugin("fmt", register_frontends=lambda register: register(".onnx", str)),
        make_plugin("opt", register_passes=lambda register: register("tp", Plan)),
        make_plugin("sched", register_schedules=lambda register: register("1f1b", SCHEDULE)),
    )

    assert registry.errors == []
    assert registry.backends["gpu-x"].owner == "vendor"
    assert registry.backend("gpu-x") is object
    assert registry.models["tiny"].description == "a toy"
    assert registry.model("tiny") is dict
    assert registry.frontends[".onnx"].owner == "fmt"
    assert registry.pass_class("tp") is Plan
    assert registry.schedule("1f1b") is SCHEDULE


def test_register_accepts_the_documented_keyword_names(no_builtins: None) -> None:
    registry = load(
        make_plugin(
            "kw",
            register_backends=lambda register: register(name="b", factory=object),
            register_models=lambda register: register(name="m", factory=dict, description="d"),
            register_frontends=lambda register: register(scheme_or_suffix="hf:", loader=str),
            register_passes=lambda register: register(name="p", pass_cls=int),
            register_schedules=lambda register: register(name="s", schedule=SCHEDULE),
        )
    )
    assert registry.errors == []
    tables = {kind: list(getattr(registry, kind)) for kind in ("backends", "models", "frontends", "passes")}
    assert tables == {"backends": ["b"], "models": ["m"], "frontends": ["hf:"], "passes": ["p"]}
    assert list(registry.schedules) == ["s"]


def test_a_duplicate_name_is_skipped_with_a_warning_naming_both_owners(no_builtins: None) -> None:
    registry = load(backends_plugin("first", "gpu-x"), backends_plugin("second", "gpu-y", "gpu-x"))
    assert registry.errors == [
        "backend 'gpu-x' is registered by both 'first' and 'second'; the one from 'second' is skipped"
    ]
    assert {n: e.owner for n, e in registry.backends.items()} == {"gpu-x": "first", "gpu-y": "second"}


def test_a_name_registered_twice_by_one_plugin_is_reported_and_drops_the_hook(no_builtins: None) -> None:
    registry = load(backends_plugin("twice", "gpu-x", "gpu-x"), backends_plugin("other", "gpu-y"))
    assert registry.errors == ["backend 'gpu-x' is registered twice by 'twice'"]
    assert list(registry.backends) == ["gpu-y"]


def test_plugin_errors_are_echosim_errors_so_the_cli_prints_one_line() -> None:
    assert issubclass(PluginError, EchosimError)


def test_a_violation_is_reported_even_if_the_plugin_swallows_it(no_builtins: None) -> None:
    def register_backends(register: Callable[..., None]) -> None:
        register("fine", object)
        with contextlib.suppress(PluginError):
            register("BAD NAME", object)

    registry = load(backends_plugin("first", "gpu-x"), make_plugin("sneaky", register_backends=register_backends))
    assert len(registry.errors) == 1 and registry.errors[0].startswith("plugin 'sneaky': backend name 'BAD NAME'")
    assert list(registry.backends) == ["gpu-x"]  # nothing of the violating hook is kept


def test_a_plugin_that_raises_is_reported_by_name_and_the_others_still_register(no_builtins: None) -> None:
    def register_backends(register: Callable[..., None]) -> None:
        register("half-done", object)
        raise ValueError("boom")

    registry = load(
        backends_plugin("before", "gpu-a"),
        make_plugin("broken", register_backends=register_backends),
        backends_plugin("after", "gpu-b"),
    )

    assert registry.errors == ["plugin 'broken' failed in register_backends: ValueError: boom"]
    assert sorted(registry.backends) == ["gpu-a", "gpu-b"]  # nothing half-registered is kept


def test_a_plugin_failing_one_hook_keeps_its_other_hooks(no_builtins: None) -> None:
    def register_models(register: Callable[..., None]) -> None:
        raise RuntimeError("no models today")

    plugin = make_plugin(
        "partial", register_backends=lambda register: register("gpu", object), register_models=register_models
    )
    registry = load(plugin)
    assert list(registry.backends) == ["gpu"]
    assert registry.errors == ["plugin 'partial' failed in register_models: RuntimeError: no models today"]


@pytest.mark.parametrize("bad", ["GPU", "", "a b", "-x", "a/b", "h100:", 3, None])
def test_a_bad_name_is_rejected_naming_the_field_and_the_plugin(no_builtins: None, bad: object) -> None:
    registry = load(make_plugin("bad", register_backends=lambda register: register(bad, object)))
    assert len(registry.errors) == 1 and not registry.backends
    assert re.match(r"^plugin 'bad': backend name .* is invalid \(use lowercase", registry.errors[0])


@pytest.mark.parametrize("good", ["a100-80gb", "tpu.v5e", "my_gpu", "1f1b"])
def test_good_names_are_accepted(no_builtins: None, good: str) -> None:
    assert list(load(backends_plugin("good", good)).backends) == [good]


@pytest.mark.parametrize("bad", ["onnx", ".ONNX", "HF:", "hf", ".", ":"])
def test_a_bad_frontend_key_is_rejected(no_builtins: None, bad: str) -> None:
    registry = load(make_plugin("fmt", register_frontends=lambda register: register(bad, str)))
    assert len(registry.errors) == 1 and not registry.frontends
    assert re.match(r"^plugin 'fmt': frontend scheme_or_suffix .* is invalid", registry.errors[0])


@pytest.mark.parametrize(
    ("hook", "args", "message"),
    [
        ("register_backends", ("b", 3), "backend 'b' factory must be callable, got int"),
        ("register_models", ("m", "dict"), "model 'm' factory must be callable, got str"),
        ("register_models", ("m", dict, 42), "model 'm' description must be a string"),
        ("register_frontends", (".onnx", None), "frontend '.onnx' loader must be callable, got NoneType"),
        ("register_passes", ("p", object()), "pass 'p' pass_cls must be a class, got object"),
        ("register_schedules", ("s", "gpipe"), "schedule 's' schedule must be an object with orders\\(\\), got str"),
    ],
)
def test_a_bad_value_is_rejected_naming_the_field_and_the_plugin(
    no_builtins: None, hook: str, args: tuple[object, ...], message: str
) -> None:
    registry = load(make_plugin("bad", **{hook: lambda register: register(*args)}))
    assert len(registry.errors) == 1 and re.match(f"^plugin 'bad': {message}", registry.errors[0])


# -- lookups --------------------------------------------------------------------------------------


def test_a_mistyped_name_is_offered_the_names_it_likely_meant(no_builtins: None) -> None:
    registry = load(backends_plugin("vendor", "h100-sxm", "h100-96gb", "h200", "tpu-v5p"))
    with pytest.raises(PluginError, match=r"^unknown backend 'h100': did you mean h100-96gb, h100-sxm\? \(known: "):
        registry.backend("h100")  # the names it begins
    with pytest.raises(PluginError, match=r"^unknown backend 'tpu-v6p': did you mean tpu-v5p\? "):
        registry.backend("tpu-v6p")  # else difflib's close ones
    with pytest.raises(PluginError, match=r"^unknown backend 'v100' \(known: "):
        registry.backend("v100")  # nothing close: no guess


def test_unknown_names_list_the_known_ones(no_builtins: None) -> None:
    registry = load(backends_plugin("vendor", "c", "a", "b"))
    with pytest.raises(PluginError, match=r"^unknown backend 'x' \(known: a, b, c\)$"):
        registry.backend("x")
    with pytest.raises(PluginError, match=r"^unknown model 'x' \(known: none\)$"):
        registry.model("x")
    with pytest.raises(PluginError, match=r"^unknown pass 'x'"):
        registry.pass_class("x")
    with pytest.raises(PluginError, match=r"^unknown schedule 'x'"):
        registry.schedule("x")


def test_frontends_match_by_scheme_first_then_suffix_and_the_longest_key_wins(no_builtins: None) -> None:
    def json_loader(source: str) -> object: ...
    def config_loader(source: str) -> object: ...
    def hf_loader(source: str) -> object: ...

    def register_frontends(register: Callable[..., None]) -> None:
        register(".json", json_loader)
        register(".config.json", config_loader)
        register("hf:", hf_loader)

    registry = load(make_plugin("fmt", register_frontends=register_frontends))
    assert registry.frontend("model.JSON") is json_loader
    assert registry.frontend("llama.config.json") is config_loader
    assert registry.frontend("hf:meta-llama/Llama-3.1-8B.json") is hf_loader
    with pytest.raises(PluginError, match=r"^unknown frontend for 'x.onnx' \(known: .config.json, .json, hf:\)$"):
        registry.frontend("x.onnx")


# -- loading --------------------------------------------------------------------------------------


def test_every_call_builds_a_fresh_registry(no_builtins: None) -> None:
    assert list(load(backends_plugin("vendor", "gpu-x")).backends) == ["gpu-x"]
    assert load().backends == {}


def test_get_registry_loads_once_until_cleared() -> None:
    get_registry.cache_clear()
    try:
        first = get_registry()
        assert get_registry() is first
        get_registry.cache_clear()
        assert get_registry() is not first
    finally:
        get_registry.cache_clear()


def test_plugins_lists_name_version_and_hooks(no_builtins: None) -> None:
    registry = load(backends_plugin("vendor", "gpu-x"))
    [info] = registry.plugins()
    assert (info.name, info.version, info.hooks, info.distribution) == (
        "vendor",
        None,
        ("register_backends",),
        None,
    )


def test_a_hook_with_the_wrong_arguments_is_reported_and_not_loaded(no_builtins: None) -> None:
    registry = load(make_plugin("typo", register_backends=lambda register, extra: None))
    assert registry.plugins() == []
    [error] = registry.errors
    assert error.startswith("plugin 'typo' failed to load: PluginValidationError:")
    assert "\n" not in error


def test_a_misspelt_hook_is_reported(no_builtins: None) -> None:
    registry = load(make_plugin("typo", register_backend=lambda register: None))
    assert registry.errors == ["plugin 'typo' implements unknown hook 'register_backend'"]


def test_builtins_load_first_as_ordinary_plugins(
    monkeypatch: pytest.MonkeyPatch, write_module: Callable[[str, str], None]
) -> None:
    write_module(
        "echosim_test_builtin",
        """
        from echosim.plugins import hookimpl

        @hookimpl
        def register_backends(register):
            register("gpu-x", object)
        """,
    )
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", ["echosim_test_builtin"])

    from echosim import __version__

    registry = load(backends_plugin("vendor", "gpu-x"))
    assert registry.errors == [
        "backend 'gpu-x' is registered by both 'echosim_test_builtin' and 'vendor'; the one from 'vendor' is skipped"
    ]
    [info] = load().plugins()
    assert (info.name, info.version, info.distribution) == ("echosim_test_builtin", __version__, "echosim")


def test_a_builtin_that_does_not_exist_yet_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", ["echosim.no_such_module.plugin", "echosim.no_such_plugin"])
    registry = load()
    assert registry.plugins() == []
    assert registry.errors == []


def test_a_builtin_missing_a_dependency_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch, write_module: Callable[[str, str], None]
) -> None:
    write_module("echosim_test_needs_dep", "import echosim_no_such_dependency\n")
    monkeypatch.setattr(manager, "BUILTIN_PLUGINS", ["echosim_test_needs_dep"])
    with pytest.raises(ModuleNotFoundError, match="echosim_no_such_dependency"):
        load()


def write_distribution(root: Path, project: str, entry_points: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata sees it: a dist-info folder on sys.path."""
    dist_info = root / f"{project.replace('-', '_')}-1.2.3.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: 1.2.3\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (dist_info / "entry_points.txt").write_text(f"[echosim]\n{lines}")


def test_an_entry_point_plugin_that_raises_on_load_is_reported_by_name(
    no_builtins: None, tmp_path: Path, write_module: Callable[[str, str], None]
) -> None:
    write_module("echosim_test_boom", "raise ValueError('boom')\n")
    write_module(
        "echosim_test_ok",
        """
        from echosim.plugins import hookimpl

        @hookimpl
        def register_models(register):
            register("ok-model", dict)
        """,
    )
    write_distribution(tmp_path, "echosim-test-plugins", {"boom": "echosim_test_boom", "ok": "echosim_test_ok"})

    registry = load_registry()

    assert "plugin 'boom' failed to load: ValueError: boom" in registry.errors
    assert registry.models["ok-model"].owner == "ok"
    [info] = [info for info in registry.plugins() if info.name == "ok"]
    assert (info.version, info.hooks, info.distribution) == (
        "1.2.3",
        ("register_models",),
        "echosim-test-plugins",
    )
    assert "boom" not in [info.name for info in registry.plugins()]
    assert load_registry(include_entrypoints=False).models == {}


@pytest.mark.parametrize(
    ("projects", "errors"),
    [
        (
            ("project-a", "project-b"),
            ["plugin 'same' from 'project-b' not loaded: the name is taken by 'project-a'"],
        ),
        (("project-a", "project_A"), []),  # one project seen twice on sys.path (say, a stale egg-info)
    ],
)
def test_a_plugin_name_claimed_by_two_projects_is_reported(
    no_builtins: None,
    tmp_path: Path,
    write_module: Callable[[str, str], None],
    monkeypatch: pytest.MonkeyPatch,
    projects: tuple[str, str],
    errors: list[str],
) -> None:
    write_module("echosim_test_empty", "")
    for folder, project in zip("ab", projects, strict=True):
        (tmp_path / folder).mkdir()
        write_distribution(tmp_path / folder, project, {"same": "echosim_test_empty"})
    monkeypatch.setattr(sys, "path", [str(tmp_path / "a"), str(tmp_path / "b"), *sys.path])
    registry = load_registry()
    assert registry.errors == errors
    assert [info.distribution for info in registry.plugins() if info.name == "same"] == ["project-a"]


# -- commands -------------------------------------------------------------------------------------


def command(name: str) -> click.Command:
    return click.Command(name, callback=lambda: None)


def test_plugins_add_cli_commands(no_builtins: None) -> None:
    cli = click.Group("echosim", commands=[command("compile")])
    registry = load(make_plugin("extra", register_commands=lambda cli: cli.add_command(command("hello"))))
    registry.add_commands(cli)
    assert sorted(cli.commands) == ["compile", "hello"]


def test_a_command_clash_names_both_owners(no_builtins: None) -> None:
    cli = click.Group("echosim", commands=[command("compile")])
    registry = load(make_plugin("extra", register_commands=lambda cli: cli.add_command(command("compile"))))
    original = cli.commands["compile"]
    registry.add_commands(cli)
    assert registry.errors == [
        "command 'compile' is registered by both 'echosim' and 'extra'; the one from 'extra' is skipped"
    ]
    assert cli.commands["compile"] is original


def test_a_command_plugin_that_raises_is_reported_and_leaves_no_commands(no_builtins: None) -> None:
    def register_commands(cli: click.Group) -> None:
        cli.add_command(command("half"))
        raise RuntimeError("no")

    cli = click.Group("echosim", commands=[command("compile")])
    registry = load(make_plugin("broken", register_commands=register_commands))
    registry.add_commands(cli)
    assert list(cli.commands) == ["compile"]
    assert registry.errors == ["plugin 'broken' failed in register_commands: RuntimeError: no"]


# -- the installed example plugin -----------------------------------------------------------------


@pytest.mark.skipif(
    importlib.util.find_spec("echosim_plugin_demo") is None,
    reason="pip install -e examples/echosim-plugin-demo",
)
def test_the_installed_demo_plugin_is_found_through_its_entry_point() -> None:
    from echosim.backends.base import Backend

    registry = load_registry()

    assert registry.models["demo-tiny"].owner == "demo"
    assert registry.backends["demo-null"].owner == "demo"
    assert registry.model("demo-tiny")(layers=3)["layers"] == 3
    backend = registry.backend("demo-null")()
    assert isinstance(backend, Backend)
    assert backend.name == "demo-null"
    [info] = [info for info in registry.plugins() if info.name == "demo"]
    assert info.distribution == "echosim-plugin-demo"
    assert info.hooks == ("register_backends", "register_models")
    assert not [error for error in registry.errors if "'demo'" in error]


def test_the_backend_listing_names_a_backend_whose_factory_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """`echosim backends` keeps its other rows and says in one warning line which backend failed and why."""
    from click.testing import CliRunner

    from echosim.cli import cli

    def broken() -> object:
        raise RuntimeError("vendor SDK\n not found")

    def register_backends(register: Callable[..., None]) -> None:
        register("gpu-ok", object)
        register("gpu-broken", broken)

    registry = load(make_plugin("vendor", register_backends=register_backends))
    monkeypatch.setattr("echosim.plugins.get_registry", lambda: registry)
    result = CliRunner().invoke(cli, ["backends"])
    assert result.exit_code == 0
    assert "gpu-ok" in result.stdout and "gpu-broken" in result.stdout
    assert result.stderr == (
        "warning: backend 'gpu-broken' of plugin 'vendor' could not be built (RuntimeError: vendor SDK not found)\n"
    )
