"""The ``compile`` options of cluster dynamics, and the report sections they add.

Kept apart from the layout flags: they never change how one step is simulated, only what the
report says beside it (``goodput``, ``stragglers``, ``dp_strategy`` keys of ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from echosim.errors import EchosimError

F = TypeVar("F", bound=Callable[..., Any])

KEYS = (
    "mtbf_hours",
    "checkpoint_interval",
    "restart_minutes",
    "storage",
    "checkpoint_mode",
    "tokens",
    "straggler_cv",
    "straggler_dist",
    "straggler_file",
    "dp_strategy",
    "inner_steps",
    "fragments",
    "gossip_peers",
    "slow_link_gbps",
    "slow_link_latency_ms",
)


def dynamics_options(fn: F) -> F:
    """Failures, checkpoints, stragglers and data-parallel strategies (docs/cluster-dynamics.md)."""
    options = [
        click.option(
            "--mtbf-hours",
            type=float,
            help="Mean time between failures of ONE device, hours (Llama 3 405B: ~50,000); adds goodput.",
        ),
        click.option(
            "--checkpoint-interval",
            metavar="auto|MINUTES",
            help="Minutes of training between checkpoints; auto: the Young/Daly optimum [default: auto].",
        ),
        click.option("--restart-minutes", type=float, help="Minutes from a failure to training again [default: 0]."),
        click.option(
            "--storage",
            help="Where checkpoints go: tectonic (2 TB/s), tectonic-peak, host-pcie4, host-pcie5, or e.g. "
            "500GBps [default: tectonic].",
        ),
        click.option(
            "--checkpoint-mode",
            type=click.Choice(["sync", "async"]),
            help="sync: training waits for the write; async: only for the copy to host memory [default: sync].",
        ),
        click.option("--tokens", type=float, help="Tokens to train on: time to train with failures (--mtbf-hours)."),
        click.option(
            "--straggler-cv",
            type=float,
            help="Coefficient of variation of per-device step time; adds the expected slowest-of-N step.",
        ),
        click.option(
            "--straggler-dist",
            type=click.Choice(["normal", "lognormal"]),
            help="Distribution of per-device step time [default: normal].",
        ),
        click.option(
            "--straggler-file",
            type=click.Path(dir_okay=False),
            help="Measured per-device step times, one a line: their empirical distribution.",
        ),
        click.option(
            "--dp-strategy",
            type=click.Choice(["sync", "diloco", "streaming-diloco", "gossip"]),
            help="Data-parallel strategy to cost against synchronous DP (docs/cluster-dynamics.md).",
        ),
        click.option("--inner-steps", type=int, help="DiLoCo: inner steps H between outer syncs [default: 500]."),
        click.option("--fragments", type=int, help="Streaming DiLoCo: fragments synced in turn [default: 4]."),
        click.option("--gossip-peers", type=int, help="Gossip: neighbours each replica averages with [default: 2]."),
        click.option(
            "--slow-link-gbps",
            type=float,
            help="GB/s per direction of the link the data-parallel sync crosses (e.g. between sites); "
            "default: the backend's network.",
        ),
        click.option("--slow-link-latency-ms", type=float, help="Latency of the slow link, milliseconds [default: 0]."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


@dataclass(frozen=True)
class Request:
    """What the dynamics options ask for; each part is ``None`` when not asked."""

    goodput: Any = None
    stragglers: Any = None
    strategy: Any = None
    tokens: float | None = None

    @property
    def any(self) -> bool:
        return self.goodput is not None or self.stragglers is not None or self.strategy is not None


def pop_request(opts: dict[str, Any]) -> Request:
    """Take the dynamics options out of ``opts`` and check them before anything is compiled.

    The models of each section are imported only when one of its options is given: a plain
    compile does not pay for them.
    """
    v = {k: opts.pop(k, None) for k in KEYS}
    tokens = v["tokens"]
    if tokens is not None and not (tokens > 0):
        raise EchosimError(f"--tokens must be a positive number, got {tokens:g}")
    good = None
    if v["mtbf_hours"] is not None:
        from echosim.dynamics.goodput import STORAGE, GoodputInput, parse_interval, parse_storage

        good = GoodputInput(
            mtbf_device_hours=v["mtbf_hours"],
            restart_minutes=v["restart_minutes"] if v["restart_minutes"] is not None else 0.0,
            interval_minutes=parse_interval(v["checkpoint_interval"] or "auto"),
            storage=parse_storage(v["storage"]) if v["storage"] else STORAGE["tectonic"],
            mode=v["checkpoint_mode"] or "sync",
            tokens=tokens,
        )
        good.check()
    else:
        for key in ("checkpoint_interval", "restart_minutes", "storage", "checkpoint_mode"):
            if v[key] is not None:
                flag = f"--{key.replace('_', '-')}"
                raise EchosimError(f"{flag} needs --mtbf-hours (failures are what checkpoints are for)")
    strag = None
    if v["straggler_cv"] is not None and v["straggler_file"]:
        raise EchosimError("--straggler-cv and --straggler-file: give one")
    if v["straggler_file"] and v["straggler_dist"]:
        raise EchosimError("--straggler-dist applies to --straggler-cv; a --straggler-file is its own distribution")
    if v["straggler_cv"] is not None:
        from echosim.dynamics.stragglers import StragglerInput, check_cv

        check_cv(v["straggler_cv"])
        strag = StragglerInput(cv=v["straggler_cv"], distribution=v["straggler_dist"] or "normal")
    elif v["straggler_file"]:
        from echosim.dynamics.stragglers import StragglerInput, read_samples

        strag = StragglerInput(samples=tuple(read_samples(v["straggler_file"])), source=str(v["straggler_file"]))
    elif v["straggler_dist"]:
        raise EchosimError("--straggler-dist needs --straggler-cv")
    strategy = None
    strategy_keys = ("inner_steps", "fragments", "gossip_peers", "slow_link_gbps", "slow_link_latency_ms")
    if v["dp_strategy"]:
        from echosim.dynamics.lowcomm import StrategyInput

        strategy = StrategyInput.of(
            v["dp_strategy"], v["inner_steps"], v["fragments"], v["gossip_peers"], v["slow_link_gbps"],
            v["slow_link_latency_ms"],
        )  # fmt: skip
    else:
        for key in strategy_keys:
            if v[key] is not None:
                raise EchosimError(f"--{key.replace('_', '-')} needs --dp-strategy")
    if tokens is not None and good is None:
        raise EchosimError("--tokens needs --mtbf-hours (time to train counts failures; search --tokens ranks sizes)")
    return Request(good, strag, strategy, tokens)


def sections(request: Request, report: Any) -> dict[str, Any]:
    """The report keys the request adds: ``stragglers``, ``goodput``, ``dp_strategy``."""
    from echosim.dynamics.goodput import goodput

    out: dict[str, Any] = {}
    step = report.step_time_s
    rate = report.tokens_per_s
    if request.stragglers is not None:
        from echosim.dynamics.stragglers import stragglers

        out["stragglers"] = stragglers(request.stragglers, report.devices, step)
        slow = out["stragglers"]["slowdown"]
        step, rate = step * slow, (rate / slow if rate else rate)  # failures and time to train see the real step
    if request.strategy is not None:
        from echosim.dynamics.lowcomm import strategy_section

        out["dp_strategy"] = strategy_section(request.strategy, report)
    if request.goodput is not None:
        p = report.plan
        out["goodput"] = goodput(
            request.goodput, params=report.params, dtype=p["dtype"], framework=p["framework"], pp=p["pp"],
            devices=report.devices, backend=report.backend, step_time_s=step, tokens_per_s=rate,
            tables=report.embedding_tables,
        )  # fmt: skip
    return out


def render(extra: dict[str, Any]) -> list[str]:
    """Lines for the terminal summary, after the step's own."""
    lines: list[str] = []
    if "stragglers" in extra:
        from echosim.dynamics.stragglers import render as straggler_lines

        lines += straggler_lines(extra["stragglers"])
    if "dp_strategy" in extra:
        from echosim.dynamics.lowcomm import render as strategy_lines

        lines += strategy_lines(extra["dp_strategy"])
    if "goodput" in extra:
        from echosim.dynamics.goodput import render as goodput_lines

        lines += goodput_lines(extra["goodput"])
    return lines
