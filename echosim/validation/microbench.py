"""Predicted vs measured for files shaped like ``microbench.csv`` (GEMMs, attention, STREAM, collectives).

Each row is turned into one probe of a registered backend: a compute node costed with
``op_time_s`` or a collective costed with ``collective_time_s`` on the row's placement,
and the prediction is expressed in the row's own metric (TFLOP/s, bus bandwidth, µs,
TB/s). Rows that name hardware without a backend, a kernel the models do not cost, or
no single size are skipped with the reason, never silently dropped.

Errors are grouped per (device, op), the device as the file names it (so one chip measured
by two harnesses, nccl-tests and XLA's tables, gives two groups): matmuls per dtype,
collectives per scope (inside one NVLink domain or across nodes) and regime (messages of
at least 1 MiB, where bus bandwidth matters and Echo's targets apply, or smaller ones,
where launch and latency dominate), XLA's table apart. Collectives are predicted under the
NCCL settings of the harness that measured them (:func:`harness_nccl`).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from echosim.backends.base import Placement
from echosim.backends.collectives import NCCL_P2P_CALL_US, NcclConfig
from echosim.backends.device_names import backend_for_device, backend_on_network, network_for_system
from echosim.errors import EchosimError
from echosim.ir.graph import Node
from echosim.ir.ops import AttentionAttrs, ElementwiseAttrs, MatmulAttrs, OpKind
from echosim.ir.types import DType, TensorSpec

COLUMNS = (
    "source",
    "device",
    "system",
    "op",
    "dtype",
    "shape",
    "size_bytes",
    "num_devices",
    "num_nodes",
    "metric",
    "value",
    "notes",
)
MiB = 2**20
# "large" in a row means the top of an nccl-tests sweep; nccl-tests sweeps stop at 8 GiB.
LARGE_BYTES = 8 * 2**30
# Mean absolute percentage error targets per group kind: compute and >= 1 MiB collectives from
# issue 4 (Echo's collective targets), messages under 1 MiB and XLA's table from issue 16.
TARGETS = {
    "matmul": 0.10,
    "memory-bound": 0.10,
    "intra-node": 0.08,
    "inter-node": 0.14,
    "small": 0.15,
    "xla": 0.12,
}
XLA_GROUP = "XLA table"

COLLECTIVE_OPS: tuple[tuple[str, OpKind], ...] = (
    (r"^all[_-]reduce", OpKind.ALL_REDUCE),
    (r"^all[_-]gather", OpKind.ALL_GATHER),
    (r"^reduce[_-]scatter", OpKind.REDUCE_SCATTER),
    (r"^all-?to-?all|^alltoall", OpKind.ALL_TO_ALL),
    (r"^collective-permute|^sendrecv", OpKind.SEND),
)


class MicrobenchError(EchosimError):
    pass


@dataclass(frozen=True)
class Probe:
    """What one row measures, ready to be predicted by a backend."""

    backend: str
    op: str  # group label: "matmul bf16", "memory-bound", "all_reduce", ...
    scope: str  # "single device", "intra-node", "inter-node"
    predict: Callable[[Any], float]  # backend -> value in the row's metric
    regime: str = ""  # collectives: ">=1MiB" or "<1MiB"
    settings: dict[str, Any] = field(default_factory=dict)  # the harness's software stack (GPUBackend.variant)


@dataclass
class RowResult:
    line: int
    device: str
    op: str
    metric: str
    measured: float | None
    backend: str = ""
    group: str = ""
    predicted: float | None = None
    skipped: str = ""

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured - 1.0

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "line": self.line,
            "device": self.device,
            "op": self.op,
            "metric": self.metric,
            "measured": self.measured,
        }
        if self.skipped:
            d["skipped"] = self.skipped
        else:
            d.update(backend=self.backend, group=self.group, predicted=self.predicted, error=self.error)
        return d


@dataclass
class MicrobenchValidation:
    rows: list[RowResult] = field(default_factory=list)

    def groups(self) -> dict[str, dict[str, Any]]:
        """MAPE per (device, op[, scope, regime]) group, with the target where the issue sets one."""
        errs: dict[str, list[float]] = {}
        for r in self.rows:
            if r.error is not None:
                errs.setdefault(r.group, []).append(abs(r.error))
        out = {}
        for name, values in sorted(errs.items()):
            target = _target(name)
            mape = statistics.mean(values)
            out[name] = {
                "rows": len(values),
                "mape": mape,
                "max": max(values),
                "target": target,
                "meets": None if target is None else mape <= target,
            }
        return out

    def as_dict(self) -> dict[str, Any]:
        predicted = sum(1 for r in self.rows if not r.skipped)
        return {
            "rows": [r.as_dict() for r in self.rows],
            "groups": self.groups(),
            "predicted": predicted,
            "skipped": len(self.rows) - predicted,
        }


def _target(group: str) -> float | None:
    if "| matmul" in group:
        return TARGETS["matmul"]
    if "| memory-bound" in group:
        return TARGETS["memory-bound"]
    if "| <1MiB" in group:
        return TARGETS["small"]
    if "| >=1MiB" in group:
        if group.endswith(XLA_GROUP):
            return TARGETS["xla"]
        return TARGETS["inter-node" if "inter-node" in group else "intra-node"]
    return None


# ---- reading ---------------------------------------------------------------------------


def read_rows(path: str | Path) -> list[tuple[int, dict[str, str]]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise MicrobenchError(f"{path}: missing column(s) {', '.join(missing)}")
            rows = []
            for i, row in enumerate(reader):
                if None in row:
                    raise MicrobenchError(f"{path}: line {reader.line_num}: more cells than the header has columns")
                if None in row.values():
                    raise MicrobenchError(f"{path}: line {reader.line_num}: fewer cells than the header has columns")
                rows.append((i + 2, row))
            return rows
    except OSError as exc:
        raise MicrobenchError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise MicrobenchError(f"{path}: not a UTF-8 CSV file") from None
    except csv.Error as exc:
        raise MicrobenchError(f"{path}: not a CSV file: {exc}") from None


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _size(row: dict[str, str]) -> int | None:
    if row["size_bytes"].strip():
        value = _number(row["size_bytes"])
        return int(value) if value is not None else None
    shape = row["shape"].strip().lower()
    if shape.startswith("large"):
        return LARGE_BYTES
    m = re.match(r"^(\d+(?:\.\d+)?)\s*(k|m|g)i?b\b", shape)
    if not m:
        return None
    return int(float(m.group(1)) * {"k": 2**10, "m": 2**20, "g": 2**30}[m.group(2)])


def _dims(shape: str) -> dict[str, int]:
    return {k.lower(): int(v) for k, v in re.findall(r"\b(\w+)=(\d+)", shape)}


def _gemm_dims(shape: str) -> tuple[int, int, int, int] | None:
    d = _dims(shape)
    if {"m", "n", "k"} <= d.keys():
        return d.get("b", 1), d["m"], d["n"], d["k"]
    m = re.fullmatch(r"\s*(\d+)x(\d+)x(\d+)\s*", shape)  # mamf-finder prints MxNxK
    if m:
        return 1, int(m.group(1)), int(m.group(2)), int(m.group(3))
    return None


def _gemm_dtype(text: str) -> str | None:
    t = text.lower()
    if t.startswith(("f8", "fp8")):
        return "fp8"
    if t.startswith(("f4", "fp4", "nvfp4")):
        return "nvfp4"  # e2m1 elements: block-scaled FP4 (NVFP4BlockScaling) is what the backends cost
    if t.startswith("bf16"):
        return "bf16"
    if t.startswith("fp16") or t.startswith("f16"):
        return "fp16"
    return None


# ---- probes ----------------------------------------------------------------------------


def _node(op: OpKind, attrs: Any, dtype: str) -> Node:
    return Node(0, op, (), TensorSpec((1,), DType(dtype)), attrs)


# mamf-finder's search (stas00/ml-engineering compute/accelerator/benchmarks/README.md: "a super long exhaustive
# search", the range it gives for H100): m, n and k from 0 to 20480 in steps of 256; the tool reports the
# fastest shape it met. The table's best shapes all lie on that grid (1024x10240x5120 ... 19456x5120x1536).
MAMF_SEARCH = range(256, 20480 + 1, 256)


def _gemm_node(b: int, m: int, n: int, k: int, dtype: str) -> Node:
    """A matmul node; a block-scaled format quantises 16-bit operands (passes.precision), as in a step."""
    if dtype in ("mxfp8", "nvfp4"):
        return _node(OpKind.MATMUL, MatmulAttrs(m, n, k, b, precision=dtype), "bf16")
    return _node(OpKind.MATMUL, MatmulAttrs(m, n, k, b), dtype)


def search_best_tflops(be: Any, dtype: str, sizes: range = MAMF_SEARCH) -> float:
    """The model's highest TFLOP/s over mamf-finder's search: what a MAMF row measures.

    A MAMF row is the maximum over its search, and its shape only says where the real part peaked: the
    shape whose real kernels left no wave tail. The model's own tails fall on other shapes, so at the
    row's shape it checks the model's tile quantisation at one shape picked for being tail-free on the
    real part; the device's efficiency is anchored on the row's rate (devices.DeviceSpec), and the
    model's maximum over the same search is what must reproduce it. Only k = the top of the range is
    searched: every term of the modelled time (waves x (a k + c), split-K's reduction, operand bytes
    (m + n) k + m n, the launch) is linear in k with a non-negative intercept, so the rate never falls
    as k grows at a fixed (m, n)."""
    k = sizes[-1]
    best = 0.0
    for m in sizes:
        for n in sizes:
            best = max(best, 2.0 * m * n * k / be.op_time_s(_gemm_node(1, m, n, k, dtype), 0) / 1e12)
    return best


def _has_fp4(backend: str) -> bool:
    """Whether the device has FP4 tensor cores (a backend echosim does not describe decides for itself)."""
    from echosim.backends.devices import DEVICES

    spec = DEVICES.get(backend)
    return spec is None or spec.gemm_eff_fp4 is not None


# XLA's GemmRewriter hands cuBLASLt an FP8 GEMM only as "TN" (A row-major, B column-major: both operands
# K-major, cuBLASLt's FP8 layout rule before Blackwell) and transposes an operand that is not: "On non-Blackwell
# systems, cuBLASLt FP8 GEMM kernels require the first operand ... to be row-major" and "the second operand to be
# column-major" (openxla/xla xla/backends/gpu/transforms/gemm_rewriter.cc, CreateF8CustomCall). Architectures
# that take that path (echosim's names; Ampere has no FP8 tensor cores).
XLA_FP8_TN_ARCHS = frozenset({"hopper"})


def xla_fp8_transposes_b(arch: str, dtype: str) -> bool:
    """Whether XLA runs a transpose of B before an FP8 dot shaped as its matmul table's (B = [b, k, n], n minor)."""
    return dtype == "fp8" and arch in XLA_FP8_TN_ARCHS


def xla_table_kernels_s(be: Any, node: Node, dtype: str) -> list[float]:
    """The kernels XLA runs for one dot of its matmul table, in seconds each.

    The table's dot is ``lhs[b, m, k] x rhs[b, k, n]`` in the default layouts, so B is row-major. On a
    :data:`XLA_FP8_TN_ARCHS` part an FP8 dot becomes a transpose of B (a tiled transpose fusion: B's bytes read
    and written at STREAM rate, one wave's fill and store like a GEMM wave, ``compute.WAVE_FIXED_S``, and a
    launch) and the cuBLASLt GEMM; every other dot is the one GEMM kernel."""
    from echosim.backends.compute import WAVE_FIXED_S, memory_bound_time_s
    from echosim.backends.devices import DeviceSpec

    gemm = be.op_time_s(node, 0)
    dev = getattr(getattr(be, "inner", be), "device", None)  # a plugin's device is its own business
    a = node.attrs
    if not isinstance(dev, DeviceSpec) or not isinstance(a, MatmulAttrs) or not xla_fp8_transposes_b(dev.arch, dtype):
        return [gemm]
    transpose = memory_bound_time_s(dev, 2 * a.batch * a.k * a.n) + WAVE_FIXED_S  # 1-byte elements
    return [transpose, gemm]


def xla_table_dot_s(be: Any, node: Node, dtype: str) -> float:
    """What XLA's matmul table records for a dot: the median duration over every kernel its runs launched.

    ``xla/tools/matmul_perf_table_gen.cc`` (``MatmulPerfTableGen::Profile``) runs the compiled dot 10 times
    (5 x small and large arguments) under a CUPTI kernel tracer and takes ``getMedianKernelTimeNs``: the
    median over all kernel activity records, the mean of the middle two for an even count
    (``xla/service/gpu/model/hlo_op_profiler.cc``, ``CuptiKernelTracer``), not the executable's time.
    Each kernel appears once per run, so that median is the median of one run's kernels: a single GEMM
    reads as itself, a transpose + GEMM pair as their mean."""
    return statistics.median(xla_table_kernels_s(be, node, dtype))


def _azure_cublaslt(row: dict[str, str]) -> bool:
    """A GEMM of the Azure guide's cuBLASLt sweep (superbenchmark's cublaslt_gemm: FP8 with fast accumulation)."""
    return row["op"] == "GEMM (cuBLASLt)" and AZURE_GUIDE in row["source"]


def _matmul_probe(backend: str, row: dict[str, str]) -> Probe | str:
    dtype = _gemm_dtype(row["dtype"])
    if dtype is None:
        return f"dtype {row['dtype']!r} is not costed (bf16, fp16, fp8, fp4)"
    dims = _gemm_dims(row["shape"])
    if dims is None:
        return f"shape {row['shape']!r} gives no m, n, k"
    if row["metric"] != "TFLOPS":
        return f"metric {row['metric']!r} is not TFLOPS"
    if dtype == "nvfp4" and not _has_fp4(backend):
        return f"{backend} has no FP4 tensor cores: an fp4 GEMM is not costed at another format's rate"
    b, m, n, k = dims
    node = _gemm_node(b, m, n, k, dtype)
    flops = 2.0 * b * m * n * k
    # mamf-finder searches shapes and kernels; XLA autotunes; cuBLASLt and PyTorch take the heuristic's pick.
    autotuned = "MAMF" in row["op"] or XLA_TABLE in row["source"]
    if "MAMF" in row["op"] and "best shape" in row["op"]:
        predict = lambda be: search_best_tflops(be, dtype)  # noqa: E731
    elif XLA_TABLE in row["source"]:
        predict = lambda be: flops / xla_table_dot_s(be, node, dtype) / 1e12  # noqa: E731
    else:
        predict = lambda be: flops / be.op_time_s(node, 0) / 1e12  # noqa: E731
    # mamf-finder times 100 iterations a shape after 50 warmup: a short run, not held to the sustained rate.
    # XLA sets FP8 fast accumulation on its DEFAULT-precision dots; torch._scaled_mm (mamf-finder, the H200
    # PyTorch rows) leaves it off (compute.FP8_PROMOTING_ARCHS). Azure's cuBLASLt sweep (superbenchmark
    # cublaslt_utils.cc, which the guide clones) sets CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1 for FP8, under a
    # comment that says "disable": its FP8 rows ran without promotion and are priced so.
    fast = "all" if XLA_TABLE in row["source"] or _azure_cublaslt(row) else "none"
    settings = {"autotuned_gemms": autotuned, "sustained_gemms": "MAMF" not in row["op"], "fp8_fast_accum": fast}
    return Probe(backend, f"matmul {dtype}", "single device", predict, settings=settings)


def _attention_probe(backend: str, row: dict[str, str]) -> Probe | str:
    op = row["op"]
    flash = op.startswith(("FlashAttention", "Flash"))
    if not flash and not op.startswith("attention: standard PyTorch"):
        return f"kernel {op!r} is not costed (flash or unfused PyTorch attention only)"
    if "fwd+bwd" in op or "best case" in op:
        return "an end-to-end or best-case figure, not one kernel at one shape"
    native = {"a100-80gb": "FlashAttention-2", "a100-40gb": "FlashAttention-2"}.get(backend, "FlashAttention-3")
    if flash and op.startswith("FlashAttention-2") and native != "FlashAttention-2":
        return f"FlashAttention-2 on {backend}: the row is the model's FA2 rate itself (fa2_fwd_eff), not a check"
    if flash and not op.startswith(native):
        return f"{op.split(' (')[0]} on {backend}: the model costs the native kernel ({native})"
    if row["metric"] != "TFLOPS":
        return f"metric {row['metric']!r} is not TFLOPS"
    d = _dims(row["shape"])
    batch = d.get("batch", d.get("bs", d.get("b")))
    q = d.get("seq", d.get("sq", d.get("s")))
    kv = d.get("seq", d.get("skv", d.get("s")))
    head_dim = d.get("head_dim", d.get("d"))
    causal = "causal" in op and "non-causal" not in op
    if "batch" in d and head_dim:  # Dao-AILab benchmark: model width 2048 split into heads
        heads = kv_heads = 2048 // head_dim
    else:
        heads = d.get("h", d.get("q_heads", 32))
        kv_heads = d.get("kv_heads", heads)
    if None in (batch, q, kv):
        return f"shape {row['shape']!r} gives no batch and sequence length"
    counted = 0.5 if causal else 1.0  # causal rows count half the FLOPs (row notes)
    if head_dim is None:  # recover it from the row's own time: FLOPs = 4 b h q kv d
        m = re.search(r"time (\d+(?:\.\d+)?) ms", row["notes"])
        if not m:
            return "shape gives no head_dim"
        flops = _number(row["value"]) * 1e12 * float(m.group(1)) * 1e-3  # type: ignore[operator]
        head_dim = round(flops / (4 * batch * heads * q * kv * counted))
    attrs = AttentionAttrs(batch, heads, kv_heads, q, kv, head_dim, causal=causal, flash=flash)
    node = _node(OpKind.ATTENTION, attrs, "bf16" if "bf16" in row["dtype"] else "fp16")
    flops = float(attrs.flops) * counted
    label = "flash attention" if flash else "unfused attention"
    return Probe(backend, label, "single device", lambda be: flops / be.op_time_s(node, 0) / 1e12)


STREAM_ARRAYS = {"copy": 2, "mul(scale)": 2, "add": 3, "triad": 3, "dot": 2}


def _memory_probe(backend: str, row: dict[str, str]) -> Probe | str:
    op = row["op"]
    if op.startswith("HBM STREAM-like kernel: "):
        arrays = STREAM_ARRAYS.get(op.removeprefix("HBM STREAM-like kernel: "))
        if arrays is None or row["metric"] != "achieved_TBps":
            return f"STREAM kernel {op!r} / metric {row['metric']!r} not understood"
        nbytes = arrays * 2**28 * 4  # fp32 arrays of 2^28 elements: launch cost vanishes
        node = _node(OpKind.ELEMENTWISE, ElementwiseAttrs(op), "fp32")
        return Probe(backend, "memory-bound", "single device", lambda be: nbytes / be.op_time_s(node, nbytes) / 1e12)
    m = re.match(r"elementwise add fp32\[N\]", op)
    d = re.search(r"N=(\d+)\^(\d+)", row["shape"])
    if m and d and row["metric"] == "time_ms":
        n = int(d.group(1)) ** int(d.group(2))
        nbytes = 3 * n * 4
        node = _node(OpKind.ELEMENTWISE, ElementwiseAttrs("add"), "fp32")
        return Probe(backend, "memory-bound", "single device", lambda be: be.op_time_s(node, nbytes) * 1e3)
    return f"memory-bound op {op!r} not understood"


AZURE_GUIDE = "github.com/Azure/AI-benchmarking-guide"
XLA_TABLE = "openxla/xla"
# The table times one op per executable from the host (collectives.a2a_host_issue_us), so an all-to-all's
# 2n grouped ncclSend / ncclRecv calls show. Fitted (accuracy.HARNESS_FITTED, GPU_MODULE_FITTED): least
# squares of (measured - modelled kernel time) = fixed + per_call x 2n over the median floors (rows of
# 2-64 KiB) of H100 and B200 at n = 2, 4, 8 and GB200 at n = 64, 72: 17.06 µs + 0.231 µs per call. The
# floors are 26-39, 27-36, 54 and 66 µs where NCCL's p2p kernel alone takes ~12. A per-call cost alone
# cannot fit both ends (GB200's 144 calls bound it to <= 0.45 µs, which leaves H100/B200 15-25 µs
# short), hence the fixed part; the per-call part is collectives.NCCL_P2P_CALL_US.
XLA_A2A_ISSUE_US = 17.0
XLA_TABLE_NCCL = NcclConfig(
    nvls_gather=False,
    protocols=("LL128", "Simple"),
    nvls_chunk_hop=True,
    a2a_issue_us=XLA_A2A_ISSUE_US,
    p2p_call_us=NCCL_P2P_CALL_US,
)
# The table's multi-host run (GB200 NVL72: 16-18 compute trays, one process per tray): NCCL's tuner
# counts every tray as a node (NcclConfig.host_nodes) and LL is not excluded.
XLA_TABLE_MULTIHOST_NCCL = NcclConfig(
    nvls_gather=False,
    nvls_chunk_hop=True,
    host_nodes=True,
    a2a_issue_us=XLA_A2A_ISSUE_US,
    p2p_call_us=NCCL_P2P_CALL_US,
)


def _gpus_per_host(row: dict[str, str]) -> int | None:
    """GPUs one host of the row's device holds, where its NVLink domain spans hosts (DeviceSpec.gpus_per_host)."""
    from echosim.backends.devices import DEVICES

    spec = DEVICES.get(backend_for_device(row["device"]) or "")
    return spec.gpus_per_host if spec is not None else None


def nccl_version(system: str) -> tuple[int, int] | None:
    """(major, minor) of the NCCL a row's system names (``"... NCCL 2.18.5)"``), if it names one."""
    m = re.search(r"NCCL (\d+)\.(\d+)", system)
    return (int(m.group(1)), int(m.group(2))) if m else None


def harness_nccl(row: dict[str, str]) -> NcclConfig:
    """The NCCL settings the row's benchmark harness ran with.

    * Azure AI-benchmarking-guide (its ``Benchmarks/NVIDIA/NCCLBandwidth.py``): one process
      drives every GPU of the node (``all_reduce_perf -g <gpus>``) with ``NCCL_ALGO=NVLS`` on
      8-GPU nodes and ``NCCL_ALGO=Ring`` on 4-GPU ones (A100 has no NVLS: the tuner chooses),
      under the NCCL its system names: before 2.20, NVLS fills its channels with fixed chunks
      (``nvls_even_split=False``: H100's NCCL 2.18.5 rows; H200's 2.20.5 split evenly).
    * ``nccl-tests -g N`` named in the op: one thread launches for N GPUs.
    * XLA's collective perf table (``xla/tools/collective_perf_table_gen.cc``, one XLA
      executable per collective): the table itself shows which NCCL paths XLA took, and the
      settings below are read from it, not from a citation (``FITTED_HARNESS`` in
      ``validation/accuracy.py``): all-gather and reduce-scatter run as rings (their large-size
      bus bandwidth never passes the ring's, while GB200's all-reduce passes it by 28%, which
      only NVLink SHARP gives), small messages cost what LL128 costs, not LL (floors grow
      by 1.9 µs per ring step, LL128's hop, from 2 to 8 ranks), and NVLS all-reduce climbs to
      its bandwidth as a pipeline whose chunks pay NVLS's 25 µs hop (H100, B200 and GB200
      alike; nccl-tests' NVLS rows climb with the 3.4 µs ring hop).
      Its GB200 NVL72 rows come from a run over 16-18 hosts (4 GPUs per compute tray): there the
      floors are those of NCCL's tuner counting each tray as a node, LL included
      (``XLA_TABLE_MULTIHOST_NCCL``): ring LL 6.6 + 48 x 1.0 + 15 x 2.7 = 95 µs for an all-gather
      over 64 GPUs (16 trays), 106 µs over 72 (measured medians 94 and 107 µs, reduce-scatter 96
      and 109 µs), where one fused node would give LL 44 / 49 µs or LL128 134 / 149 µs.
      The table's time is host wall time around a one-op executable (``gpu_executable.cc``), so an
      all-to-all also pays the host issue of its grouped send/recv calls (``XLA_A2A_ISSUE_US`` and
      ``collectives.NCCL_P2P_CALL_US`` per call, fitted on the table's all-to-all floors).
    """
    source, op = row["source"], row["op"]
    n = int(_number(row["num_devices"]) or 1)
    if AZURE_GUIDE in source:
        version = nccl_version(row["system"])
        even = version is None or version >= (2, 20)  # collectives.NVLS_NCHANNELS: how NVLS fills its channels
        return NcclConfig(algo="nvls" if n == 8 else "ring", devices_per_thread=n, nvls_even_split=even)
    m = re.search(r"-g (\d+)", op)
    if m:
        return NcclConfig(devices_per_thread=int(m.group(1)))
    if XLA_TABLE in source:
        host = _gpus_per_host(row)
        return XLA_TABLE_MULTIHOST_NCCL if host is not None and n > host else XLA_TABLE_NCCL
    return NcclConfig()


def _shares_rounds(shape: str, n: int) -> bool:
    """Whether a permute's ranks send and receive in one NCCL p2p round (a ring shift: to r+d, from r-d).

    The shape holds XLA's source-target pairs as protobuf text, zero fields left out
    (``pairs[target: 1;source: 1 target: 2;...;source: 7]``).
    """
    m = re.search(r"pairs\[(.*)\]", shape)
    if not m:
        return False
    to: dict[int, int] = {}
    for entry in m.group(1).split(";"):
        src, dst = re.search(r"source: (\d+)", entry), re.search(r"target: (\d+)", entry)
        to[int(src.group(1)) if src else 0] = int(dst.group(1)) if dst else 0
    sender = {dst: src for src, dst in to.items()}
    return any((to[r] - r) % n == (r - sender[r]) % n for r in to if r in sender)


def _collective_probe(backend: str, row: dict[str, str], kind: OpKind) -> Probe | str:
    system = row["system"]
    if re.search(r"NCCL_ALGO|SHARP disabled", row["op"] + " " + system):
        return "the row forces an algorithm; the model picks the one NCCL's tuner would"
    if re.search(r"\(expected\)|\(peak / avg\)", row["metric"]):
        return f"metric {row['metric']!r} is an expectation or an average over a sweep, not one measurement"
    n = _number(row["num_devices"])
    if n is None or n < 2:
        return "num_devices is missing"
    n = int(n)
    size = _size(row)
    if size is None or size <= 0:
        return f"no single message size in {row['shape']!r} (a positive size_bytes)"
    nodes_text = row["num_nodes"].strip()
    nodes = int(_number(nodes_text) or 1) if nodes_text else 1
    if n % nodes:
        return f"{n} devices do not divide into {nodes} nodes"
    per_node = n // nodes
    concurrent = 1
    m = re.search(r"(\d+) group\(s\) of (\d+) devices", row["shape"])
    if m and nodes == 1:
        concurrent = int(m.group(1))
    if kind is OpKind.SEND:  # every rank sends to one peer: one pair's transfer, the others alongside
        # On one node the pairs share one communicator of all n ranks (XLA's collective-permute,
        # nccl-tests sendrecv), which sets how many channels NCCL gives each send; across nodes a
        # pair's NIC share is what matters.
        placement = Placement(n, 1, n) if nodes == 1 else Placement(2, 2, 1, max(1, per_node // 2))
        factor = 1.0
        if _shares_rounds(row["shape"], n):  # a ring shift: echosim's ring exchange
            kind = OpKind.RECV
    else:
        placement = Placement(n, nodes, per_node, concurrent)
        factor = 2 * (n - 1) / n if kind is OpKind.ALL_REDUCE else (n - 1) / n
    metric = row["metric"].split(" (")[0]
    if metric in ("busbw_GBps", "effective_collective_bw_GBps"):

        def predict(be: Any) -> float:
            return size * factor / be.collective_time_s(kind, size, placement) / 1e9
    elif metric == "time_us":

        def predict(be: Any) -> float:
            return be.collective_time_s(kind, size, placement) * 1e6
    elif metric == "time_ms":

        def predict(be: Any) -> float:
            return be.collective_time_s(kind, size, placement) * 1e3
    else:
        return f"metric {row['metric']!r} not understood"
    scope = "intra-node" if nodes == 1 else "inter-node"
    op = "send/recv" if kind in (OpKind.SEND, OpKind.RECV) else kind.value
    regime = ">=1MiB" if size >= MiB else "<1MiB"
    return Probe(backend, op, scope, predict, regime, {"nccl": harness_nccl(row)})


def probe(row: dict[str, str]) -> Probe | str:
    """The probe a row asks for, or the reason it cannot be predicted."""
    backend = backend_for_device(row["device"])
    if backend is None:
        return f"no backend for device {row['device']!r}"
    network = network_for_system(row["system"])
    if network is not None:  # the device on a cloud's own network: the backend that models that pair
        on_network = backend_on_network(backend, network)
        if on_network is None:
            return f"no backend for device {row['device']!r} on the {network} network"
        backend = on_network
    if _number(row["value"]) is None:
        return f"value {row['value']!r} is not a single number"
    op = row["op"]
    if op.startswith(("GEMM", "dot", "matmul")):
        return _matmul_probe(backend, row)
    if "ttention" in op:
        return _attention_probe(backend, row)
    if op.startswith(("HBM STREAM", "elementwise")):
        return _memory_probe(backend, row)
    for pattern, kind in COLLECTIVE_OPS:
        if re.search(pattern, op):
            return _collective_probe(backend, row, kind)
    return f"op {op!r} is not costed by echosim"


def _under_harness(backend: Any, settings: dict[str, Any]) -> Any:
    """The backend as the row's harness drove it, where the backend models that software stack."""
    from echosim.backends.loading import GuardedBackend

    inner = getattr(backend, "inner", backend)
    if not hasattr(inner, "variant"):
        return backend
    return GuardedBackend(inner.variant(**settings), backend.name, backend.owner)


def validate_microbench(path: str | Path, registry: Any = None) -> MicrobenchValidation:
    """Predict every row of a microbench file with the registered backends."""
    from echosim.backends.loading import load_backend

    if registry is None:
        from echosim.plugins import get_registry

        registry = get_registry()
    backends: dict[str, Any] = {}
    result = MicrobenchValidation()
    for line, row in read_rows(path):
        measured = _number(row["value"])
        r = RowResult(line, row["device"], row["op"], row["metric"], measured)
        p = probe(row)
        if isinstance(p, str):
            r.skipped = p
        elif p.backend not in registry.backends:
            r.skipped = f"backend {p.backend!r} is not installed"
        else:
            if p.backend not in backends:
                try:
                    backends[p.backend] = load_backend(p.backend, registry)
                except EchosimError as exc:
                    backends[p.backend] = exc
            be = backends[p.backend]
            if p.settings and not isinstance(be, Exception):
                be = _under_harness(be, p.settings)
            if isinstance(be, Exception):
                r.skipped = str(be)
            else:
                r.backend = p.backend
                harness = XLA_GROUP if p.regime and XLA_TABLE in row["source"] else ""
                network = network_for_system(row["system"]) or ""
                parts = (row["device"], p.op, p.scope if p.regime else "", p.regime, harness, network)
                r.group = " | ".join(x for x in parts if x)
                try:
                    r.predicted = p.predict(be)
                except (EchosimError, ValueError) as exc:
                    r.skipped, r.group = f"cannot be predicted: {exc}", ""
        result.rows.append(r)
    return result
