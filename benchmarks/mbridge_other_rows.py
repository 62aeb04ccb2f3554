"""echosim on the Megatron-Bridge rows the validation table drops as repeats (issue 16): a check, not a fit.

``cases.csv`` takes Megatron-Bridge's pre-training tables from NeMo 25.09 to 26.04.01, keeping one row per layout:
where several releases list the same model, system, precision and GPU count, only the latest is kept ("latest
kept" in its notes). The archive (Megatron-Bridge commit 067f987, ``docs/performance-summary-archive.md``) prints
every release's rows, so the dropped ones are the same layouts measured on other containers. This script takes the
26.02, 26.02.01, 26.04 and 26.04.01 tables with ``mbridge_newer_releases.build`` (the same columns, notes and
release-specific recipe settings) and keeps the rows whose case id ``cases.csv`` does not hold. The 25.09 and 25.11
tables are laid out differently and are not read here. Written to ``benchmarks/data/mbridge_other_rows.csv``;
nothing in echosim was fitted to them.

    PYTHONPATH=. python benchmarks/mbridge_other_rows.py
    PYTHONPATH=. python benchmarks/mbridge_other_rows.py --build ARCHIVE.md SUMMARY.md  # rewrite the CSV

``git -C <Megatron-Bridge mirror> show 067f987:docs/performance-summary-archive.md > ARCHIVE.md`` (and
``performance-summary.md`` for SUMMARY.md) gives the pages.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from mbridge_newer_releases import MODELS, build  # noqa: E402
from newer_rows import transcribed_main  # noqa: E402

OUT = ROOT / "benchmarks" / "data" / "mbridge_other_rows.csv"
ARCHIVE = "performance-summary-archive.md"
RELEASES = {"26.04.01": ARCHIVE, "26.04": ARCHIVE, "26.02.01": ARCHIVE, "26.02": ARCHIVE}
#: The newer-releases check's models, and Llama 3 70B, which those releases list and 26.06 on do not.
OTHER_MODELS = {**MODELS, "LLAMA3_70B": "llama3-70b"}


def other_rows(archive: Path, summary: Path, cases: Path) -> tuple[list[dict[str, str]], list[str]]:
    """The rows of :data:`RELEASES` whose case id cases.csv does not hold."""
    held = {r["case_id"] for r in csv.DictReader(cases.open())}
    rows, left = build(archive, summary, cases, RELEASES, OTHER_MODELS)
    kept = [r for r in rows if r["case_id"] not in held]
    return kept, [*left, f"{len(rows) - len(kept)} rows cases.csv holds"]


def main() -> None:
    transcribed_main(
        __doc__, other_rows, OUT, ROOT, (), lambda case_id: [case_id.split("-")[0].removeprefix("mbridge")], 56,
        inputs=("ARCHIVE", "SUMMARY"),
    )  # fmt: skip


if __name__ == "__main__":
    main()
