"""Fuzz echosim with mutated and truncated inputs; print how each ended.

Usage: python benchmarks/fuzz.py [--n 1000] [--seed 0] [--targets layouts,cases,...] [--limit-s 20]

Every input must end in a result or a one-line error (an :class:`EchosimError`, or a click
usage error) within ``--limit-s`` seconds; a result that is a report must break no physical
invariant (``echosim.timeline.report.invariant_violations``); reading a calibration database
must leave the file byte-identical. The script prints, per target, the inputs tried and how
many ended in a result, a one-line error, a traceback, a hang or a broken invariant, with
the first few failures; its exit status is 1 if any input did not end cleanly.

``tests/test_fuzz.py`` runs the same targets under hypothesis with a handful of inputs each.
"""

from __future__ import annotations

import argparse
import copy
import csv
import hashlib
import io
import json
import random
import sqlite3
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from echosim.errors import EchosimError, time_limit  # noqa: E402

#: Hostile values mixed into every generated number.
EDGE_INTS = [0, -1, 1, 2, 3, 7, 8, 2**31, 2**40 + 1, 2**63, -(2**63), 10**7, 10**12]
TEXT = ["", " ", "nan", "inf", "-inf", "1e309", "fast", "1,5", "0x10", "None", "∞", "\x00", "1e-400", "-0"]


class Broken(Exception):
    """A report that breaks an invariant, or a file that reading changed."""


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def add(self, outcome: str, detail: str = "") -> None:
        self.counts[outcome] += 1
        if outcome in ("traceback", "hang", "invariant") and len(self.failures) < 5:
            self.failures.append(f"{outcome}: {detail}")


def attempt(fn: Callable[[], Any], limit_s: float) -> tuple[str, str]:
    """Run one input: ('result'|'error'|'traceback'|'hang'|'invariant', detail)."""
    import click

    from echosim.errors import TimeLimitError

    start = time.monotonic()
    try:
        with time_limit(limit_s, "the fuzzed input"):
            fn()
    except TimeLimitError as exc:
        return "hang", str(exc)
    except Broken as exc:
        return "invariant", str(exc)
    except (EchosimError, click.ClickException) as exc:
        message = str(exc.message if isinstance(exc, click.ClickException) else exc)
        if "\n" in message.strip():
            return "traceback", f"multi-line error: {message[:200]!r}"
        return "error", message
    except Exception:
        return "traceback", traceback.format_exc(limit=-3)[-600:]
    if time.monotonic() - start > limit_s:
        return "hang", f"took {time.monotonic() - start:.1f} s"
    return "result", ""


def check_report(report: Any) -> None:
    from echosim.timeline.report import INVARIANT, invariant_violations, stable_json

    # the report's own checks, and those the compiler made with the backend (bytes over bandwidth)
    bad = invariant_violations(report) + [w for w in report.warnings if w.startswith(INVARIANT)]
    if bad:
        raise Broken(bad[0])
    text = stable_json(report.to_dict())
    if "NaN" in text or "Infinity" in text:
        raise Broken("non-standard JSON")


# ---- targets --------------------------------------------------------------------------------------


def _int(rng: random.Random, lo: int = 1, hi: int = 8) -> int:
    return rng.choice(EDGE_INTS) if rng.random() < 0.15 else rng.randint(lo, hi)


def layouts(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A random layout of a small model through the same path as ``compile`` flags."""
    from echosim.compiler import lower
    from echosim.frontend.zoo import ArchConfig
    from echosim.plan import plan_from_options

    arch = rng.choice(["gpt", "llama", "moe"])
    heads = rng.choice([2, 4, 8])
    cfg = ArchConfig(
        arch,
        layers=rng.choice([1, 2, 4, 8]),
        hidden=heads * rng.choice([16, 32, 64]),
        heads=heads,
        vocab=rng.choice([256, 1000, 4096]),
        seq_len=rng.choice([16, 128, 512]),
        ffn=rng.choice([64, 256]),
        kv_heads=rng.choice([1, heads]) if arch != "gpt" else heads,
        experts=4 if arch == "moe" else 0,
        top_k=2 if arch == "moe" else 0,
        moe_ffn=64 if arch == "moe" else 0,
        sliding_window=rng.choice([0, 0, 8, 64]) if arch != "gpt" else 0,
        global_layer_step=rng.choice([0, 2]),
    )
    opts: dict[str, Any] = {}
    for key in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch"):
        if rng.random() < 0.5:
            opts[key] = _int(rng, 1, 4)
    if rng.random() < 0.5:
        opts["global_batch"] = _int(rng, 1, 64)
    if rng.random() < 0.4:
        opts["seq_len"] = _int(rng, 8, 1024)
    if rng.random() < 0.3:
        opts["devices"] = _int(rng, 1, 32)
    for key, values in (
        ("dtype", ["fp32", "fp16", "bf16", "fp8", "mxfp8", "nvfp4", "int8"]),
        ("recompute", ["none", "selective", "full", "selective:moe_act", "selective:core_attn,layernorm",
                       "selective:mlp,moe", "selective:shared_experts", "full:1", "full:3", "full:0", "full:x",
                       "full:uniform-2", "full:uniform-1", "full:every-2"]),
        ("schedule", ["1f1b", "gpipe", "zb-h1", "interleaved-1f1b", "nope"]),
        ("optimizer_dtypes", ["", "exp_avg=bf16", "main_grads=bf16,exp_avg_sq=fp8", "main_params=fp16",
                              "exp_avg=bf8", "x", "exp_avg=bf16,,"]),
        ("fsdp_reduce_dtype", ["", "fp32", "bf16", "fp8"]),
        ("grad_dtype", ["", "fp32", "bf16", "fp16", "fp8"]),
        ("zero", [0, 1, 2, 3, 4]),
        # not "null": the test backend costs every op 1 ns, so its MFU is meant to be impossible
        ("backend", ["a100-80gb", "h100-sxm", "h200", "b200", "gb200", "gb300", "tpu-v5p", "tpu-v4", "tpu-v6e",
                     "cpu-x86", "nope"]),
        ("framework", ["megatron", "megatron-bridge", "nemo", "torchtitan", "torchtitan-2025", "maxtext",
                       "deepspeed", "composer", "eager", "nope"]),
        ("attention", ["flash", "math"]),
        ("moe_dispatcher", ["alltoall", "deepep", "hybridep"]),
        ("cp_comm", ["p2p", "all_gather", "a2a", "a2a+p2p", "ring"]),
        ("cp_a2a", [0, 1, 2, 3, 4]),
        ("pp_balance", ["uniform", "cost"]),
        ("offload_layers", [0, 1, 2]),
        ("loss_chunks", [1, 2, 4]),
    ):  # fmt: skip
        if rng.random() < 0.4:
            opts[key] = rng.choice(values)
    for key in (
        "sp",
        "tp_overlap",
        "moe_ep_overlap",
        "moe_fused_mlp",
        "fp8_attention",
        "offload_optimizer",
        "offload_params",
        "offload_overlap",
    ):
        if rng.random() < 0.2:
            opts[key] = rng.random() < 0.5

    def run() -> None:
        _, plan, cluster = plan_from_options("fuzz", opts)
        check_report(lower(cfg, plan, cluster).report)

    return run


def valid_layouts(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A layout built to be legal (degrees that divide, a format the device runs, each feature with what it needs),
    so that the inputs reach the passes and the timeline rather than the plan's checks: the mixes of parallelism,
    precision, recompute, dispatcher and overlap a search or a published recipe would try."""
    from echosim.compiler import lower
    from echosim.frontend.zoo import ArchConfig
    from echosim.plan import plan_from_options

    arch = rng.choice(["gpt", "llama", "moe"])
    heads = rng.choice([4, 8])
    experts = rng.choice([4, 8]) if arch == "moe" else 0
    layers = rng.choice([2, 4, 8])
    # a MoE model may open with dense layers (DeepSeek) and carry shared experts
    dense = min(rng.choice([0, 0, 1, layers // 2]), layers - 2) if experts else 0  # two MoE layers fold
    cfg = ArchConfig(arch, layers=layers, hidden=heads * 32, heads=heads, vocab=1024, seq_len=rng.choice([128, 512]),
                     ffn=256, kv_heads=rng.choice([1, heads]) if arch != "gpt" else heads, experts=experts,
                     top_k=2 if experts else 0, moe_ffn=64 if experts else 0, dense_layers=dense,
                     shared_experts=rng.choice([0, 1]) if experts else 0,
                     sliding_window=rng.choice([0, 0, 0, 64]) if arch != "gpt" else 0)  # fmt: skip
    blackwell = ["b200", "gb200", "gb300", "b300"]
    backend = rng.choice(["a100-80gb", "h100-sxm", "h200", *blackwell])
    tp, pp, cp = rng.choice([1, 2]), rng.choice([1, 2]), rng.choice([1, 2, 4])
    dp = rng.choice([1, 2, 4])
    vpp = rng.choice([1, 2]) if pp > 1 and layers >= 2 * pp * 2 else 1
    micro = rng.choice([1, 2])
    opts: dict[str, Any] = {
        "backend": backend, "tp": tp, "pp": pp, "cp": cp, "dp": dp, "micro_batch": micro,
        "global_batch": micro * dp * rng.choice([1, 2, 4]) * (pp if pp > 1 else 1),
        "devices": tp * pp * cp * dp, "vpp": vpp,
        "framework": rng.choice(["megatron", "megatron-bridge", "nemo", "torchtitan", "eager", "deepspeed", "hai-llm"]),
        "recompute": rng.choice(["none", "selective", "full", "selective:mlp", "selective:moe,layernorm",
                                 "selective:shared_experts,moe_act", "full:1", "full:2", "full:5",
                                 "full:uniform-2", "full:uniform-4"]),
        "zero": rng.choice([0, 1, 3] if pp == 1 else [0, 1]),
        "sp": tp > 1 and rng.random() < 0.5,
        "optimizer_dtypes": rng.choice(["", "", "exp_avg=bf16,exp_avg_sq=bf16", "main_grads=bf16,main_params=fp16"]),
        "grad_dtype": rng.choice(["", "", "bf16"]),
    }  # fmt: skip
    if vpp > 1:
        opts["schedule"] = "interleaved"
    formats = ["bf16", "fp8"] + (["mxfp8", "nvfp4"] if backend in blackwell else [])
    opts["dtype"] = rng.choice(formats)
    if experts:
        ep = rng.choice([e for e in (1, 2, 4) if (tp * cp * dp) % e == 0 and experts % e == 0])
        opts["ep"] = ep
        if ep > 1:
            opts["moe_dispatcher"] = rng.choice(["alltoall", "deepep", "hybridep"])
            opts["moe_ep_overlap"] = pp == 1 and rng.random() < 0.3
        opts["moe_fused_mlp"] = opts["dtype"] in ("mxfp8", "nvfp4") and rng.random() < 0.3
    if opts["dtype"] != "bf16" and backend in blackwell:
        opts["fp8_attention"] = rng.random() < 0.3
    if tp > 1 and opts["sp"]:
        opts["tp_overlap"] = rng.random() < 0.5
    if rng.random() < 0.2:
        opts["loss_chunks"] = rng.choice([2, 4])
    if opts["zero"] >= 1 and rng.random() < 0.2:  # ZeRO-Offload: the host steps the rank's shard
        opts["offload_optimizer"] = True
        opts["offload_params"] = opts["zero"] == 3 and rng.random() < 0.5  # and, under ZeRO-3, keeps its weights
        opts["offload_overlap"] = rng.random() < 0.5
    if cp > 1:  # a scheme that runs the model: the ring has no sliding window, a2a needs whole heads per rank
        whole = cfg.kv_heads % (tp * cp) == 0 and cfg.heads % (tp * cp) == 0
        # a2a+p2p: all-to-all groups of a proper divisor of cp whose tp x a2a ranks hold whole heads, then the ring
        groups = [a for a in range(2, cp) if cp % a == 0 and cfg.kv_heads % (tp * a) == 0 and cfg.heads % (tp * a) == 0]
        ring = [] if cfg.sliding_window else ["p2p", *(["a2a+p2p"] if groups else [])]
        opts["cp_comm"] = rng.choice(["all_gather", *(["a2a"] if whole else []), *ring])
        if opts["cp_comm"] == "a2a+p2p" and rng.random() < 0.5:
            opts["cp_a2a"] = rng.choice(groups)

    def run() -> None:
        _, plan, cluster = plan_from_options("fuzz", opts)
        check_report(lower(cfg, plan, cluster).report)

    return run


def embeddings(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A small DLRM with random tables sharded a random way (an unknown type among them) over random
    data-parallel ranks and nodes: TorchRec's five types, ``auto``, tables that fit nowhere, partial nodes."""
    from functools import partial

    from echosim.compiler import lower
    from echosim.frontend.zoo_torch import TorchZooModel, dlrm_module
    from echosim.plan import plan_from_options

    count = rng.choice([1, 2, 3, 5])
    rows = tuple(rng.choice([3, 100, 5000, 200_000, 40_000_000]) for _ in range(count))
    pooling = tuple(rng.choice([1, 2, 4]) for _ in range(count))
    dim = rng.choice([4, 16, 64, 128, 256, 520])
    build = partial(dlrm_module, rows, pooling, dim, 13, (32, dim), (32, 1), 1, 8)
    inputs = ((("batch", 13), "float32"), (("batch", sum(pooling)), "int64"))
    model = TorchZooModel(f"fuzz-dlrm-{abs(hash((rows, pooling, dim))) % 10**6}", build, inputs, "fuzz DLRM", "queries")
    dp = rng.choice([1, 2, 4, 8, 12, 16, 32])
    opts: dict[str, Any] = {
        "dp": dp, "devices": dp, "micro_batch": rng.choice([1, 8, 64]),
        "embedding_sharding": rng.choice(["table", "row", "column", "data", "table_row", "auto", "none", "grid"]),
        "backend": rng.choice(["a100-40gb", "h100-sxm", "tpu-v5e", "cpu-x86"]),
        "dtype": rng.choice(["fp32", "bf16"]),
    }  # fmt: skip
    if rng.random() < 0.5:
        opts["devices_per_node"] = rng.choice([1, 2, 4, 8])
    if rng.random() < 0.2:  # refused: tables shard over data-parallel ranks only
        opts["tp"], opts["devices"] = 2, 2 * dp

    def run() -> None:
        _, plan, cluster = plan_from_options("fuzz", opts)
        check_report(lower(model, plan, cluster).report)

    return run


def cases_csv(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A cases.csv-shaped file: real rows with cells replaced, dropped, added or the file truncated."""
    from echosim.validation.cases import read_cases

    source = ROOT.parent.parent / "shared" / "validation" / "cases.csv"
    source = source if source.is_file() else Path("/work/shared/validation/cases.csv")
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = list(csv.reader(io.StringIO("".join([lines[0], *rng.sample(lines[1:], min(3, len(lines) - 1))]))))
    text = _mutate_table(rng, rows)
    path = work / "cases.csv"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return lambda: read_cases(path)


def microbench_csv(rng: random.Random, work: Path) -> Callable[[], Any]:
    from echosim.validation.microbench import validate_microbench

    source = Path("/work/shared/validation/microbench.csv")
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    rows = list(csv.reader(io.StringIO("".join([lines[0], *rng.sample(lines[1:], min(3, len(lines) - 1))]))))
    path = work / "microbench.csv"
    path.write_text(_mutate_table(rng, rows), encoding="utf-8", errors="surrogatepass")
    return lambda: validate_microbench(path)


def _mutate_table(rng: random.Random, rows: list[list[str]]) -> str:
    for _ in range(rng.randint(1, 4)):
        if len(rows) < 2:
            break
        r = rng.randrange(1, len(rows))
        row = rows[r]
        move = rng.random()
        if move < 0.5 and row:
            c = rng.randrange(len(row))
            row[c] = rng.choice([*TEXT, str(rng.choice(EDGE_INTS)), row[rng.randrange(len(row))]])
        elif move < 0.65 and row:
            del row[rng.randrange(len(row))]
        elif move < 0.8:
            row.insert(rng.randrange(len(row) + 1), rng.choice(TEXT))
        elif move < 0.9:
            rows[r] = rows[0][:]  # a repeated header or case_id
        else:
            rows[0][rng.randrange(len(rows[0]))] = rng.choice(TEXT)
    out = io.StringIO()
    csv.writer(out).writerows(rows)
    text = out.getvalue()
    if rng.random() < 0.2:
        text = text[: rng.randrange(len(text) + 1)]
    return text


TOML_KEYS = ["model", "backend", "devices", "devices_per_node", "tp", "pp", "dp", "micro_batch", "global_batch",
             "seq_len", "dtype", "recompute", "zero", "sp", "passes", "max_step_time_s", "max_memory_gib",
             "min_mfu", "bogus"]  # fmt: skip
TOML_VALUES = ['"gpt3-1.3b"', '"no-such-model"', '"two"', "5", "0", "-3", "1.5", "true", "[]", '["x"]', "{}",
               "nan", "inf", "9223372036854775807", '""', "[1, 2]"]  # fmt: skip


def tool_echosim(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A [tool.echosim] table with random keys and values, run up to the point a model would be captured."""
    from echosim.check import load_config, run_check

    lines = ["[tool.echosim]"]
    for key in rng.sample(TOML_KEYS, rng.randint(0, 3)):
        lines.append(f"{key} = {rng.choice(TOML_VALUES)}")
    if rng.random() < 0.1:
        lines.append(f"check = {rng.choice(TOML_VALUES)}")
    for _ in range(rng.randint(0, 2)):
        lines.append("[[tool.echosim.check]]")
        lines.append('model = "no-such-model"' if rng.random() < 0.8 else f"model = {rng.choice(TOML_VALUES)}")
        for key in rng.sample(TOML_KEYS[1:], rng.randint(0, 4)):
            lines.append(f"{key} = {rng.choice(TOML_VALUES)}")
    text = "\n".join(lines) + "\n"
    if rng.random() < 0.1:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / "pyproject.toml"
    path.write_text(text)

    def run() -> None:
        config = load_config(path)  # a Config since issue 17's typed schema
        for i, entry in enumerate(config.entries):
            run_check(entry, config.defaults, i, config.path.parent)

    return run


def calibration_db(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A calibration database with odd schemas, values and bytes; reading it must leave it unchanged."""
    from echosim.backends.loading import load_backend
    from echosim.calibrate import apply_calibration
    from echosim.ir.graph import Graph
    from echosim.ir.ops import MatmulAttrs, OpKind
    from echosim.ir.types import DType, TensorSpec

    path = work / f"cal{rng.randrange(10**9)}.sqlite"
    kind = rng.random()
    if kind < 0.15:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 100, 4096]))))
    else:
        conn = sqlite3.connect(path)
        tables = {
            "measurements": ["backend", "op", "shape", "dtype", "seconds", "source"],
            "calibrations": ["name", "backend", "machine", "created", "source"],
            "parameters": ["name", "backend", "param", "value", "what"],
            "users": ["id", "name"],
        }
        for table, columns in tables.items():
            if rng.random() < 0.6:
                cols = [c for c in columns if rng.random() < 0.9]
                if not cols:
                    continue
                conn.execute(f"CREATE TABLE {table} ({', '.join(cols)})")
                for _ in range(rng.randint(0, 3)):
                    values = [_cell(rng, c) for c in cols]
                    conn.execute(f"INSERT INTO {table} VALUES ({', '.join('?' * len(cols))})", values)
        conn.commit()
        conn.close()
        if rng.random() < 0.1:
            data = path.read_bytes()
            path.write_bytes(data[: rng.randrange(len(data) + 1)])
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    def run() -> None:
        try:
            backend = apply_calibration(load_backend("a100-80gb"), str(path))
            g = Graph("probe")
            node = g[g.add(OpKind.MATMUL, [], TensorSpec((64, 64), DType.BF16), MatmulAttrs(64, 64, 64))]
            backend.op_time_s(node, 3 * 64 * 64 * 2)
        finally:
            if hashlib.sha256(path.read_bytes()).hexdigest() != before:
                raise Broken(f"reading {path.name} changed it")

    return run


def _cell(rng: random.Random, column: str) -> Any:
    if column == "backend":
        return rng.choice(["a100-80gb", "x", "a100-80gb@c", None])
    if column == "op":
        return rng.choice(["matmul", "attention", None, 3])
    if column == "shape":
        return rng.choice(["m=64,n=64,k=64,batch=1", "", None])
    if column == "dtype":
        return rng.choice(["bf16", "-", None])
    if column in ("seconds", "value"):
        return rng.choice([1e-3, 0.0, -1.0, float("inf"), "fast", None, 1e30, 2**62, b"\x00"])
    if column == "machine":
        return rng.choice(['{"gpu": "x"}', "{not json", None, "[]", "3"])
    if column == "name":
        return rng.choice(["c", "", None, "a#b"])
    return rng.choice(["x", None, 1, ""])


ONNX_OPS = ["MatMul", "Add", "Relu", "Gemm", "Softmax", "Reshape", "ConstantOfShape", "Range", "Expand", "Concat",
            "Transpose", "Gather", "Unsqueeze", "Shape", "Cast", "Where", "LayerNormalization", "Nonsense", "LSTM",
            "GRU", "RNN", "Conv", "ConvTranspose"]  # fmt: skip


def onnx_model(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A small ONNX model with its structure mutated (ops, inputs, dims, constants) or its bytes truncated."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from echosim.compiler import lower
    from echosim.plan import Cluster, Plan

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rng.choice(["batch", 2, 0, -1]), 16])
    consts = [
        numpy_helper.from_array(np.zeros((16, rng.choice([8, 0, 16])), np.float32), "w"),
        numpy_helper.from_array(np.array(rng.choice([[2, 8], [40000, 40000], [-1], [0]]), np.int64), "s"),
        numpy_helper.from_array(np.array(rng.choice([0, 5]), np.int64), "a"),
        numpy_helper.from_array(np.array(rng.choice([16, 10**10, -5]), np.int64), "b"),
        numpy_helper.from_array(np.array(rng.choice([1, 0, -1]), np.int64), "c"),
    ]
    names = ["x", "w", "s", "a", "b", "c"]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"])]
    for i in range(rng.randint(0, 4)):
        op = rng.choice(ONNX_OPS)
        arity = {"Range": 3, "Where": 3, "Gemm": 2, "MatMul": 2, "Add": 2, "Expand": 2, "Reshape": 2, "Gather": 2,
                 "LSTM": 3, "GRU": 3, "RNN": 3, "Conv": 2, "ConvTranspose": 2}  # fmt: skip
        inputs = [rng.choice([*names, f"h{i}", "undefined"]) for _ in range(arity.get(op, 1))]
        nodes.append(helper.make_node(op, inputs, [f"h{i + 1}"]))
        names.append(f"h{i + 1}")
    if rng.random() < 0.1:
        rng.shuffle(nodes)  # out of order, maybe a cycle
    y = helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph(nodes, "fuzz", [x], [y], consts))
    model.opset_import[0].version = 17
    data = model.SerializeToString()
    if rng.random() < 0.2:
        data = data[: rng.randrange(len(data) + 1)]
    elif rng.random() < 0.1:
        flip = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            flip[rng.randrange(len(flip))] = rng.randrange(256)
        data = bytes(flip)
    path = work / f"m{rng.randrange(10**9)}.onnx"
    path.write_bytes(data)
    _ = onnx  # imported for the helpers above

    return lambda: check_report(lower(str(path), Plan(), Cluster("a100-80gb", 1)).report)


def hf_config(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A transformers config with values replaced or keys dropped, read and built (not captured: seconds each)."""
    from echosim.frontend.hf import build_config

    source = rng.choice(sorted((ROOT / "tests" / "configs").glob("*.json")))
    data = json.loads(source.read_text())
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(sorted(data))
        move = rng.random()
        if move < 0.3:
            del data[key]
        else:
            data[key] = rng.choice([0, -1, 10**6, 2**41, 1.5, "x", None, [], {}, True, copy.deepcopy(data)])
    text = json.dumps(data)
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / f"c{rng.randrange(10**9)}"
    path.mkdir()
    (path / "config.json").write_text(text)
    return lambda: build_config(path / "config.json")


#: Values a mutated launch line gives a flag: numbers, odd text, layouts and --moe-layer-freq patterns.
_FLAG_VALUES = ["0", "-1", "1", "3", "8", "1024", "1e309", "nan", "x", "", "Et|(tt|)*30L", "E|tL", "(t|)*3L",
                "([0]*3+[1]*58)", "[1]*4", "([0]+[1])*", "mxfp8", "blockwise", "selective", "moe_act", "mlp", "block",
                "uniform", "full", "bf16", "fp16", "fp8",
                '"', "'", "$((1/0))", "${X:-", "<<EOF"]  # fmt: skip


#: Megatron-LM's uneven pipeline-split flags, which the reader turns into a layout.
_SPLIT_FLAGS = ["--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]  # fmt: skip


def megatron_config(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A Megatron-LM launch script or file of arguments (tests/data/configs/megatron) or a Megatron-Bridge
    ConfigContainer (configs/mbridge) with words dropped, values replaced or inserted, or the text cut short; read,
    resolved and laid out as ``compile --from megatron:`` / ``mbridge:`` does."""
    from echosim.configs import read_source, resolve

    configs = ROOT / "tests" / "data" / "configs"
    source = rng.choice(sorted([*(configs / "megatron").glob("*"), *(configs / "mbridge").glob("*.yaml")]))
    reader = "mbridge" if source.suffix == ".yaml" else "megatron"
    words = source.read_text().split(" ") if reader == "megatron" else source.read_text().split(": ")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(words))
        move = rng.random()
        if move < 0.3:
            del words[i]
        elif move < 0.8:
            words[i] = rng.choice(_FLAG_VALUES) if not words[i].startswith("--") else words[i]
            if words[i].startswith("--") and i + 1 < len(words):
                words[i + 1] = rng.choice(_FLAG_VALUES)
        elif move < 0.9:
            words.insert(i, rng.choice(_FLAG_VALUES))
        else:  # a pipeline-split flag with a value, or a switch
            more = ["--recompute-modules", "--recompute-method", "--recompute-num-layers",
                    "--use-precision-aware-optimizer", "--exp-avg-dtype", "--main-params-dtype", "--use-megatron-fsdp",
                    "--megatron-fsdp-grad-comm-dtype", "--megatron-fsdp-main-grads-dtype", "--grad-reduce-in-bf16",
                    "--accumulate-allreduce-grads-in-fp32"]  # fmt: skip
            flag = rng.choice([*_SPLIT_FLAGS, *more])
            switch = flag.startswith(("--account", "--use-", "--grad-reduce", "--accumulate"))
            words[i:i] = [flag] if switch else [flag, rng.choice(_FLAG_VALUES)]
    text = " ".join(words)
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / f"m{rng.randrange(10**9)}{source.suffix}"
    path.write_text(text)
    model = rng.choice([None, "deepseek-v3", "llama3-8b"])

    def run() -> Any:
        from echosim.commands.options import layout_from_options

        chosen, opts = resolve(read_source(f"{reader}:{path}"), {}, model)
        return layout_from_options(chosen, opts, False)  # the plan and cluster compile would simulate

    return run


#: Values a mutated MaxText config gives a key.
_YAML_VALUES = ["0", "-1", "1", "3", "8", "1024", "1e309", ".nan", "x", "''", "[]", "{}", "null", "true", "mla",
                "local_sliding", "deepseek", "mixtral", "gpt3", "sigmoid", "[silu, linear]",
                "'unterminated"]  # fmt: skip


def maxtext_config(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A MaxText model config (tests/data/configs/maxtext/models) with lines dropped, values replaced or keys
    overridden on the command line, or the text cut short; read with the base config, resolved and laid out as
    ``compile --from maxtext:`` does."""
    from echosim.configs import read_source, resolve

    configs = ROOT / "tests" / "data" / "configs" / "maxtext"
    source = rng.choice(sorted((configs / "models").glob("*.yml")))
    lines = [ln for ln in source.read_text().splitlines() if ln and not ln.startswith("#")]
    keys = [ln.split(":")[0] for ln in lines]
    overrides = []
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        move = rng.random()
        if move < 0.3:
            del lines[i], keys[i]
        elif move < 0.7:
            lines[i] = f"{keys[i]}: {rng.choice(_YAML_VALUES)}"
        else:  # a key of the model's, or one of base.yml's that changes memory
            key = rng.choice([*keys, "mu_dtype", "weight_dtype"])
            overrides.append(f"{key}={rng.choice([*_YAML_VALUES, 'bfloat16', 'float32'])}")
        if not lines:
            break
    text = "\n".join(lines)
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / f"x{rng.randrange(10**9)}.yml"
    path.write_text(text)

    def run() -> Any:
        from echosim.commands.options import layout_from_options

        spec = f"{configs / 'base.yml'},{path} {' '.join(overrides)} ici_fsdp_parallelism=4"
        chosen, opts = resolve(read_source(f"maxtext:{spec}"), {"backend": "tpu-v5p"}, None)
        return layout_from_options(chosen, opts, False)

    return run


def nemo_config(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A NeMo-Framework-Launcher training YAML (tests/data/configs/nemo) with lines dropped or values replaced,
    the optimizer renamed or given a ``grad_sync_dtype``, or the text cut short; read, resolved and laid out as
    ``compile --from nemo:`` does (the model named where the YAML leaves the vocabulary to a tokenizer file)."""
    from echosim.configs import read_source, resolve

    source = rng.choice(sorted((ROOT / "tests" / "data" / "configs" / "nemo").glob("*.yaml")))
    lines = [ln for ln in source.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        key = lines[i].strip().split(":")[0]
        move = rng.random()
        if move < 0.25 and ":" in lines[i] and not lines[i].rstrip().endswith(":"):
            del lines[i]
        elif move < 0.6 and ":" in lines[i] and not lines[i].rstrip().endswith(":"):
            lines[i] = f"{indent}{key}: {rng.choice(_YAML_VALUES)}"
        else:
            at = next((j for j, ln in enumerate(lines) if ln.strip() == "optim:"), None)
            if at is not None:
                value = rng.choice(["fp32", "bf16", "16", "32", "fp8", "x", "distributed_fused_adam",
                                    "mcore_distributed_optim", "fused_adam"])  # fmt: skip
                field = rng.choice(["grad_sync_dtype", "name"])
                lines.insert(at + 1, f"    {field}: {value}")
    text = "\n".join(lines)
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / f"n{rng.randrange(10**9)}.yaml"
    path.write_text(text)
    model = "llama2-7b" if "llama" in source.name else None

    def run() -> Any:
        from echosim.commands.options import layout_from_options

        chosen, opts = resolve(read_source(f"nemo:{path}"), {"devices": 128}, model)
        return layout_from_options(chosen, opts, False)

    return run


#: Values a mutated DeepSpeed config gives a key (JSON): numbers, odd types and the dtype spellings it reads.
_JSON_VALUES: list[Any] = [0, -1, 1, 3, 2.5, None, True, False, "", "x", "auto", [], [1], {}, {"enabled": True},
                           "fp32", "bf16", "fp16", "bfloat16", "half", "fp8"]  # fmt: skip


def deepspeed_config(rng: random.Random, work: Path) -> Callable[[], Any]:
    """A DeepSpeed config (tests/data/configs/deepspeed) with keys dropped, values replaced or keys added (among
    them ``data_types.grad_accum_dtype``), or the text cut short; read, resolved and laid out for GPT-3 125M as
    ``compile gpt3-125m --from deepspeed:`` does."""
    from echosim.configs import read_source, resolve

    source = rng.choice(sorted((ROOT / "tests" / "data" / "configs" / "deepspeed").glob("*.json")))
    data = json.loads(source.read_text())
    for _ in range(rng.randint(1, 4)):
        section = data
        if rng.random() < 0.5 and isinstance(data.get("zero_optimization"), dict):
            section = data["zero_optimization"]
        move = rng.random()
        if move < 0.3 and section:
            del section[rng.choice(sorted(section))]
        elif move < 0.7 and section:
            section[rng.choice(sorted(section))] = copy.deepcopy(rng.choice(_JSON_VALUES))
        elif move < 0.85:
            data["data_types"] = {"grad_accum_dtype": copy.deepcopy(rng.choice(_JSON_VALUES))}
        else:
            key = rng.choice(["data_types", "stage", "bf16", "fp16", "train_batch_size", "gradient_accumulation_steps"])
            data[key] = copy.deepcopy(rng.choice(_JSON_VALUES))  # a fresh object: the mutations nest it
    text = json.dumps(data)
    if rng.random() < 0.15:
        text = text[: rng.randrange(len(text) + 1)]
    path = work / f"d{rng.randrange(10**9)}.json"
    path.write_text(text)

    def run() -> Any:
        from echosim.commands.options import layout_from_options

        chosen, opts = resolve(read_source(f"deepspeed:{path}"), {"devices": 8}, "gpt3-125m")
        return layout_from_options(chosen, opts, False)

    return run


TARGETS: dict[str, Callable[[random.Random, Path], Callable[[], Any]]] = {
    "layouts": layouts,
    "valid-layouts": valid_layouts,
    "embeddings": embeddings,
    "cases": cases_csv,
    "microbench": microbench_csv,
    "tool-echosim": tool_echosim,
    "calibration-db": calibration_db,
    "onnx": onnx_model,
    "hf-config": hf_config,
    "megatron-config": megatron_config,
    "maxtext-config": maxtext_config,
    "deepspeed-config": deepspeed_config,
    "nemo-config": nemo_config,
}


def fuzz_one(target: str, seed: int, limit_s: float = 20.0) -> tuple[str, str]:
    """One input of ``target`` made from ``seed``, and how it ended."""
    rng = random.Random(f"{target}:{seed}")
    with tempfile.TemporaryDirectory(prefix="echosim-fuzz-") as tmp:
        try:
            fn = TARGETS[target](rng, Path(tmp))
        except Exception:
            return "traceback", "generator: " + traceback.format_exc(limit=-2)[-400:]
        return attempt(fn, limit_s)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="inputs per target")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--limit-s", type=float, default=20.0, help="wall-clock limit per input")
    args = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    import onnx  # noqa: F401  (libraries imported before any input is timed: an import cut short is not an input's fault)
    import torch  # noqa: F401
    import transformers  # noqa: F401

    from echosim.compiler import lower
    from echosim.frontend.zoo import ArchConfig
    from echosim.plan import Cluster, Plan
    from echosim.plugins import get_registry

    get_registry()
    lower(ArchConfig("llama", layers=2, hidden=64, heads=2, vocab=256, seq_len=16, ffn=64), Plan(), Cluster("null", 1))
    total: Counter[str] = Counter()
    clean = True
    print(f"{'target':16s} {'inputs':>7s} {'result':>7s} {'error':>7s} {'tb':>4s} {'hang':>5s} {'inv':>4s} {'s':>7s}")
    for target in args.targets.split(","):
        tally = Tally()
        start = time.monotonic()
        for i in range(args.n):
            outcome, detail = fuzz_one(target, args.seed * 1_000_003 + i, args.limit_s)
            tally.add(outcome, f"seed {args.seed * 1_000_003 + i}: {detail}")
        c = tally.counts
        print(f"{target:16s} {args.n:7d} {c['result']:7d} {c['error']:7d} {c['traceback']:4d} {c['hang']:5d} "
              f"{c['invariant']:4d} {time.monotonic() - start:7.1f}", flush=True)  # fmt: skip
        for failure in tally.failures:
            print("   ", failure.replace("\n", "\n    "))
        total.update(c)
        clean &= not (c["traceback"] or c["hang"] or c["invariant"])
    print(f"{'total':16s} {sum(total.values()):7d} {total['result']:7d} {total['error']:7d} {total['traceback']:4d} "
          f"{total['hang']:5d} {total['invariant']:4d}")  # fmt: skip
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
