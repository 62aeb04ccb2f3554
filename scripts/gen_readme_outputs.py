"""Write the README's `echosim compile` output from the program itself, so its figures cannot drift.

The block between ``<!-- echosim compile: begin -->`` and ``<!-- echosim compile: end -->`` is
what ``echosim compile`` prints piped (trailing spaces dropped), and the row of the figures table
for the default compile quotes its step time. ``python scripts/gen_readme_outputs.py`` rewrites
README.md; ``tests/test_readme.py`` fails when it is out of date.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN, END = "<!-- echosim compile: begin -->", "<!-- echosim compile: end -->"
# Narayanan et al. 2021 (arXiv:2104.04473), Table 1: the 175B row on 1,024 A100 at 140 TFLOP/s per GPU,
# whose Eq. 3 gives 31.5 s per step of 1,536 sequences.
PUBLISHED_S = 32.0
ROW = re.compile(r"^\| default `echosim compile` \| .*? \| `echosim compile` \|$", re.M)


def compile_output() -> tuple[str, float]:
    from click.testing import CliRunner

    from echosim.cli import cli

    runner = CliRunner(env={"COLUMNS": None})
    text = runner.invoke(cli, ["compile"], catch_exceptions=False).output
    step = json.loads(runner.invoke(cli, ["compile", "--json"], catch_exceptions=False).output)["step_time_s"]
    return "\n".join(line.rstrip() for line in text.strip().splitlines()), step


def render(readme: str) -> str:
    output, step = compile_output()
    head, rest = readme.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    text = f"{head}{BEGIN}\n```\n$ echosim compile\n{output}\n```\n{END}{tail}"
    error = step / PUBLISHED_S - 1
    row = (
        f"| default `echosim compile` | {step:.1f} s predicted vs about {PUBLISHED_S:.0f} s published "
        f"({error:+.0%}) | `echosim compile` |"
    )
    return ROW.sub(row, text)


def main() -> None:
    README.write_text(render(README.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote {README}")


if __name__ == "__main__":
    main()
