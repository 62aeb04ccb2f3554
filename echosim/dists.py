"""Installed distributions read from their ``.dist-info`` folders, without ``importlib.metadata``.

A warm ``echosim compile`` needs two facts about installed packages: the versions that key the
capture cache (torch, transformers, ...) and the ``echosim`` entry points of plugins. Importing
``importlib.metadata`` for them pulls in the e-mail parser, ``zipfile`` and ``csv`` (about 0.07 s
of CPU, a tenth of a warm compile); reading the folders ``pip`` writes (``NAME-VERSION.dist-info``
with ``entry_points.txt``, or a setuptools ``.egg-info``) costs a directory listing per ``sys.path``
entry. As ``importlib.metadata`` does, the first distribution of a name on ``sys.path`` wins.
Nothing is cached between calls: a test that installs a plugin sees it on the next call.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def canonical(name: str) -> str:
    """PEP 503 normalised name: ``Foo_Bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Distribution:
    name: str
    version: str | None
    folder: Path


@dataclass(frozen=True)
class EntryPoint:
    """``name = module:attr`` of one group, with the distribution that declares it."""

    name: str
    value: str
    dist: Distribution

    def load(self) -> Any:
        module, _, attr = self.value.partition(":")
        obj: Any = importlib.import_module(module.strip())
        for part in filter(None, attr.strip().split(".")):
            obj = getattr(obj, part)
        return obj


def _read_field(folder: Path, field: str) -> str | None:
    for meta in ("METADATA", "PKG-INFO"):
        try:
            with open(folder / meta, encoding="utf-8", errors="replace") as f:
                for line in f:
                    if not line.strip():
                        return None  # the headers end at the first blank line
                    key, _, value = line.partition(":")
                    if key.strip().lower() == field:
                        return value.strip()
        except OSError:
            continue
    return None


def distributions() -> list[Distribution]:
    """Every distribution on ``sys.path`` once, the first of each name winning."""
    seen: set[str] = set()
    out: list[Distribution] = []
    for entry in sys.path:
        base = entry or "."
        try:
            names = sorted(os.listdir(base))
        except OSError:
            continue
        for folder_name in names:
            if not folder_name.endswith((".dist-info", ".egg-info")):
                continue
            folder = Path(base, folder_name)
            stem = folder_name.rsplit(".", 1)[0]
            name, _, rest = stem.partition("-")  # NAME-VERSION.dist-info, NAME[-VERSION-pyX.Y].egg-info
            version = rest.split("-")[0] if rest else _read_field(folder, "version")
            key = canonical(name)
            if key in seen:
                continue
            seen.add(key)
            out.append(Distribution(name, version or None, folder))
    return out


def version(name: str) -> str | None:
    """The installed version of distribution ``name``, or ``None`` when it is not installed."""
    key = canonical(name)
    for dist in distributions():
        if canonical(dist.name) == key:
            return dist.version
    return None


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` across the installed distributions, in ``sys.path`` order."""
    out: list[EntryPoint] = []
    for dist in distributions():
        try:
            text = (dist.folder / "entry_points.txt").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        section, named = None, None
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1].strip()
            elif section == group and "=" in line:
                if named is None:  # the project's own spelling (the folder's is normalised), as pip shows it
                    named = Distribution(_read_field(dist.folder, "name") or dist.name, dist.version, dist.folder)
                name, _, value = line.partition("=")
                out.append(EntryPoint(name.strip(), value.strip(), named))
    return out
