"""Stragglers: a synchronous step ends when the slowest of N devices ends.

Each device's step time is ``ideal * X`` with ``X`` of mean 1 and coefficient of variation
``cv``, independent across devices (thermal throttling, a slow NIC, OS noise, uneven data).
The expected step is ``ideal * E[max(X_1..X_N)]``, which grows with N roughly as
``1 + cv * sqrt(2 ln N)`` for a normal ``X``. Computed by integrating the density of the
maximum, ``N f(x) F(x)**(N-1)``, numerically (Simpson's rule on a fine grid: accurate to
better than 1e-6 of the mean for any N), and exactly for an empirical distribution (a file
of measured step times): ``E[max] = sum_i x_(i) ((i/n)**N - ((i-1)/n)**N)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from echosim.errors import EchosimError

DISTRIBUTIONS = ("normal", "lognormal")
#: Device counts of the growth table: 8 (one node) to 16,384 (Llama 3 405B's cluster).
GROWTH_DEVICES = (8, 64, 512, 1024, 4096, 16384)

_Z_LO, _Z_HI, _STEPS = -12.0, 12.0, 24_000  # Simpson's rule on standard-normal z; even step count
_SQRT2 = math.sqrt(2.0)


def _log_cdf(z: float) -> float:
    """log Phi(z), accurate in both tails."""
    if z > 0:
        return math.log1p(-0.5 * math.erfc(z / _SQRT2))
    return math.log(0.5 * math.erfc(-z / _SQRT2))


def _expected_max_z(n: int, g: Any) -> float:
    """E[g(max of n standard normals)]: integral of g(z) n phi(z) Phi(z)**(n-1)."""
    h = (_Z_HI - _Z_LO) / _STEPS
    total = 0.0
    for i in range(_STEPS + 1):
        z = _Z_LO + i * h
        log_density = math.log(n) - 0.5 * z * z - 0.5 * math.log(2 * math.pi) + (n - 1) * _log_cdf(z)
        weight = 1 if i in (0, _STEPS) else (4 if i % 2 else 2)
        total += weight * g(z) * math.exp(log_density)
    return total * h / 3.0


@lru_cache(maxsize=256)
def expected_max_factor(n: int, cv: float, distribution: str = "normal") -> float:
    """E[max of n per-device step times] over the mean step time, for a step-time ``cv``."""
    if n < 1:
        raise EchosimError(f"straggler model: device count must be at least 1, got {n}")
    check_cv(cv)
    if distribution not in DISTRIBUTIONS:
        raise EchosimError(f"--straggler-dist must be one of {', '.join(DISTRIBUTIONS)}, got {distribution!r}")
    if cv == 0 or n == 1:
        return 1.0
    if distribution == "normal":
        return 1.0 + cv * _expected_max_z(n, lambda z: z)
    sigma = math.sqrt(math.log1p(cv * cv))  # lognormal of mean 1: log X ~ N(-sigma^2/2, sigma^2)
    return _expected_max_z(n, lambda z: math.exp(sigma * z - 0.5 * sigma * sigma))


def check_cv(cv: float) -> None:
    if not (cv >= 0 and math.isfinite(cv)):
        raise EchosimError(f"--straggler-cv must be 0 or more (a coefficient of variation), got {cv:g}")


def expected_max_empirical(samples: list[float], n: int) -> float:
    """E[max of n draws, with replacement, from ``samples``] over their mean (exact)."""
    xs = sorted(samples)
    k = len(xs)
    mean = sum(xs) / k
    total = 0.0
    for i, x in enumerate(xs, start=1):
        total += x * ((i / k) ** n - ((i - 1) / k) ** n)
    return total / mean


def read_samples(path: str) -> list[float]:
    """Per-device step times, one number a line (blank lines and ``#`` comments skipped)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise EchosimError(f"--straggler-file {path}: cannot read ({exc.strerror or exc})") from None
    out: list[float] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            value = float(line)
        except ValueError:
            raise EchosimError(f"--straggler-file {path}: line {number}: {line!r} is not a number") from None
        if not (value > 0 and math.isfinite(value)):
            raise EchosimError(f"--straggler-file {path}: line {number}: step times must be positive, got {line}")
        out.append(value)
    if len(out) < 2:
        raise EchosimError(f"--straggler-file {path}: needs at least 2 step times, found {len(out)}")
    return out


@dataclass(frozen=True)
class StragglerInput:
    cv: float | None = None
    distribution: str = "normal"
    samples: tuple[float, ...] = ()  # an empirical distribution from --straggler-file
    source: str = ""

    def factor(self, n: int) -> float:
        if self.samples:
            return expected_max_empirical(list(self.samples), n)
        return expected_max_factor(n, self.cv or 0.0, self.distribution)

    def cv_of(self) -> float:
        if not self.samples:
            return self.cv or 0.0
        mean = sum(self.samples) / len(self.samples)
        var = sum((x - mean) ** 2 for x in self.samples) / (len(self.samples) - 1)
        return math.sqrt(var) / mean


def stragglers(given: StragglerInput, devices: int, ideal_step_s: float) -> dict[str, Any]:
    """The straggler section of a report: expected step beside the ideal one, and its growth with N."""
    factor = given.factor(devices)
    return {
        "distribution": "empirical" if given.samples else given.distribution,
        "source": given.source or "--straggler-cv",
        "cv": given.cv_of(),
        "devices": devices,
        "ideal_step_s": ideal_step_s,
        "expected_step_s": ideal_step_s * factor,
        "slowdown": factor,
        "growth": {str(n): given.factor(n) for n in sorted({*GROWTH_DEVICES, devices})},
    }


def render(section: dict[str, Any]) -> list[str]:
    s = section
    growth = ", ".join(f"{int(n):,}: {f:.3f}x" for n, f in s["growth"].items())
    return [
        f"stragglers ({s['distribution']}, cv {s['cv']:.3g}): expected step {s['expected_step_s']:.4g} s, "
        f"{s['slowdown']:.3f}x the ideal {s['ideal_step_s']:.4g} s on {s['devices']:,} devices",
        f"  slowest-of-N factor by devices: {growth}",
    ]
