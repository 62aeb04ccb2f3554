"""Pre-commit budgets: fail when a model's simulated step time, memory or MFU breaks a budget.

Budgets live in ``pyproject.toml`` (the schema, with every key: docs/check.md)::

    [tool.echosim]
    backend = "h100-sxm"

    [[tool.echosim.check]]
    model = "llama3-8b"              # or any model spec echosim compiles
    devices = 8
    tp = 2                           # dp is derived: devices / (tp*pp*cp) = 4
    zero = 1                         # optimizer state sharded over dp
    global_batch = 64
    max_step_time_s = 7.5
    max_memory_gib = 75
    min_mfu = 0.5

Every key but the budgets, ``name`` and ``files`` is a ``compile`` option (``_`` for ``-``);
keys in ``[tool.echosim]`` itself apply to every entry. A misspelt key or a value of the wrong
type is one line naming the key and its line. Each entry's result is printed even when another
one errors; a result is cached under the content of what produced it (the entry, the model's
files, echosim's code and the versions of what captures models), so an unchanged entry
compiles nothing. With a baseline (``--update-baseline`` writes it; commit it), a step time or
memory that grows, or an MFU that drops, by more than ``tolerance`` fails too.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError

BUDGETS = {
    "max_step_time_s": "fail when the step time is above this many seconds",
    "max_likely_step_time_s": "fail when the long end of the likely step (the step time over echosim's low-end "
    "error on published runs like this one: docs/accuracy.md) is above this many seconds",
    "max_memory_gib": "fail when a pipeline stage's peak memory per device is above this many GiB",
    "min_mfu": "fail when the MFU (0..1) is below this",
}
ENTRY_KEYS = {
    "model": "what to compile: a zoo name, path/to/model.py:factory, hf:config.json or model.onnx "
    "(required unless 'from' is given)",
    "from": "a framework's own config, FRAMEWORK:FILE relative to the config (docs/configs.md); the entry's "
    "other keys override it",
    "name": "the entry's name in the output and the baseline (default: the model)",
    "files": "globs, relative to the config, of further files the model depends on (for --changed-only and the cache)",
}
CLUSTER_KEYS = {
    "backend": "hardware backend (echosim backends)",
    "devices": "number of devices (dp is derived from it)",
    "devices_per_node": "devices per node (default: the backend's)",
    "calibration": "a calibration from echosim calibrate",
}
SECTION_KEYS = {
    "baseline": "path of the baseline file, relative to the config (default: echosim-baseline.json)",
    "tolerance": "how much worse than the baseline a result may be, as a fraction (default: 0.05)",
}
DEFAULT_BASELINE = "echosim-baseline.json"
DEFAULT_TOLERANCE = 0.05
CACHE_FORMAT = 1
_PACKAGE = Path(__file__).resolve().parent
_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list of strings"}


@dataclass(frozen=True)
class Outcome:
    """One entry's result: figures and broken budgets, or the error that stopped it, or why it did not run."""

    name: str
    model: str
    step_time_s: float | None = None
    memory_gib: float | None = None
    mfu: float | None = None
    failures: tuple[str, ...] = ()
    error: str = ""
    skipped: str = ""
    cached: bool = False

    def line(self) -> str:
        if self.error:
            return f"{self.name}: ERROR: {self.error}"
        if self.skipped:
            return f"{self.name}: not run ({self.skipped})"
        status = "ok" if not self.failures else "FAIL: " + "; ".join(self.failures)
        cached = " (cached)" if self.cached else ""
        return (
            f"{self.name}: {_fmt_s(self.step_time_s or 0.0)}, {self.memory_gib:.1f} GiB, "
            f"MFU {(self.mfu or 0) * 100:.1f}%{cached} - {status}"
        )


def _fmt_s(seconds: float) -> str:
    return f"{seconds:.3f} s" if seconds >= 0.1 else f"{seconds * 1e3:.3f} ms"


@dataclass
class Config:
    path: Path
    defaults: dict[str, Any]
    entries: list[dict[str, Any]]
    baseline: Path
    tolerance: float
    names: list[str] = field(default_factory=list)


def _plan_types() -> dict[str, type]:
    from echosim.plan import Plan

    types: dict[str, type] = {}
    for f in fields(Plan):
        default = getattr(Plan(), f.name)
        types[f.name] = list if isinstance(default, tuple) else type(default)
    return types


def key_types() -> dict[str, type]:
    """Every key an entry may hold, with the TOML type it takes."""
    types = {"model": str, "from": str, "name": str, "files": list}
    types.update({"backend": str, "devices": int, "devices_per_node": int, "calibration": str})
    types.update(_plan_types())
    types.update(dict.fromkeys(BUDGETS, float))
    types.pop("overlap_dp", None)  # no compile flag: the command line always overlaps the reduction
    return types


def schema_text() -> str:
    """The keys, as ``check --help`` and docs/check.md list them."""
    plan = sorted(k for k in key_types() if k not in ENTRY_KEYS and k not in CLUSTER_KEYS and k not in BUDGETS)
    lines = ["[tool.echosim] (applies to every entry): any entry key but model/name/files, and"]
    lines += [f"  {k}: {v}" for k, v in SECTION_KEYS.items()]
    lines.append("[[tool.echosim.check]] (one table per model):")
    lines += [f"  {k}: {v}" for k, v in {**ENTRY_KEYS, **BUDGETS, **CLUSTER_KEYS}.items()]
    import textwrap

    lines += textwrap.wrap("and the compile options: " + ", ".join(plan), 96, initial_indent="  ",
                           subsequent_indent="    ")  # fmt: skip
    return "\n".join(lines)


def _line_of(text: str, table: str, index: int, key: str | None) -> int:
    """The line of ``key`` in the ``index``-th ``[table]``/``[[table]]`` of the TOML text (else the header's)."""
    header = re.compile(r"^\s*\[\[?\s*" + re.escape(table) + r"\s*\]\]?\s*(#.*)?$")
    any_header = re.compile(r"^\s*\[")
    assign = re.compile(r"^\s*[\"']?" + re.escape(key or "\0") + r"[\"']?\s*=")
    seen, start = -1, 0
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        if header.match(line):
            seen += 1
            if seen == index:
                start = number
                break
    if not start:
        return 1
    for number in range(start + 1, len(lines) + 1):
        line = lines[number - 1]
        if any_header.match(line):
            break
        if key and assign.match(line):
            return number
    return start


def load_config(path: Path) -> Config:
    """Read and validate ``[tool.echosim]``: the first problem is one line naming its key and line."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise EchosimError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EchosimError(f"{path}: not valid TOML: {exc}") from None
    tool = data.get("tool", {})
    section = tool.get("echosim", {}) if isinstance(tool, dict) else {}
    if not isinstance(section, dict):
        raise EchosimError(f"{path}: [tool.echosim] must be a table, got {type(section).__name__}")
    checks = section.get("check", [])
    if not isinstance(checks, list):
        raise EchosimError(f"{path}: 'check' must be an array of tables ([[tool.echosim.check]])")
    if not checks:
        raise EchosimError(f"{path}: no [[tool.echosim.check]] entries (see docs/check.md or `echosim check --help`)")
    types = key_types()

    def bad(table: str, index: int, key: str | None, what: str) -> EchosimError:
        return EchosimError(f"{path}:{_line_of(text, table, index, key)}: {what}")

    defaults = {k: v for k, v in section.items() if k != "check"}
    for key, value in defaults.items():
        if key in SECTION_KEYS:
            want: type = str if key == "baseline" else float
        elif key in types and key not in ENTRY_KEYS:
            want = types[key]
        else:
            known = ", ".join([*SECTION_KEYS, *sorted(k for k in types if k not in ENTRY_KEYS)])
            raise bad("tool.echosim", 0, key, f"[tool.echosim]: unknown key {key!r} (known: {known})")
        _check_type(value, want, lambda what, key=key: bad("tool.echosim", 0, key, f"[tool.echosim] {key}: {what}"))
    names: list[str] = []
    for i, entry in enumerate(checks):
        where = f"[[tool.echosim.check]] #{i + 1}"
        if not isinstance(entry, dict):
            raise bad("tool.echosim.check", i, None, f"{where}: expected a table")
        for key, value in entry.items():
            if key not in types:
                close = _close(key, types)
                raise bad("tool.echosim.check", i, key, f"{where}: unknown key {key!r}{close} (see docs/check.md)")
            _check_type(value, types[key], lambda what, key=key, i=i: bad(
                "tool.echosim.check", i, key, f"[[tool.echosim.check]] #{i + 1} {key}: {what}"))  # fmt: skip
        if not entry.get("model") and not entry.get("from"):
            raise bad("tool.echosim.check", i, None, f"{where}: 'model' (or 'from', a framework config) is required")
        name = str(entry.get("name") or entry.get("model") or entry["from"])
        if name in names:
            raise bad("tool.echosim.check", i, "name" if "name" in entry else "model",
                      f"{where}: a second entry named {name!r}: give each a distinct 'name'")  # fmt: skip
        names.append(name)
    baseline = path.parent / str(defaults.pop("baseline", DEFAULT_BASELINE))
    tolerance = float(defaults.pop("tolerance", DEFAULT_TOLERANCE))
    if tolerance < 0:
        raise bad("tool.echosim", 0, "tolerance", f"[tool.echosim] tolerance: must be 0 or more, got {tolerance}")
    return Config(path, defaults, checks, baseline, tolerance, names)


def _close(key: str, types: dict[str, type]) -> str:
    import difflib

    match = difflib.get_close_matches(key, list(types), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _check_type(value: Any, want: type, bad: Any) -> None:
    ok = (
        (want is bool and isinstance(value, bool))
        or (want is int and isinstance(value, int) and not isinstance(value, bool))
        or (want is float and isinstance(value, (int, float)) and not isinstance(value, bool))
        or (want is str and isinstance(value, str))
        or (want is list and isinstance(value, list) and all(isinstance(v, str) for v in value))
    )
    if not ok:
        raise bad(f"expected {_TYPE_NAMES[want]}, got {value!r}")


# ---- running one entry ------------------------------------------------------------------------


def model_files(model: str, root: Path) -> list[Path]:
    """The files a model spec reads (a .py, config.json or .onnx file), relative to ``root``; none for a zoo name."""
    spec = model.removeprefix("hf:")
    candidate = spec.rsplit(":", 1)[0] if spec.count(":") and not re.match(r"^[A-Za-z]:[\\/]", spec) else spec
    path = Path(candidate)
    path = path if path.is_absolute() else root / path
    return [path] if path.is_file() else []


def entry_files(entry: dict[str, Any], root: Path) -> list[Path]:
    found = model_files(str(entry["model"]), root) if entry.get("model") else []
    for file in str(entry.get("from", "")).partition(":")[2].split(","):  # a framework config (maxtext: a,b)
        path = Path(file.split("=")[0].strip()) if file.strip() else None
        if path is not None:
            path = path if path.is_absolute() else root / path
            found += [path] if path.is_file() else []
    for pattern in entry.get("files", []):
        found += sorted(p for p in root.glob(pattern) if p.is_file())
    return found


def _resolved(model: str, root: Path) -> str:
    """The model spec with its file, relative to the config's folder, made absolute."""
    files = model_files(model, root)
    if not files or Path(model.removeprefix("hf:").split(":")[0]).is_absolute():
        return model
    hf = "hf:" if model.startswith("hf:") else ""
    spec = model.removeprefix("hf:")
    rest = spec[len(spec.rsplit(":", 1)[0]) :] if spec.count(":") else ""
    return f"{hf}{files[0]}{rest}"


def run_check(entry: dict[str, Any], defaults: dict[str, Any], index: int, root: Path = Path()) -> Outcome:
    """Compile one entry and hold it to its budgets (raises :class:`EchosimError` on bad input).

    A model's path is relative to ``root``, the config's folder.
    """
    from echosim.compiler import lower
    from echosim.plan import plan_from_options

    merged = {**defaults, **entry}
    name = str(merged.pop("name", None) or merged.get("model") or merged.get("from"))
    model = merged.pop("model", None)
    source = merged.pop("from", None)
    merged.pop("files", None)
    budgets = {k: merged.pop(k) for k in BUDGETS if k in merged}
    if "passes" in merged:
        merged["passes"] = tuple(merged["passes"])
    if "splash_blocks" in merged:  # a list of six sizes
        merged["splash_blocks"] = tuple(merged["splash_blocks"])
    if source:  # a framework's own config; the entry's other keys override it, as flags beside --from do
        from echosim.configs import read_source, resolve

        framework, _, file = str(source).partition(":")
        if file and not Path(file).is_absolute() and (root / file).is_file():
            source = f"{framework}:{root / file}"
        chosen, opts = resolve(read_source(str(source)), merged, model)
        chosen, plan, cluster = plan_from_options(chosen, opts)
        model = model or str(source)
    else:
        chosen = _resolved(str(model), root)
        _, plan, cluster = plan_from_options(str(model), merged)
    compiled = lower(chosen, plan, cluster)
    report = compiled.report
    memory = max(int(m["peak"]) for m in report.memory) / 2**30
    failures = []
    if "max_step_time_s" in budgets and report.step_time_s > budgets["max_step_time_s"]:
        failures.append(f"step time {_fmt_s(report.step_time_s)} > max_step_time_s = {budgets['max_step_time_s']}")
    if "max_likely_step_time_s" in budgets:
        failures += _likely_step_failures(compiled, budgets["max_likely_step_time_s"])
    if "max_memory_gib" in budgets and memory > budgets["max_memory_gib"]:
        failures.append(f"memory {memory:.1f} GiB > max_memory_gib = {budgets['max_memory_gib']}{_own(report)}")
    if "min_mfu" in budgets and report.mfu < budgets["min_mfu"]:
        failures.append(f"MFU {report.mfu:.3f} < min_mfu = {budgets['min_mfu']}")
    if not report.fits:
        from echosim.terminal import does_not_fit

        failures.append(does_not_fit(report) + _own(report))
    # an offload whose hosts cannot hold its state does not run either, however little the device keeps
    from echosim.layout import HOST_OVERFLOW

    failures += [w for w in report.warnings if w.startswith(HOST_OVERFLOW)]
    return Outcome(name, model, report.step_time_s, memory, report.mfu, tuple(failures))


def _own(report: Any) -> str:
    """What a memory failure adds for a model that checkpoints its own blocks in code and an entry without
    recompute: the check costs every activation kept, which the model's training run does not."""
    from echosim.compiler import OWN_CHECKPOINTS

    if any(w.startswith(OWN_CHECKPOINTS) for w in report.warnings):
        return ' (the model checkpoints its own blocks with torch.utils.checkpoint: recompute = "full" costs that)'
    return ""


def _likely_step_failures(compiled: Any, budget: float) -> list[str]:
    """The likely-step budget: the long end of the accuracy band's range; an entry with no band is in error."""
    from echosim.bands import accuracy_section, group_label

    section = accuracy_section(compiled)
    band = section["band"]
    if band is None:
        raise EchosimError(f"max_likely_step_time_s needs an accuracy band and there is none: {section['reason']}")
    longest = band["step_time_s_range"][1]
    if longest <= budget:
        return []
    return [
        f"likely step up to {_fmt_s(longest)} > max_likely_step_time_s = {budget} (echosim's error on "
        f"{band['runs']} published runs like this one, {group_label(band['group'])}, reaches "
        f"{band['error_low'] * 100:+.1f}%)"
    ]


def against_baseline(outcome: Outcome, baseline: dict[str, Any], tolerance: float) -> Outcome:
    """``outcome`` with a failure for each figure worse than its baseline by more than ``tolerance``."""
    base = baseline.get(outcome.name)
    if not base or outcome.error or outcome.skipped:
        return outcome
    extra = []
    pct = f"tolerance {tolerance:.0%}"
    for key, label, unit in (("step_time_s", "step time", " s"), ("memory_gib", "memory", " GiB")):
        was, now = base.get(key), getattr(outcome, key)
        if was and now is not None and now > was * (1 + tolerance):
            now_s, was_s = (_fmt_s(now), _fmt_s(was)) if unit == " s" else (f"{now:.1f}{unit}", f"{was:.1f}{unit}")
            extra.append(f"{label} {now_s} is {now / was - 1:.1%} over the baseline {was_s} ({pct})")
    was, now = base.get("mfu"), outcome.mfu
    if was and now is not None and now < was * (1 - tolerance):
        extra.append(f"MFU {now:.3f} is {1 - now / was:.1%} under the baseline {was:.3f} ({pct})")
    return Outcome(**{**asdict(outcome), "failures": (*outcome.failures, *extra)}) if extra else outcome


# ---- the result cache -----------------------------------------------------------------------


def _cache_dir() -> Path | None:
    if os.environ.get("ECHOSIM_NO_CACHE", "") not in ("", "0"):
        return None
    explicit = os.environ.get("ECHOSIM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "check"
    import platformdirs

    return Path(platformdirs.user_cache_dir("echosim")) / "check"


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """echosim's code and data, the versions of what captures models, and the installed echosim plugins."""
    import importlib.metadata

    digest = hashlib.sha256()
    for path in sorted(p for p in _PACKAGE.rglob("*") if p.is_file() and p.suffix in (".py", ".json", ".csv")):
        digest.update(str(path.relative_to(_PACKAGE)).encode())
        digest.update(path.read_bytes())
    for dist in ("torch", "transformers", "onnx"):
        try:
            digest.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{dist}=absent".encode())
    for ep in sorted(importlib.metadata.entry_points(group="echosim"), key=lambda e: (e.name, e.value)):
        version = ep.dist.version if ep.dist else ""
        digest.update(f"{ep.name}={ep.value}@{version}".encode())
    digest.update(f"{sys.version_info[:2]}".encode())
    return digest.hexdigest()


def cache_key(entry: dict[str, Any], defaults: dict[str, Any], root: Path) -> str:
    """A hash of everything one entry's result depends on (the calibration database's bytes too)."""
    files = {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in entry_files(entry, root)}
    calibration = os.environ.get("ECHOSIM_CALIBRATION", "")
    if calibration and Path(calibration).is_file():
        files["$ECHOSIM_CALIBRATION"] = hashlib.sha256(Path(calibration).read_bytes()).hexdigest()
    identity = {
        "format": CACHE_FORMAT,
        "code": _code_fingerprint(),
        "entry": {**defaults, **entry},
        "files": files,
        "cwd": str(root.resolve()),
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def cached_run(entry: dict[str, Any], defaults: dict[str, Any], index: int, root: Path) -> Outcome:
    """:func:`run_check`, answered from the cache when nothing it depends on changed."""
    root_dir = _cache_dir()
    key = cache_key(entry, defaults, root) if root_dir else ""
    if root_dir:
        try:
            data = json.loads((root_dir / f"{key}.json").read_text(encoding="utf-8"))
            return Outcome(**{**data, "failures": tuple(data["failures"]), "cached": True})
        except (OSError, ValueError, TypeError, KeyError):
            pass
    outcome = run_check(entry, defaults, index, root)
    if root_dir:
        try:
            root_dir.mkdir(parents=True, exist_ok=True)
            tmp = root_dir / f"{key}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(asdict(outcome), sort_keys=True), encoding="utf-8")
            tmp.replace(root_dir / f"{key}.json")
        except OSError:
            pass  # a read-only cache costs time, never a result
    return outcome


def changed_entries(config: Config, changed: list[str]) -> list[bool]:
    """Which entries read one of the ``changed`` files (the config or the baseline changing selects them all)."""
    root = config.path.parent
    given = {Path(c).resolve() for c in changed}
    if config.path.resolve() in given or config.baseline.resolve() in given:
        return [True] * len(config.entries)
    out = []
    for entry in config.entries:
        files = {p.resolve() for p in entry_files({**config.defaults, **entry}, root)}
        patterns = entry.get("files", [])
        matched = bool(files & given) or any(
            fnmatch.fnmatch(os.path.relpath(c, root), pat) for c in changed for pat in patterns
        )
        out.append(matched)
    return out


def run_all(config: Config, changed: list[str] | None, use_cache: bool) -> list[Outcome]:
    """Every entry's outcome in order; an entry that errors is one outcome, the others still run."""
    root = config.path.parent
    selected = changed_entries(config, changed) if changed is not None else [True] * len(config.entries)
    outcomes = []
    for i, (entry, name, run) in enumerate(zip(config.entries, config.names, selected, strict=True)):
        if not run:
            outcomes.append(
                Outcome(name, str(entry.get("model") or entry.get("from")), skipped="none of its files changed")
            )
            continue
        try:
            run_one = cached_run if use_cache else run_check
            outcome = run_one(entry, config.defaults, i, root)
        except EchosimError as exc:
            message = " ".join(str(exc).split())
            if os.environ.get("PRE_COMMIT") and "not installed" in message:
                message += " (under pre-commit: list it in the hook's additional_dependencies; see docs/check.md)"
            outcome = Outcome(name, str(entry.get("model") or entry.get("from")), error=message)
        outcomes.append(outcome)
    return outcomes


def read_baseline(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return dict(data["entries"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EchosimError(f"{path}: not an echosim baseline ({exc}); rewrite it with --update-baseline") from None


def write_baseline(path: Path, outcomes: list[Outcome], old: dict[str, Any]) -> None:
    """Keep old entries that did not run; write the new figures of those that did (sorted, stable)."""
    entries = dict(old)
    for o in outcomes:
        if not o.error and not o.skipped:
            figures = {"step_time_s": o.step_time_s, "memory_gib": o.memory_gib, "mfu": o.mfu}
            entries[o.name] = {"model": o.model, **{k: float(f"{v:.6g}") for k, v in figures.items()}}
    text = json.dumps({"format": 1, "entries": entries}, indent=2, sort_keys=True) + "\n"
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise EchosimError(f"{path}: cannot write the baseline ({exc.strerror or exc})") from None
