"""benchmarks/moe_local_experts.py: experts per GPU and routed rows per expert of a Megatron-Bridge MoE row."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ("case_id", "source_id", "arch", "experts", "ep", "top_k", "micro_batch", "seq_len", "device")


def _module():
    return load_script("benchmarks/moe_local_experts.py")


def test_local_experts_and_rows_per_expert(tmp_path: Path) -> None:
    m = _module()
    cases = [
        # qwen3-30b-a3b on 8 B200: 128 experts / ep 8 = 16 local; 4096 x 8 choices x 8 ranks / 128 = 2048 rows
        ("qwen-b200", "megatron_bridge_25.11", "moe", "128", "8", "8", "1", "4096", "b200"),
        # DeepSeek-V3 on GB200 ep 64: 4 local experts; 4096 x 8 x 64 / 256 = 8192 rows
        ("dsv3-gb200", "megatron_bridge_25.11", "moe", "256", "64", "8", "1", "4096", "gb200"),
        ("dense", "megatron_bridge_25.11", "llama", "", "", "", "1", "8192", "b200"),  # not MoE: left out
        ("other", "dgxc_benchmarking_v25.04", "moe", "8", "8", "2", "1", "4096", "h100-sxm"),  # not Bridge
    ]
    with open(tmp_path / "cases.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        w.writerows(cases)
    rows = [
        {"case_id": c[0], "predicted_step_time_s": 1.0, "error": e}
        for c, e in zip(cases, (-0.5, -0.1, 0, 0), strict=True)
    ]
    (tmp_path / "v.json").write_text(json.dumps({"rows": rows}), encoding="utf-8")
    got = {r["case_id"]: r for r in m.moe_rows(str(tmp_path / "v.json"), str(tmp_path / "cases.csv"))}
    assert set(got) == {"qwen-b200", "dsv3-gb200"}
    assert (got["qwen-b200"]["local"], got["qwen-b200"]["rows"]) == (16, 2048)
    assert (got["dsv3-gb200"]["local"], got["dsv3-gb200"]["rows"]) == (4, 8192)
    assert m.summary(list(got.values()), lambda r: r["local"] >= 16) == "1 rows, mean -50.0%, MAPE 50.0%"
    assert m.summary(list(got.values()), lambda r: r["device"] == "b300") == "0 rows"
