"""Captured IR kept between runs, so a repeated compile imports no torch.

An entry is the IR of one capture (graph, messages, parameter count) as JSON data
(:mod:`echosim.ir.serialize`: never pickle), under the user's cache directory
(``platformdirs``; ``$ECHOSIM_CACHE_DIR`` moves it, ``ECHOSIM_NO_CACHE=1`` turns it off).
Its key is a hash of what defines the capture:

* what the model is: a zoo entry's parameters, or the bytes of the ``.py`` file,
  ``config.json`` or ``.onnx`` file (and the source string, which names the graph);
* the capture spec (micro-batch, sequence, dtype);
* the versions of echosim and of the libraries that capture (torch; transformers for
  ``hf:``; onnx for ``.onnx``), and the content of echosim's frontend and IR code.

An entry also lists the other files its capture read (the modules a ``.py`` model
imported from outside the Python installation) with their hashes; a changed one
makes the entry stale. An entry that cannot be read, is of another format or another
key, or names a changed file is a miss, never an error: the model is captured again
and the entry rewritten. A ``.py`` model found in the cache is not executed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import astuple
from pathlib import Path
from typing import TYPE_CHECKING, Any

from echosim.frontend.messages import Note

if TYPE_CHECKING:
    from echosim.frontend.spec import CaptureSpec
    from echosim.ir.graph import Graph

#: Bump when what an entry holds changes meaning; older entries then miss.
ENTRY_FORMAT = 1
_PACKAGE = Path(__file__).resolve().parents[1]  # echosim/
_CODE = ("frontend", "ir")  # the code that decides what a capture gives


def cache_dir() -> Path | None:
    """Where entries live; ``None`` when caching is off."""
    if os.environ.get("ECHOSIM_NO_CACHE", "") not in ("", "0"):
        return None
    explicit = os.environ.get("ECHOSIM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser() / "capture"
    import platformdirs

    return Path(platformdirs.user_cache_dir("echosim")) / "capture"


def key_of(what: dict[str, Any], spec: CaptureSpec, libraries: tuple[str, ...]) -> str:
    """The hash of everything that defines one capture (see the module docstring)."""
    identity = {
        "entry_format": ENTRY_FORMAT,
        "echosim": _version("echosim"),
        "code": _code_fingerprint(),
        "python": list(sys.version_info[:2]),
        "libraries": {name: _version(name) for name in sorted(libraries)},
        "spec": list(astuple(spec)),
        "model": what,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def lookup(key: str) -> tuple[Graph, list[str], int] | None:
    """The capture stored under ``key``, or ``None`` (absent, unreadable, foreign or stale)."""
    from echosim.ir.serialize import GraphDataError, graph_from_data

    root = cache_dir()
    if root is None:
        return None
    try:
        entry = json.loads((root / f"{key}.json").read_text(encoding="utf-8"))
        if not isinstance(entry, dict) or entry.get("entry_format") != ENTRY_FORMAT or entry.get("key") != key:
            return None
        for path, digest in entry["depends"]:
            if file_digest(Path(path)) != digest:
                return None
        graph = graph_from_data(entry["graph"])
        messages = [Note(text) if kind == "note" else str(text) for kind, text in entry["messages"]]
        params = entry["params"]
        if not isinstance(params, int) or isinstance(params, bool) or not all(isinstance(m, str) for m in messages):
            return None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, GraphDataError):
        return None
    return graph, messages, params


def store(key: str, graph: Graph, messages: list[str], params: int, depends: Sequence[Path] = ()) -> None:
    """Write an entry atomically; a cache that cannot be written is skipped, never an error."""
    from echosim.ir.serialize import graph_to_data

    root = cache_dir()
    if root is None:
        return
    try:
        entry = {
            "entry_format": ENTRY_FORMAT,
            "key": key,
            "depends": [[str(p), file_digest(p)] for p in depends],
            "graph": graph_to_data(graph),
            "messages": [["note" if isinstance(m, Note) else "warning", str(m)] for m in messages],
            "params": int(params),
        }
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f"{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(entry, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, root / f"{key}.json")
    except (OSError, ValueError, TypeError):
        return


def imported_files(before: set[str]) -> list[Path]:
    """Source files of the modules imported since ``before`` from outside the Python installation and echosim."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out = []
    for name in sorted(set(sys.modules) - before):
        file = getattr(sys.modules.get(name), "__file__", None)
        if not file or not file.endswith(".py"):
            continue
        path = Path(file).resolve()
        if path.is_file() and not any(path.is_relative_to(p) for p in (*prefixes, _PACKAGE)):
            out.append(path)
    return out


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    digest = hashlib.sha256()
    for folder in _CODE:
        for path in sorted((_PACKAGE / folder).rglob("*.py")):
            digest.update(str(path.relative_to(_PACKAGE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=8)
def _version(distribution: str) -> str:
    from echosim import dists  # not importlib.metadata: see echosim.dists

    return dists.version(distribution) or "absent"
