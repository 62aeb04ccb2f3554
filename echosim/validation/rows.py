"""What to compile for a row: its model, its Plan and Cluster, and why it cannot be compiled yet.

A row states an architecture, a device and a layout; blank cells take the defaults of the
framework the source used (named in each function here), never a value fitted to the
published time. :func:`unsupported` names what a row needs that echosim does not model,
so the row is skipped with that reason instead of compiled wrongly.
"""

from __future__ import annotations

import re
from typing import Any

from echosim.backends.topology import fill_domains
from echosim.validation.cases import ARCHES, DTYPES, Case, backend_for

#: Backends whose node (``devices_per_node``) is an ICI slice, not a host (cases.csv gives hosts).
SLICE_BACKENDS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e")
#: Devices with fp8 tensor cores: a blank dtype there could be 16-bit or fp8, so the row is not guessed.
FP8_BACKENDS = ("h100-sxm", "h800", "h200", "b200", "gb200", "mi300x")


def unsupported(c: Case, registry: Any = None) -> str:
    """Why a row cannot be expressed yet ('' if it can); layout features are judged by Plan."""
    if reason := ARCHES[c["arch"]]:
        return reason
    if "MLA attention" in c["notes"]:
        return "multi-head latent attention (MLA) and dense first layers are not modelled yet"
    if c["arch"] == "moe" and not (c.int("experts", 0) and c.int("top_k", 0)):
        return "column(s) 'experts', 'top_k' blank (a moe row needs its routed experts)"
    if reason := DTYPES[c["dtype"]]:
        return reason
    backend = backend_for(c["device"])
    if backend is None:
        return f"no backend for device {c['device']!r} yet"
    if registry is not None and backend not in registry.backends:
        return f"backend {backend!r} is not installed"
    if c["arch"] == "gpt" and (c.int("kv_heads", 0) or 0) not in (0, c.int("heads")):
        return "grouped-query attention on the gpt architecture is not modelled (the gpt zoo block is MHA)"
    if not c["dtype"] and backend in FP8_BACKENDS:
        return "dtype blank on an fp8-capable device (16-bit or fp8 is not stated)"
    blank = [
        col
        for col in ("layers", "hidden", "heads", "vocab", "seq_len", "devices", "global_batch", "dp")
        if c.numbers[col] is None
    ]
    if blank:
        return f"column(s) {', '.join(map(repr, blank))} blank (not given by the source)"
    return ""


def row_model(c: Case) -> Any:
    from echosim.frontend.zoo import ArchConfig

    gpt = c["arch"] == "gpt"
    return ArchConfig(
        arch=c["arch"],
        layers=c.int("layers") or 0,
        hidden=c.int("hidden") or 0,
        heads=c.int("heads") or 0,
        vocab=c.int("vocab") or 0,
        ffn=c.int("ffn_hidden", 0) or 0,
        kv_heads=c.int("kv_heads", 0) or 0,
        head_dim=c.int("head_dim", 0) or 0,
        seq_len=c.int("seq_len") or 0,
        dropout=0.1 if gpt else 0.0,
        tied_embeddings=gpt,
        **_experts(c),
    )


def _experts(c: Case) -> dict[str, int]:
    """Routed-expert fields of a ``moe`` row (the zoo's llama-style MoE block)."""
    if c["arch"] != "moe":
        return {}
    return {
        "experts": c.int("experts", 0) or 0,
        "top_k": c.int("top_k", 0) or 0,
        "moe_ffn": c.int("moe_ffn_hidden", 0) or 0,
        "shared_experts": c.int("shared_experts", 0) or 0,
    }


def is_maxtext(c: Case) -> bool:
    from echosim.frameworks import framework_named_in

    return framework_named_in(c["framework"]) == "maxtext"


def replica_micro_batch(c: Case) -> int:
    """Sequences one data-parallel replica runs per micro-batch.

    Megatron-LM, NeMo, torchtitan and Composer state the micro-batch of a replica (a blank is
    Megatron's default of 1). MaxText states ``per_device_batch_size``: sequences per *chip*, with
    ``global_batch_size = per_device_batch_size * num_devices`` and ``gradient_accumulation_steps: 1``
    (MaxText ``src/maxtext/configs/base.yml``, commit e591f30, lines 326 and 968), so one replica of
    ``tp * cp`` chips runs ``per_device * tp * cp`` sequences at once, with no accumulation steps.
    """
    per_row = c.int("micro_batch", 1) or 1
    if not is_maxtext(c):
        return per_row
    return per_row * (c.int("tp", 1) or 1) * (c.int("cp", 1) or 1)


_REMAT = re.compile(r"remat_policy=(\w+)(?: \(([^)]*)\))?")
_TENSORS = {"decoder_layer_input": "decoder_layer_input", "q/k/v proj": "qkv_proj", "qkv_proj": "qkv_proj",
            "out_proj": "out_proj", "context": "context", "mlpwi": "mlpwi", "mlpwo": "mlpwo"}  # fmt: skip


_QKV_OUT = "decoder_layer_input=offload,qkv_proj=offload,out_proj=offload"
#: The per-tensor choices of the published Trillium recipes that use ``remat_policy: custom``, by the
#: config name a row's notes give (benchmarks/maxtext_trillium_model_configs.py, MaxText commit e591f30).
TRILLIUM_CUSTOM = {
    "llama3_1_8b_8192": _QKV_OUT,
    "llama3_1_8b_8192_no_collective_matmul": _QKV_OUT,
    "llama3_1_70b_8192_bs2": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_70b_8192_bs2_bfloat16_no_collective_matmul": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_70b_8192_bs4": "decoder_layer_input=offload,qkv_proj=offload",
    "llama3_1_405b_8192_pure_fsdp_ici": "decoder_layer_input=offload",
    "mixtral_8x22b_dropped": _QKV_OUT,
    "gemma3_12b_32768_v6e256": "decoder_layer_input=device",
}
_CONFIG = re.compile(r"config (\w+)")


def remat_policy(c: Case) -> str:
    """The MaxText remat policy a row's notes name (``remat_policy=NAME``), '' when none.

    ``custom (offload decoder_layer_input, q/k/v proj)`` lists the tensors the run offloads; a
    bare ``custom`` takes the per-tensor choices of the recipe config the notes name
    (:data:`TRILLIUM_CUSTOM`), else MaxText's defaults (:mod:`echosim.passes.recompute`).
    """
    m = _REMAT.search(c["notes"])
    if not m or not is_maxtext(c):
        return ""
    name, detail = m.group(1), (m.group(2) or "").strip()
    if name == "custom" and not detail.startswith("offload "):
        config = _CONFIG.search(c["notes"])
        recipe = TRILLIUM_CUSTOM.get(config.group(1) if config else "")
        return f"custom:{recipe}" if recipe else name
    if name != "custom":
        return name
    tensors = [_TENSORS.get(t.strip()) for t in detail.removeprefix("offload ").split(",")]
    if None in tensors:
        return name
    return "custom:" + ",".join(f"{t}=offload" for t in tensors)


def row_plan(c: Case, calibration: str = "") -> tuple[Any, Any]:
    """The row's Plan and Cluster. Blank cells take the defaults of the row's framework
    (:mod:`echosim.frameworks`, read from its ``framework`` column), then the Plan's own."""
    from echosim.frameworks import framework_named_in
    from echosim.plan import Cluster, Plan, plan_with_defaults

    vpp = c.int("vpp", 1) or 1
    stated = {
        "tp": c.int("tp") or None,
        "pp": c.int("pp") or None,
        "dp": c.int("dp") or None,
        "cp": c.int("cp") or None,
        "ep": c.int("ep") or None,
        "vpp": c.int("vpp") or None,
        "sp": None if c.int("sp") is None else c.int("sp") == 1,
        "zero": c.int("zero"),
        "micro_batch": replica_micro_batch(c),
        "global_batch": c.int("global_batch") or 0,
        "seq_len": c.int("seq_len") or 0,
        "dtype": c["dtype"] or "bf16",  # blank: 16-bit mixed precision (fp16 and bf16 cost the same)
        "recompute": remat_policy(c) or c["recompute"] or None,
        "schedule": "interleaved" if vpp > 1 else "1f1b",
        "framework": framework_named_in(c["framework"]),
    }
    plan = plan_with_defaults(Plan(), {k: v for k, v in stated.items() if v is not None})
    backend = backend_for(c["device"]) or c["device"]
    devices = c.int("devices") or 0
    stated = c.int("devices_per_node", 8) or 8
    # cases.csv counts TPU hosts (4 chips); the TPU backend's node is the ICI slice. 128 GPUs of
    # NVL72 racks are two domains of 64.
    slice_chips = devices // (c.int("slices", 1) or 1)
    per_node = slice_chips if backend in SLICE_BACKENDS else fill_domains(devices, stated)
    cluster = Cluster(backend, devices, per_node, **({"calibration": calibration} if calibration else {}))
    return plan, cluster
