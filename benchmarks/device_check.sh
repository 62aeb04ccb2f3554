#!/usr/bin/env bash
# Issue 6's checks on a machine with a GPU and a quiet many-core CPU, results under $OUT:
#   1. cpu_reality.py pinned to two cores (taskset): a quiet 2-core machine, every layout;
#   2. echosim calibrate on the GPU (bf16 matmuls, streaming kernels, kernel overhead).
# Needs python with torch; echosim's pure-Python dependencies come from build/devdeps when
# the machine lacks them (pip install --target build/devdeps click rich pluggy networkx ...).
set -u
OUT=${OUT:-/tmp/echosim-device}
mkdir -p "$OUT"
PY=""
for p in python3 python; do
  if command -v "$p" >/dev/null && "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
done
{
  echo "python: ${PY:-none}"; $PY -V; $PY -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
  nproc; lscpu | grep -E "Model name|^CPU\(s\)|MHz|L3"; uptime
} > "$OUT/machine.txt" 2>&1
[ -n "$PY" ] || exit 3
export PYTHONPATH=$PWD
$PY -c "import networkx, rich, click, pluggy" 2>/dev/null || export PYTHONPATH=$PWD:$PWD/build/devdeps
export OMP_NUM_THREADS=1
timeout "${CPU_LIMIT:-300}" taskset -c 2,3 "$PY" benchmarks/cpu_reality.py --sweep standard --steps "${STEPS:-8}" \
  --retries 1 --retry-wait 2 --out "$OUT/cpu_reality_device.json" > "$OUT/cpu_reality_device.log" 2>&1
echo "cpu_reality exit $?" >> "$OUT/machine.txt"
timeout "${GPU_LIMIT:-120}" "$PY" -m echosim.cli calibrate --backend h200 --sweep quick --ranks 1 \
  --db "$OUT/h200.sqlite" --name h200-device --json > "$OUT/h200_calibration.json" 2> "$OUT/h200_calibration.err"
echo "calibrate exit $?" >> "$OUT/machine.txt"
