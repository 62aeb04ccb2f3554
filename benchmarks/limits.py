"""Time and peak memory of compiles at the edges of what echosim accepts (issue 14's bounded work).

Usage: python benchmarks/limits.py

Each case runs ``echosim compile`` in a fresh process and prints its wall time, its peak
resident memory (``ru_maxrss`` of the child), its exit status and the last line it printed:
10^6 devices, 10^3 layers (10^4 is refused), a 10^7-token sequence, a global batch of 10^9 and a
10^13-parameter model, plus the refusals just past the limits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def hf_config(folder: Path, name: str, **fields: int) -> str:
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "vocab_size": 1024,
        "max_position_embeddings": 2048,
        **fields,
    }
    (folder / name).mkdir()
    (folder / name / "config.json").write_text(json.dumps(config))
    return f"hf:{folder / name}"


def run(label: str, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "echosim.cli", "compile", *args, "--json"],
                                stdout=out, stderr=err, text=True, env=env)  # fmt: skip
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage: its peak resident memory
        wall = time.monotonic() - start
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    peak_mib = usage.ru_maxrss / 1024  # kilobytes on Linux
    if code == 0:
        r = json.loads(stdout)
        what = f"step {r['step_time_s']:.4g} s, MFU {r['mfu'] * 100:.1f}%, {r['params']:.3g} params"
    else:
        what = (stderr.strip().splitlines() or ["?"])[-1][:150]
    print(f"{label:34s} {wall:7.1f} s {peak_mib:8.0f} MiB  exit {code}  {what}", flush=True)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases = [
            ("10^6 devices (gpt3-175b)", ["gpt3-175b", "--tp", "8", "--pp", "8", "--devices", "1000000"]),
            ("10^3 layers (hf: llama)", [hf_config(folder, "deep", num_hidden_layers=1_000)]),
            ("refused: 10^4 layers (hf: llama)", [hf_config(folder, "deeper", num_hidden_layers=10_000)]),
            ("seq 10^7 (llama3-8b)", ["llama3-8b", "--seq-len", "10000000"]),
            (
                "global batch 10^9 (gpt3-1.3b)",
                ["gpt3-1.3b", "--dp", "1000", "--micro-batch", "16", "--global-batch", "1000000000"],
            ),
            (
                "10^13 parameters (hf: llama)",
                [
                    hf_config(
                        folder,
                        "huge",
                        hidden_size=131072,
                        intermediate_size=4 * 131072,
                        num_attention_heads=1024,
                        num_key_value_heads=1024,
                        num_hidden_layers=50,
                        vocab_size=32000,
                    ),
                    "--tp",
                    "8",
                    "--pp",
                    "50",
                    "--dp",
                    "1",
                ],
            ),
            ("refused: global batch 10^9, dp 1", ["gpt3-1.3b", "--global-batch", "1000000000"]),
            ("refused: 2^25 devices", ["gpt3-1.3b", "--devices", str(2**25)]),
        ]
        for label, args in cases:
            run(label, args)


if __name__ == "__main__":
    main()
