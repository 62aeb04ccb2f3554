"""``echosim search --json`` writes its output with ``dumps_indented``: the same text as ``json.dumps(indent=2,
sort_keys=True)`` for every kind of value (the fast path for flat rows and the general one)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from echosim.commands.search import dumps_indented

ROW = {"tp": 8, "pp": 16, "sp": True, "step_time_s": 12.5, "tokens_per_s": None, "reason": "", "zero": 0}
CASES: list[Any] = [
    {},
    [],
    {"a": {}, "b": [], "c": [[]], "d": [{}]},
    [ROW, {**ROW, "tp": 4, "reason": 'needs 81.2 GiB > 80.0 GiB allowed, "quoted" %s %% \x00 \n é'}],
    {"layouts": [ROW] * 3, "best": [ROW], "counts": {"pruned_by": {"memory lower bound": 3}, "fit": 2}},
    [{**ROW, "step_time_s": float("nan")}, {**ROW, "step_time_s": float("inf")}, {**ROW, "step_time_s": -0.0}],
    [ROW, {"tp": 1}],  # rows with other keys
    [ROW, {**ROW, "tp": [1, 2]}],  # a value that is not a scalar
    [{"%(x)s": 1, "b\\": "\u2603"}, {"%(x)s": 2, "b\\": "x"}],  # keys that are format or escape characters
    {"z": 1, "a": [1, 2.5, "x", None, True, (3, 4)]},
    {3: "a", 1: "b"},  # keys json converts (no str keys: json's own output)
    ("tuple", 1, 1e300, 1e-300, 123456789012345678901234567890),
    "a string",
    None,
]


@pytest.mark.parametrize("obj", CASES)
def test_equals_json_dumps(obj: Any) -> None:
    assert dumps_indented(obj) == json.dumps(obj, indent=2, sort_keys=True)


def test_search_result_json_equal() -> None:
    from echosim.commands.search import result_json
    from echosim.layout_search import search
    from echosim.plan import Cluster, Plan

    result = search("gpt3-125m", Plan(global_batch=16), Cluster("h100-sxm", 8), space={"tp": (1, 2), "pp": (1, 2)})
    data = result_json(result, 5)
    assert data["layouts"]
    assert dumps_indented(data) == json.dumps(data, indent=2, sort_keys=True)
