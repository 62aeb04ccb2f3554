"""Before/after check of a refactor: the --json reports of tests/test_report_regression.py's layouts.

``write DIR`` compiles every layout with whichever echosim is first on ``PYTHONPATH`` (an old
checkout made with ``git worktree add /tmp/old COMMIT``, say) and writes DIR/NAME.json;
``compare OLD NEW`` lists, by key path, the values that changed, the keys added and the keys
removed (list indices folded). The layouts and the report normalisation are the test's own.

    PYTHONPATH=/tmp/old python scripts/compare_reports.py write /tmp/before
    python scripts/compare_reports.py compare /tmp/before tests/data/reports
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

TEST = Path(__file__).resolve().parents[1] / "tests" / "test_report_regression.py"


def write(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("test_report_regression", TEST)
    assert spec and spec.loader
    test = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(test)  # imports echosim.cli from PYTHONPATH
    out.mkdir(parents=True, exist_ok=True)
    for name, args in sorted(test.LAYOUTS.items()):
        report = test._report(args)
        (out / f"{name}.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(name, flush=True)


def _flat(value: Any, where: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{where}.{key}").items()}
    if isinstance(value, list):
        flat: dict[str, Any] = {f"{where}#len": len(value)}
        for i, item in enumerate(value):
            flat.update(_flat(item, f"{where}[{i}]"))
        return flat
    return {where: value}


def compare(old: Path, new: Path) -> None:
    changed: dict[str, list[tuple[str, Any, Any]]] = defaultdict(list)
    added: dict[str, set[str]] = defaultdict(set)
    removed: dict[str, set[str]] = defaultdict(set)
    files = sorted(old.glob("*.json"))
    for path in files:
        a, b = _flat(json.loads(path.read_text())), _flat(json.loads((new / path.name).read_text()))
        for key in a.keys() | b.keys():
            folded = re.sub(r"\[\d+\]", "[]", key)
            if key not in b:
                removed[folded].add(path.stem)
            elif key not in a:
                added[folded].add(path.stem)
            elif a[key] != b[key]:
                changed[folded].append((path.stem, a[key], b[key]))
    counts = f"{len(changed)} keys changed, {len(added)} added, {len(removed)} removed"
    print(f"{len(files)} reports; identical except: {counts}")
    for key, moves in sorted(changed.items()):
        names = sorted({m[0] for m in moves})
        print(f"  changed {key}: {len(names)} layouts, e.g. {moves[0][0]}: {moves[0][1]!r} -> {moves[0][2]!r}")
    for label, keys in (("added", added), ("removed", removed)):
        for key, names in sorted(keys.items()):
            print(f"  {label} {key}: {len(names)} layouts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("write").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("old", type=Path)
    cmp.add_argument("new", type=Path)
    a = parser.parse_args()
    if a.cmd == "write":
        write(a.out)
    else:
        compare(a.old, a.new)


if __name__ == "__main__":
    main()
