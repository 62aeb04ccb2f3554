"""Folding repeated layers: one copy in the IR with a repeat count, so depth costs nothing.

This is the one folding mechanism of every frontend. Repeated layers are folded in
the IR (:mod:`irfold`), where a fold is *proved*: consecutive layers fold only when
their node sequences match op for op and they form a chain (each reads what the
one before produced). Identical modules used side by side (DLRM's embedding
tables), or layers with work between them in the parent's loop, do not fold.

A torch module (zoo, ``.py``, ``hf:``; torch.export or torch.fx) is not captured
at full depth first. The longest run of consecutive, structurally identical entries
of any ``nn.ModuleList`` (ties go to the run holding more parameters) is shortened
to its first two entries, the module is captured, and :func:`irfold.fold_run`
checks the two copies chain before it drops the second and gives the first the
run's count (:func:`capture_folded`). If they do not chain, the module is captured
again at its full depth, unfolded. An ONNX file stores every layer, so there
:func:`irfold.fold_layers` runs the same proof over all the copies.

Where layer kinds interleave (gpt-oss's sliding and full attention, Qwen3-Next's three
linear-attention layers and one full), the run is of groups of consecutive entries,
identical group for group: the first two groups become one entry each
(:class:`LayerGroup`), and the kept group is a block of several layers
(``Graph.block_layers``), as the zoo builds such models.

Exactly one run is folded: the timeline composes one repeated block per model (the
pipeline cuts it into stages). Layers before and after the run stay in the capture
as they are (DeepSeek-V3's three dense layers precede its 58 MoE layers).

"Identical" means the same module classes, the same parameter and buffer shapes and
the same scalar settings (attention type, sliding window, ...); a layer index is not
a setting, nor a random seed (BigBird's is its layer's index), nor a float's magnitude:
DiffLlama's ``lambda_init`` scales each layer's output by a depth-dependent constant, which
costs the same at every depth. A float's sign is kept, since code branches on a rate being
zero (a dropout or drop-path probability). Scopes of layers after the run are renamed back to their real indices.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import nn

from echosim.frontend.irfold import fold_run
from echosim.frontend.messages import Note
from echosim.frontend.spec import Capture, CaptureError

_SCALARS = (bool, int, float, str, type(None))
_INDEX_NAMES = re.compile(r"(^|_)(idx|index|layer_id|layer_number|seed)$")


def _setting(value: Any) -> Any:
    """What of a scalar setting the structure can depend on: a float's sign, anything else's value."""
    if isinstance(value, float) and not math.isnan(value):
        return ("float", (value > 0) - (value < 0))
    return value


def signature(module: nn.Module) -> tuple[Any, ...]:
    """Structural identity of a block: classes, tensor shapes, and scalar settings."""
    parts: list[Any] = []
    for path, mod in module.named_modules():
        settings = tuple(
            sorted(
                (k, _setting(v))
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
    """``count`` repetitions, from entry ``start`` of the ModuleList at ``path``, of ``period`` consecutive
    entries that are identical group for group (``period`` 1: identical entries)."""

    path: str
    start: int
    count: int
    params: int  # of one repetition
    period: int = 1

    @property
    def prefix(self) -> str:
        return f"{self.path}.{self.start}" if self.path else str(self.start)

    @property
    def entries(self) -> int:
        return self.count * self.period


#: The longest pattern of interleaved layer kinds looked for: Gemma 3's five local and one global layers, Llama 4's
#: dense and MoE, gpt-oss's sliding and full, Qwen3-Next's three linear and one full attention.
MAX_PERIOD = 8


def longest_run(module: nn.Module) -> Run | None:
    """The run worth folding: the most layers, then the shortest period, then the most parameters; ``None`` if
    no list repeats. Layers of kinds that interleave (sliding and full attention, dense and MoE) repeat as a
    group: a period above one."""
    best: Run | None = None

    def key(r: Run) -> tuple[int, int, int]:
        return r.entries, -r.period, r.count * r.params

    for path, mod in module.named_modules():
        if not path or not isinstance(mod, nn.ModuleList) or len(mod) < 2:
            continue
        if type(mod).forward is not nn.ModuleList.forward:  # a list that runs as one block (the zoo's LayerBlock)
            continue
        sigs = [signature(m) for m in mod]
        for period in range(1, min(MAX_PERIOD, len(sigs) // 2) + 1):
            i = 0
            while i + 2 * period <= len(sigs):
                group = sigs[i : i + period]
                if period > 1 and all(s == group[0] for s in group):
                    i += 1  # identical entries: period 1 holds them
                    continue
                count = 1
                while sigs[i + count * period : i + (count + 1) * period] == group:
                    count += 1
                if count >= 2:
                    params = sum(p.numel() for m in mod[i : i + period] for p in m.parameters())
                    run = Run(path, i, count, params, period)
                    if best is None or key(run) > key(best):
                        best = run
                    i += count * period
                else:
                    i += 1
    return best


class LayerGroup(nn.ModuleList):
    """``period`` consecutive layers run in turn as one entry of their list, so the fold keeps one group with
    the group count (as the zoo's ``LayerBlock``). transformers' decoder loops call each entry with the hidden
    states and keyword arguments, and some read an entry's attribute to choose them (``attention_type`` picks a
    mask): a group passes the call to each of its layers and answers for its first. The masks it so passes
    are not read by the capture's attention, which is causal SDPA with the window set from the config."""

    def forward(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        out: Any = hidden
        for layer in self:
            out = layer(out[0] if isinstance(out, tuple) else out, *args, **kwargs)
        return out

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("_") or not len(self):
                raise
            return getattr(self[0], name)


@dataclass
class Folded:
    """The run that was shortened (if any), and how to rename scopes of the layers after it."""

    run: Run | None = None

    def real_scope(self, scope: str) -> str:
        """Map a scope of the shortened list back to the layer index it stands for."""
        run = self.run
        if run is None or run.entries <= 2:
            return scope
        head = f"{run.path}." if run.path else ""
        if not scope.startswith(head):
            return scope
        rest = scope[len(head) :]
        index, dot, tail = rest.partition(".")
        if not index.isdigit() or int(index) <= run.start + 1:
            return scope
        return f"{head}{int(index) + run.entries - 2}{dot}{tail}"


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
    first, step = run.start, run.period
    if step == 1:
        copies = list(original[first : first + 2])
    else:  # two groups of the pattern, each one entry
        copies = [LayerGroup(original[first + i * step : first + (i + 1) * step]) for i in range(2)]
    kept = [*original[:first], *copies, *original[first + run.entries :]]
    setattr(parent, name, nn.ModuleList(kept))
    try:
        yield Folded(run)
    finally:
        setattr(parent, name, original)


Rename = Callable[[str], str]


def block_layers(block: nn.Module) -> int:
    """Layers a repeated entry runs in turn: a list with its own forward (the zoo's ``LayerBlock`` of
    local and global, or dense and MoE, layers) runs each of its entries; any other module is one layer."""
    if isinstance(block, nn.ModuleList) and type(block).forward is not nn.ModuleList.forward:
        return len(block)
    return 1


def capture_folded(
    root: nn.Module, capture: Callable[[Rename], Capture], *, enabled: bool = True, depth: int = 0
) -> Capture:
    """Capture ``root`` with its longest run of identical layers folded to one copy and a repeat count.

    ``capture(rename)`` captures ``root`` as it is when called (torch.export or
    torch.fx), naming module paths through ``rename``. It is called with the run cut
    to two copies; :func:`irfold.fold_run` folds the second away once it has checked
    the copies form a chain. If they do not, or if the shortened module cannot be
    captured at all (a forward that indexes ``layers[5]``), ``capture`` runs again
    at full depth.

    ``depth``: how many layers the run stands for when ``root`` was built shorter
    than the model (the zoo builds two layers of a model whose depth it knows);
    ``0``: as many as ``root`` holds.
    """
    with folded(root, enabled) as info:
        run = info.run
        if run is None:
            return capture(info.real_scope)
        built_short = depth not in (0, run.count)  # the module holds fewer layers than the model
        why = "they are no chain of layers (used side by side, or with work between them)"
        try:
            cap = capture(info.real_scope)
            graph = fold_run(cap.graph, run.prefix, depth or run.count)
            if graph is not None and (layers := block_layers(_resolve(root, run.path)[run.start])) > 1:
                graph.block_layers = {prefix: layers for prefix in graph.repeats}
        except CaptureError as exc:
            if built_short:
                raise
            # the full model is captured next: say why the short one failed without reading as a failed capture
            graph, why = None, f"the model does not run with the run cut to two copies ({exc})"
    if graph is not None:
        cap.graph = graph
        return cap
    if built_short:
        raise CaptureError(
            f"the copies of {run.prefix} are not a chain of identical layers: they cannot stand for {depth}"
        )
    cap = capture(lambda scope: scope)  # side by side, work between the layers, or a forward indexing them
    # said, because --pp then refuses a model with visibly repeated layers (Gemma 4 picks each layer's rotary
    # table by its index in the list, so a group of six cut from it gets the first layer's)
    what = f"{run.count} groups of {run.period}" if run.period > 1 else f"{run.count} identical entries"
    cap.notes.append(Note(f"{run.path} ({what} from entry {run.start}) captured as they are, not folded: {why}"))
    return cap
