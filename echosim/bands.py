"""How far to trust a step time: echosim's error on the published runs most like the one compiled.

``echosim validate --cases`` predicts every published training step of the validation table
(``../shared/validation/cases.csv``). Its signed errors, grouped by what moves them most (a dense or a
mixture-of-experts model, the device and its generation, 16-, 8- or 4-bit GEMMs, data parallelism alone or with
tensor / pipeline / context parallelism), give an empirical band for a new prediction: the
:data:`PERCENTILES` of echosim's error on the runs of its group. A compile reports the band of the narrowest group
with at least :data:`MIN_RUNS` runs, and what that band makes of its step time.

The cost model was developed against these runs, so a band is tighter on them than on a new run. How much, is
measured by holding each source out in turn (``echosim.validation.bands.held_out_coverage``; ``docs/accuracy.md``
quotes it as the table now gives it, ``benchmarks/accuracy_bands.py`` prints the settings side by side). When
these settings were chosen (2026-12-06), bands built from the other sources held 77 % of the held-out source's
runs (253 of 327; nominal 90 %), where the 10th-90th percentile with at least 10 runs a group held 65 % (224 of
345). The wider band and the larger groups were chosen for that, so that a band means close to what it says on a
source the table has not seen.

A band says nothing for models the table has no runs of (vision, recommendation, recurrent models) or for devices
it has no runs on (CPUs, plugin backends). ``benchmarks/accuracy_bands.py`` writes the table
(``echosim/data/accuracy_bands.json``); ``tests/test_accuracy_bands.py`` checks that it is current.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

#: The fewest runs a group needs before its percentiles stand for it (below that, the next wider group speaks).
MIN_RUNS = 20
#: The percentiles of a group's errors a band spans (see the module doc for what they hold on a held-out source).
PERCENTILES = (5, 95)
#: The groups a prediction is looked up in, narrowest first. ``device`` is the backend's name, ``family`` its
#: generation (ampere, hopper, blackwell, tpu).
LEVELS: tuple[tuple[str, ...], ...] = (
    ("kind", "device", "precision", "parallel"),
    ("kind", "device", "precision"),
    ("kind", "family", "precision", "parallel"),
    ("kind", "family", "precision"),
    ("kind", "family"),
)
TABLE_FILE = "accuracy_bands.json"

_PRECISION = {"fp8": "8-bit", "mxfp8": "8-bit", "int8": "8-bit", "nvfp4": "4-bit", "fp32": "32-bit"}


@dataclass(frozen=True, slots=True)
class Traits:
    """What the group of a run is chosen by."""

    kind: str  # "dense" or "moe" (a transformer language model); "" for any other model
    device: str  # the backend's name
    family: str  # its generation; "" where the table cannot know it (CPUs, plugin backends)
    precision: str  # "16-bit", "8-bit", "4-bit" or "32-bit": the GEMMs' format
    parallel: str  # "data" (data parallelism and sharding alone) or "model" (tp, pp or cp above 1)

    def key(self, level: tuple[str, ...]) -> str:
        return " ".join(f"{name}={getattr(self, name)}" for name in level)


@dataclass(frozen=True, slots=True)
class Band:
    """echosim's signed error (predicted / published - 1) on one group of published runs."""

    group: str
    runs: int
    median: float
    low: float  # the error at the lower of ``percentiles``
    high: float  # the error at the upper
    percentiles: tuple[int, int] = PERCENTILES

    def step_range_s(self, predicted_s: float) -> tuple[float, float]:
        """The published step a prediction stands for, if its error lies in the band: an error e means
        published = predicted / (1 + e), so the high error gives the short end and the low error the long."""
        return predicted_s / (1 + self.high), predicted_s / (1 + self.low)

    def to_dict(self, predicted_s: float) -> dict[str, Any]:
        low, high = self.step_range_s(predicted_s)
        return {
            "group": self.group,
            "runs": self.runs,
            "error_median": self.median,
            "error_low": self.low,
            "error_high": self.high,
            "percentiles": list(self.percentiles),
            "step_time_s_range": [round(low, 6), round(high, 6)],
        }


def precision_of(dtype: str) -> str:
    return _PRECISION.get(dtype, "16-bit")


def family_of(backend: str) -> str:
    """The generation of a built-in backend; "" for CPUs and backends the table cannot know."""
    if backend.startswith("tpu-"):
        return "tpu"
    from echosim.backends.devices import DEVICES

    spec = DEVICES.get(backend)
    return spec.arch if spec is not None else ""


def traits(kind: str, backend: str, dtype: str, tp: int, pp: int, cp: int) -> Traits:
    parallel = "model" if max(tp, pp, cp) > 1 else "data"
    return Traits(kind, backend, family_of(backend), precision_of(dtype), parallel)


def model_kind(graph: Any) -> str:
    """The kind of model: "moe" with grouped expert GEMMs, "dense" with causal attention (the language models the
    table holds), "" for any other (encoders, vision, recommendation, recurrent models)."""
    from echosim.ir.ops import AttentionAttrs, MatmulAttrs

    causal = False
    for node in graph:
        if isinstance(node.attrs, MatmulAttrs) and node.attrs.grouped:
            return "moe"
        causal = causal or (isinstance(node.attrs, AttentionAttrs) and node.attrs.causal)
    return "dense" if causal else ""


def summarise(
    runs: Iterable[tuple[Traits, float]], percentiles: tuple[int, int] = PERCENTILES, min_runs: int = MIN_RUNS
) -> dict[str, Any]:
    """The stored table: every group at every level that has runs, with its ``percentiles``."""
    groups: dict[str, list[float]] = {}
    for t, error in runs:
        if not t.kind or not t.family:
            continue
        for level in LEVELS:
            groups.setdefault(t.key(level), []).append(error)
    table = {}
    for key in sorted(groups):
        errors = sorted(groups[key])
        cuts = statistics.quantiles(errors, n=100, method="inclusive") if len(errors) > 1 else errors * 99
        table[key] = {
            "runs": len(errors),
            "median": round(statistics.median(errors), 6),
            "low": round(cuts[percentiles[0] - 1], 6),
            "high": round(cuts[percentiles[1] - 1], 6),
        }
    return {
        "min_runs": min_runs,
        "percentiles": list(percentiles),
        "levels": [list(level) for level in LEVELS],
        "groups": table,
    }


@cache
def stored_table() -> dict[str, Any]:
    text = resources.files("echosim").joinpath("data", TABLE_FILE).read_text(encoding="utf-8")
    return dict(json.loads(text))


def band_for(t: Traits, table: dict[str, Any] | None = None) -> Band | None:
    """The band of the narrowest group with at least :data:`MIN_RUNS` runs, or None where no group has. A GEMM
    format the table has no run of on the device's generation (fp32 on Hopper, say) gets none: the generation's
    band is made of other formats."""
    table = table if table is not None else stored_table()
    if not t.kind or not t.family or t.key(("kind", "family", "precision")) not in table["groups"]:
        return None
    for level in LEVELS:
        key = t.key(level)
        row = table["groups"].get(key)
        if row is not None and row["runs"] >= table["min_runs"]:
            return Band(key, row["runs"], row["median"], row["low"], row["high"], tuple(table["percentiles"]))
    return None


def no_band_reason(t: Traits, table: dict[str, Any] | None = None) -> str:
    table = table if table is not None else stored_table()
    if not t.kind:
        return (
            "the validation table has no published runs of this kind of model (it holds language models only; "
            "echosim's error on published vision, recommendation and recurrent runs: docs/beyond-transformers.md)"
        )
    if not t.family:
        return f"the validation table has no published runs on {t.device}"
    if t.key(("kind", "family", "precision")) not in table["groups"]:
        return f"the validation table has no published {t.kind} runs in {t.precision} on {t.family} devices"
    return f"the validation table has fewer than {table['min_runs']} published runs like this one"


def accuracy_section(compiled: Any) -> dict[str, Any]:
    """The ``accuracy`` section of a compile's report: the band and the step it gives, or why there is none."""
    report = compiled.report
    plan = report.plan
    t = traits(model_kind(compiled.graph), report.backend, plan["dtype"], plan["tp"], plan["pp"], plan["cp"])
    band = band_for(t)
    if band is None:
        return {"band": None, "reason": no_band_reason(t)}
    return {"band": band.to_dict(report.step_time_s), "reason": ""}


def _three_figures(x: float) -> str:
    """Three significant figures, trailing zeros kept (6.00, not 6)."""
    decimals = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 2
    return f"{x:.{decimals}f}"


def group_label(group: str) -> str:
    """``kind=dense device=h100-sxm precision=8-bit parallel=model`` -> ``dense, h100-sxm, 8-bit, model-parallel``."""
    values = dict(part.split("=", 1) for part in group.split())
    words = {"data": "data-parallel only", "model": "model-parallel"}
    return ", ".join(words.get(v, v) if k == "parallel" else v for k, v in values.items())


def accuracy_line(section: dict[str, Any]) -> str:
    """One line for the terminal summary."""
    band = section["band"]
    if band is None:
        return f"no band: {section['reason']}"
    low, high = band["step_time_s_range"]
    return (
        f"{_three_figures(low)}-{_three_figures(high)} s (echosim's error on {band['runs']} published runs like "
        "this one, "
        f"{group_label(band['group'])}: {band['error_low'] * 100:+.1f}% to {band['error_high'] * 100:+.1f}%, "
        f"{band['percentiles'][0]}th-{band['percentiles'][1]}th percentile)"
    )
