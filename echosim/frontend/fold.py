"""Fold a run of identical layers to one copy before capture, so depth does not multiply its cost.

The timeline composes one repeated block per model (the pipeline cuts it into
stages), so exactly one run is folded: the longest run of consecutive, structurally
identical entries of any ``nn.ModuleList`` (ties go to the run holding more
parameters). Two copies of it are captured, so that :func:`irfold.fold_run` can
check they form a chain (the second reads the first) before it folds the second
away. Layers before and after the run stay in the capture as they are:
DeepSeek-V3's three dense layers precede its 58 MoE layers, for instance.

"Identical" means the same module classes, the same parameter and buffer shapes and
the same scalar settings (attention type, sliding window, ...); a layer index is not
a setting. Scopes of layers after the run are renamed back to their real indices.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch import nn

_SCALARS = (bool, int, float, str, type(None))
_INDEX_NAMES = re.compile(r"(^|_)(idx|index|layer_id|layer_number)$")


def signature(module: nn.Module) -> tuple[Any, ...]:
    """Structural identity of a block: classes, tensor shapes, and scalar settings."""
    parts: list[Any] = []
    for path, mod in module.named_modules():
        settings = tuple(
            sorted(
                (k, v)
                for k, v in vars(mod).items()
                if not k.startswith("_") and k != "training" and isinstance(v, _SCALARS) and not _INDEX_NAMES.search(k)
            )
        )
        parts.append((path, type(mod).__qualname__, settings))
    for kind in (module.named_parameters(), module.named_buffers()):
        parts.extend((n, tuple(t.shape), t.dtype) for n, t in kind)
    return tuple(parts)


@dataclass(frozen=True)
class Run:
    """Entries ``start .. start+count-1`` of the ModuleList at ``path`` are identical."""

    path: str
    start: int
    count: int
    params: int

    @property
    def prefix(self) -> str:
        return f"{self.path}.{self.start}" if self.path else str(self.start)


def longest_run(module: nn.Module) -> Run | None:
    """The run worth folding: longest, then most parameters; ``None`` if no list repeats."""
    best: Run | None = None
    for path, mod in module.named_modules():
        if not path or not isinstance(mod, nn.ModuleList) or len(mod) < 2:
            continue
        sigs = [signature(m) for m in mod]
        i = 0
        while i < len(sigs):
            j = i + 1
            while j < len(sigs) and sigs[j] == sigs[i]:
                j += 1
            if j - i >= 2:
                params = sum(p.numel() for p in mod[i].parameters())
                run = Run(path, i, j - i, params)
                if best is None or (run.count, run.count * run.params) > (best.count, best.count * best.params):
                    best = run
            i = j
    return best


@dataclass
class Folded:
    """What folding did: the repeat to record and how to rename scopes of later layers."""

    repeats: dict[str, int] = field(default_factory=dict)
    run: Run | None = None

    def real_scope(self, scope: str) -> str:
        """Map a scope of the shortened list back to the layer index it stands for."""
        run = self.run
        if run is None or run.count <= 2:
            return scope
        head = f"{run.path}." if run.path else ""
        if not scope.startswith(head):
            return scope
        rest = scope[len(head) :]
        index, dot, tail = rest.partition(".")
        if not index.isdigit() or int(index) <= run.start + 1:
            return scope
        return f"{head}{int(index) + run.count - 2}{dot}{tail}"


def _resolve(root: nn.Module, path: str) -> nn.Module:
    return root.get_submodule(path) if path else root


@contextmanager
def folded(module: nn.Module, enabled: bool = True) -> Iterator[Folded]:
    """Temporarily shorten the longest run of identical layers to its first two entries."""
    run = longest_run(module) if enabled else None
    if run is None:
        yield Folded()
        return
    parent_path, _, name = run.path.rpartition(".")
    parent = _resolve(module, parent_path)
    original = getattr(parent, name)
    kept = [*original[: run.start + 2], *original[run.start + run.count :]]
    setattr(parent, name, nn.ModuleList(kept))
    try:
        yield Folded({run.prefix: run.count}, run)
    finally:
        setattr(parent, name, original)
