"""The MI300X as data: units in the field names, a source for every number, a validating schema."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

PLUGIN = "mi300x"
_AMD = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
_MLENG = "https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md"


class SpecError(ValueError):
    """A spec value that is missing or impossible; the message names the plugin and the field."""


@dataclass(frozen=True, slots=True)
class MI300XSpec:
    name: str
    compute_units: int
    peak_bf16_tflops: float
    peak_fp16_tflops: float
    peak_fp8_tflops: float
    peak_tf32_tflops: float
    peak_fp32_tflops: float
    hbm_GB: float
    hbm_GBps: float
    hbm_stream_fraction: float  # achievable share of peak HBM bandwidth
    gemm_eff: float  # large-GEMM TFLOP/s over peak, measured
    flash_eff: float  # flash-attention TFLOP/s over the GEMM rate
    xgmi_links: int  # peer links per GPU in the fully connected 8-GPU mesh
    xgmi_link_GBps: float  # one direction of one link
    xgmi_efficiency: float  # achievable share of link rate for RCCL ring channels
    nic_GBps: float  # one direction, per GPU
    devices_per_node: int
    kernel_overhead_us: float
    source: str

    def __post_init__(self) -> None:
        validate(self)

    def peak_tflops(self, dtype: str) -> float:
        return {
            "bf16": self.peak_bf16_tflops,
            "fp16": self.peak_fp16_tflops,
            "fp8": self.peak_fp8_tflops,
            "fp32": self.peak_tf32_tflops,
            "tf32": self.peak_tf32_tflops,
        }.get(dtype, self.peak_bf16_tflops)


_FRACTIONS = ("hbm_stream_fraction", "gemm_eff", "flash_eff", "xgmi_efficiency")


def validate(spec: MI300XSpec) -> None:
    """Raise :class:`SpecError` naming the plugin, the device and the field."""
    who = f"plugin '{PLUGIN}': device {spec.name or '<unnamed>'!r}"
    if not spec.name:
        raise SpecError(f"{who}: field 'name' is missing")
    if not spec.source.strip():
        raise SpecError(f"{who}: field 'source' is missing (every number needs a source)")
    for f in fields(spec):
        if f.name in ("name", "source"):
            continue
        value = getattr(spec, f.name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise SpecError(f"{who}: field {f.name!r} must be a finite number, got {value!r}")
        if value <= 0:
            raise SpecError(f"{who}: field {f.name!r} must be positive, got {value!r}")
        if f.name in _FRACTIONS and value > 1:
            raise SpecError(f"{who}: field {f.name!r} is a fraction, got {value!r} > 1")
    if spec.xgmi_links != spec.devices_per_node - 1:
        raise SpecError(f"{who}: field 'xgmi_links' must connect every pair of the node's GPUs")


MI300X = MI300XSpec(
    name="mi300x",
    compute_units=304,  # Source: _AMD (304 compute units)
    peak_bf16_tflops=1307.4,  # Source: hw_specs.csv AMD Instinct MI300X (dense)
    peak_fp16_tflops=1307.4,  # Source: hw_specs.csv
    peak_fp8_tflops=2614.9,  # Source: hw_specs.csv
    peak_tf32_tflops=653.7,  # Source: hw_specs.csv
    peak_fp32_tflops=163.4,  # Source: hw_specs.csv
    hbm_GB=192.0,  # Source: hw_specs.csv
    hbm_GBps=5300.0,  # Source: hw_specs.csv (5.3 TB/s)
    # No MI300X STREAM measurement: assumed 0.8 of peak (H100/H200 measure 0.87-0.89).
    hbm_stream_fraction=0.8,
    gemm_eff=668.4 / 1307.4,  # Source: microbench.csv MAMF MI300X bf16 best shape 668.4 TFLOP/s (51.4%)
    # No MI300X attention measurement: assumed 0.7 of the GEMM rate (A100 FA2 runs at 0.74 of its cuBLAS rate).
    flash_eff=0.7,
    xgmi_links=7,  # Source: hw_specs.csv (7 Infinity Fabric links per GPU, fully connected)
    xgmi_link_GBps=64.0,  # Source: hw_specs.csv (128 GB/s bidirectional per link)
    # No RCCL measurement (validation notes, gap 3): assumed NCCL's ring share of NVLink on H100 (370 of 450).
    xgmi_efficiency=370.0 / 450.0,
    nic_GBps=50.0,  # Source: hw_specs.csv (typical 8 x 400G per node; deployment-specific)
    devices_per_node=8,  # Source: hw_specs.csv
    kernel_overhead_us=5.0,  # Assumed: ROCm kernel launch plus drain, slightly above CUDA's ~4 µs
    source=f"{_AMD} ; {_MLENG} ; https://www.emergentmind.com/topics/amd-mi300x-gpu",
)
