#!/usr/bin/env bash
# One device-machine call for the PLE kernels: GPU tests of the PLE kernels, then the benchmark.
# Run from the repo root on the CUDA machine (carry: .device, for .device/whl: the engine's GGUF
# reader, which locates the table, imports platformdirs); logs and JSON go to $OUT (or ./device_out).
set -uo pipefail
OUT=${OUT:-$PWD/device_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# velo_chat is a namespace of top-level folders (pyproject package-dir); mirror it without installing
VC=$(mktemp -d); mkdir -p "$VC/velo_chat"
for d in kernels engine; do ln -s "$PWD/$d" "$VC/velo_chat/$d"; done
python3 -m pip install -q --no-index --no-deps --no-compile --target "$VC" .device/whl/*.whl
export PYTHONPATH="$VC${PYTHONPATH:+:$PYTHONPATH}"
TABLE=${VELO_PLE_BIG_TABLE:-/tmp/ple_big.gguf}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv
  python3 -c "import cupy, numpy; print('cupy', cupy.__version__, 'numpy', numpy.__version__)"
  grep -E 'MemTotal|MemAvailable' /proc/meminfo; nproc; df -h /tmp | tail -1
} 2>&1 | tee "$OUT/env.txt"
time python3 benchmarks/ple_gather.py --table "$TABLE" --make-table-only 2>&1 | tee "$OUT/make_table.log"
VELO_PLE_BIG_TABLE="$TABLE" timeout 300 python3 -m pytest -m gpu -q --noconftest -p no:cacheprovider \
  -o addopts="" -rA tests/test_kernels_gpu.py ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
for run in $(seq 1 "${BENCH_RUNS:-1}"); do  # repeated runs show the run-to-run spread
  timeout 240 python3 benchmarks/ple_gather.py --table "$TABLE" --json-out "$OUT/ple_gather_$run.json" \
    ${BENCH_ARGS:-} > "$OUT/bench_$run.log" 2>&1; echo "bench $run rc=$?"
  tail -3 "$OUT/bench_$run.log"
done
python3 - "$OUT"/ple_gather_*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        r = json.load(open(path))
    except Exception as e:
        print(f"{path}: no JSON ({e})")
        continue
    print(path, r["device"], r["table"]["mode"], "|", r["table"]["mode_reason"])
    for case in ("per_token", "batch_64", "batch_512"):
        c = r[case]
        print(" ", case, {k: (v.get("median", v) if isinstance(v, dict) else v) for k, v in c.items()})
PY
