"""echosim on Megatron-Bridge releases the validation table does not hold (issue 16): a check, not a fit.

``cases.csv`` takes its Megatron-Bridge rows from the performance archive up to NeMo 26.04.01. Later releases
publish more pre-training rows of the same models: 26.06 and 26.06.01 in the archive, 26.08 on the current page
(Megatron-Bridge commit 067f987, ``docs/performance-summary-archive.md`` and ``docs/performance-summary.md``).
They were written in ``cases.csv``'s columns to ``benchmarks/data/mbridge_newer_releases.csv``, each row's model
columns copied from the latest ``cases.csv`` row of the same model. They are checked only: nothing in echosim was
fitted to them.

    PYTHONPATH=. python benchmarks/mbridge_newer_releases.py [--cases ../shared/validation/cases.csv]
    PYTHONPATH=. python benchmarks/mbridge_newer_releases.py --build ARCHIVE.md SUMMARY.md  # rewrite the CSV

Left out, with the reason printed: models ``cases.csv`` has no row of (Nemotron 3 hybrids, DeepSeek V4, Kimi K2
with the Muon optimizer), and SFT / LoRA tables.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from newer_rows import model_row, transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "mbridge_newer_releases.csv"
COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"
URL = f"https://github.com/NVIDIA-NeMo/Megatron-Bridge/blob/{COMMIT}/docs/"
#: The releases to take, and the page each is on.
RELEASES = {"26.06.01": "performance-summary-archive.md", "26.06": "performance-summary-archive.md",
            "26.08": "performance-summary.md"}  # fmt: skip
#: Table model name -> the ``cases.csv`` model it is, by the case_id stem of that model's rows.
MODELS = {
    "LLAMA3.1_405B": "llama3p1-405b",
    "DeepSeekV3": "deepseekv3",
    "GPT OSS 120B": "gpt-oss-120b",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
}
SYSTEMS = {"DGX-GB300": "gb300", "DGX-GB200": "gb200", "DGX-B300": "b300", "DGX-B200": "b200", "DGX-H100": "h100-sxm"}
NVL72 = "devices_per_node = 72-GPU NVL72 NVLink domain (4 GPUs per compute tray)"


def _templates(cases: Path, models: dict[str, str] = MODELS) -> dict[str, dict[str, str]]:
    """The latest Megatron-Bridge ``cases.csv`` row of each model (the model columns and their notes)."""
    out: dict[str, dict[str, str]] = {}
    for row in csv.DictReader(cases.open()):
        if not row["source_id"].startswith("megatron_bridge"):
            continue
        for stem in models.values():
            if re.match(rf"mbridge\d+-{re.escape(stem)}-", row["case_id"]):
                out.setdefault(stem, row)  # cases.csv lists the latest release first
    return out


def _tables(text: str, release: str) -> list[tuple[str, list[dict[str, str]]]]:
    """(model, rows) of the release's pre-training tables."""
    start = text.index(f"## {release} NeMo Container")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end > 0 else len(text)]
    section = section.split("### SFT Performance")[0]
    out = []
    for m in re.finditer(r"#### Model: (.+)\n\n((?:\|.*\n)+)", section):
        lines = [ln for ln in m.group(2).splitlines() if not ln.startswith("|--")]
        head = [h.strip() for h in lines[0].strip("|").split("|")]
        rows = [dict(zip(head, (v.strip() for v in ln.strip("|").split("|")), strict=False)) for ln in lines[1:]]
        out.append((m.group(1).strip(), rows))
    return out


def build(
    archive: Path,
    summary: Path,
    cases: Path,
    releases: dict[str, str] = RELEASES,
    models: dict[str, str] = MODELS,
) -> tuple[list[dict[str, str]], list[str]]:
    """The pre-training rows of ``releases`` (release -> the page that holds its tables) and ``models`` (the
    archive's model heading -> the case-id stem) in cases.csv's columns, and what was left out, and why."""
    templates = _templates(cases, models)
    pages = {"performance-summary-archive.md": archive.read_text(), "performance-summary.md": summary.read_text()}
    rows, left = [], []
    seen: set[str] = set()
    for release, page in releases.items():
        for model, table in _tables(pages[page], release):
            stem = models.get(model)
            if stem is None or stem not in templates:
                left.append(f"{release} {model}: no cases.csv row of this model")
                continue
            t = templates[stem]
            for r in table:
                device = SYSTEMS[r["System"]]
                dtype = r["Precision"].lower()
                gpus, gbs, seq = int(r["#-GPUs"]), int(r["GBS"]), int(r["Sequence Length"])
                tp, pp, cp = int(r["TP"]), int(r["PP"]), int(r["CP"])
                tps = float(r["Tokens / sec / GPU"])
                tflops = re.sub(r"\[.*", "", r["Model TFLOP / sec / GPU"])
                tag = release.replace(".", "")
                case_id = f"mbridge{tag}-{stem}-{dtype}-{device}-{gpus}" + (f"-gbs{gbs}" if gbs == 15360 else "")
                if case_id in seen:
                    left.append(f"{case_id}: repeated")
                    continue
                seen.add(case_id)
                notes = [n for n in t["notes"].split(" | ") if n.startswith(("MLA attention", "first "))]
                if device.startswith("gb"):
                    notes.append(NVL72)
                if dtype == "fp8":
                    notes.append("FP8 recipe: fp8 (per-tensor current scaling)")
                fsdp = r.get("FSDP", "0") not in ("0", "n/a", "")  # the 26.0x tables' FSDP column: Megatron-FSDP
                if not fsdp:
                    notes.append("optimizer sharding not stated by source (Megatron/NeMo default is the distributed "
                                 "optimizer, ZeRO-1-like)")  # fmt: skip
                notes += [
                    "step_time from global_batch*seq_len/(tokens_per_s_per_device*devices)",
                    f"metrics: tokens_per_s_per_gpu={r['Tokens / sec / GPU']}; tflops_per_gpu={tflops} (model)",
                ]
                if t["arch"] == "moe":
                    notes.append("EP is carved out of DP (Megatron convention). MoE benchmarks force-balance tokens "
                                 "across experts")  # fmt: skip
                if "[^" in r["Model TFLOP / sec / GPU"]:
                    notes.append("source footnote: performance regression in GPT-OSS 120B pre-training is a known "
                                 "issue (NVIDIA/cudnn-frontend issue 256)")  # fmt: skip
                row = model_row(t)
                row.update(
                    case_id=case_id,
                    source_id=f"megatron_bridge_{release}",
                    source_url=URL + page,
                    table=f"{release} Pre-Training Performance, {r['System']}",
                    framework=f"Megatron-Bridge / Megatron-Core (NeMo {release})",
                    confidence="A",
                    seq_len=str(seq),
                    device=device,
                    devices=str(gpus),
                    devices_per_node="72" if device.startswith("gb") else "8",
                    slices="1",
                    dtype=dtype,
                    tp=str(tp),
                    pp=str(pp),
                    dp=str(gpus // (tp * pp * cp)),
                    cp=str(cp),
                    ep="" if r["EP"] == "n/a" else r["EP"],
                    vpp="" if r["VP"] == "n/a" else r["VP"],
                    zero="3" if fsdp else "",
                    micro_batch=r["MBS"],
                    global_batch=str(gbs),
                    step_time_s=f"{gbs * seq / (tps * gpus):.6g}",
                    step_time_basis="tokens_per_s",
                    reported_metric="tflops_per_gpu",
                    reported_value=tflops,
                    notes=" | ".join(notes),
                )
                rows.append(row)
    return rows, left


def main() -> None:
    transcribed_main(
        __doc__, build, OUT, ROOT, (), lambda case_id: [case_id.split("-")[0].removeprefix("mbridge")],
        inputs=("ARCHIVE", "SUMMARY"),
    )  # fmt: skip


if __name__ == "__main__":
    main()
