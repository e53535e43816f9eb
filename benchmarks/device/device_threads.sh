#!/usr/bin/env bash
# Threads on the GPU machine (H200, 16 cores): `auto` against fixed thread counts, idle and beside
# one busy process per core, with the tiny qwen4exp model and every layer on the GPU.
#
#   bash benchmarks/device/device_threads.sh build-test   # CUDA build (kept in /tmp/velo-site), tests
#   bash benchmarks/device/device_threads.sh bench        # the benchmarks (builds first if needed)
#   bash benchmarks/device/device_threads.sh all          # build, the GPU-side thread tests, benchmarks
#
# Inputs travel in .device/ (ignored by git; made by benchmarks/device/prepare_device.sh; carry .device):
# llcpp.tar.xz, whl/*.whl, tiny-qwen4exp.gguf. VELO_SRC: the source tree to run (default: here).
# Results go to $OUT: build.log, tests.log, bench_all.jsonl (every run's JSON, by name), bench.err,
# switch.jsonl (gpu_wait_switch.py) and a summary table at the end of the output.
# The build lives outside the repo: the device copy of the repo keeps only files that .gitignore
# ignores (not .git/info/exclude), and a warm machine keeps /tmp.
set -uo pipefail
export PYTHONUNBUFFERED=1
t_start=$(date +%s)  # no new bench run starts after BENCH_BUDGET_S seconds from here
root=$PWD
out=${OUT:-/tmp/out}
src=$(cd "${VELO_SRC:-$root}" && pwd)
site=${VELO_SITE:-/tmp/velo-site}
mkdir -p "$out" "$site" /tmp/src
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
if [ "$(cat "$site/.stamp" 2>/dev/null)" != "$flags" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
    .device/whl/*.whl
  tar xJf .device/llcpp.tar.xz -C /tmp/src
  t0=$(date +%s)
  CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-index \
    --no-deps --no-build-isolation --upgrade --target "$site" /tmp/src/llama_cpp_python-0.3.36 \
    > "$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
  echo "$flags" > "$site/.stamp"
  echo "build: $(( $(date +%s) - t0 )) s"
fi
# The package mapping of pyproject.toml, as links (no build backend needed there).
mkdir -p /tmp/pkg/velo_chat
for d in app engine kernels store assets; do ln -sfn "$src/$d" "/tmp/pkg/velo_chat/$d"; done
export PYTHONPATH=/tmp/pkg:$site:$src
export VELO_TEST_QWEN=$root/.device/tiny-qwen4exp.gguf VELO_TEST_GPU_LAYERS=-1
export VELO_CHAT_HOME=/tmp/velo-home
cd "$src"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat /proc/loadavg

if [ "${1:-}" = "build-test" ] || [ "${1:-}" = "all" ]; then
  # Those that need SmolLM2 (not on the machine: no registry) or Textual are left out.
  python3 -m pytest -q -p no:cacheprovider tests/test_threads.py tests/test_gpu_wait.py \
    -k "not pools_and and not print_config and not done_turn and not settings_form and not bad_value" \
    2>&1 | tee "$out/tests.log" | tail -5
  if [ "${1:-}" = "build-test" ]; then
    python3 -m pytest -q -p no:cacheprovider tests/test_resume.py -k "qwen4exp or hybrid or interval" \
      2>&1 | tee -a "$out/tests.log" | tail -5
    exit 0
  fi
fi

# The bench: how the CPU waits for the GPU (gpu_wait), idle and beside one busy process per
# core, the busy processes in their own session and as the benchmark's children, each with the
# auto thread plan and fixed decode threads 1, 2 and 4. A second round (another order) if time
# is left. At most 8 files come back from the device, so the JSON goes into one file.
mkdir -p "$VELO_CHAT_HOME/config/profiles" /tmp/res
for mode in auto spin yield block; do
  printf '[model]\nn_gpu_layers = -1\ngpu_wait = "%s"\n[context]\nn_ctx = 4096\nflash_attn = "on"\n' \
    "$mode" > "$VELO_CHAT_HOME/config/profiles/gpu-$mode.toml"
done
n=$(nproc)
bench() {  # name, args...
  local name=$1; shift
  echo "== $name: $*" >> "$out/bench.err"
  timeout 75 python3 -m velo_chat.app.cli bench --model "$VELO_TEST_QWEN" --json --no-resume \
    --prefill-sizes 512 --decode-tokens 128 --repeats 3 "$@" > "/tmp/res/$name.json" \
    2>> "$out/bench.err" || echo "bench $name failed"
  python3 -c 'import json, sys; print(json.dumps({"name": sys.argv[1], "result": json.load(open(sys.argv[2]))}))' \
    "$name" "/tmp/res/$name.json" >> "$out/bench_all.jsonl" 2>/dev/null
  echo "$name done at $(( $(date +%s) - t_start )) s"
}
round() {  # round number, modes...
  local r=$1; shift
  for mode in "$@"; do
    [ $(( $(date +%s) - t_start )) -gt "${BENCH_BUDGET_S:-480}" ] && { echo "out of time before $mode r$r"; return; }
    bench "$mode-own-r$r" --profile "gpu-$mode" --threads 1,2,4 --load "$n"
    bench "$mode-same-r$r" --profile "gpu-$mode" --threads 1,2,4 --load "$n" --load-same-session
  done
}
round 1 spin block yield auto
timeout 90 python3 benchmarks/gpu_wait_switch.py "$VELO_TEST_QWEN" --load "$n" \
  > "$out/switch.jsonl" 2>> "$out/bench.err" || echo "switch probe failed"
round 2 auto block spin
grep -h "threads:\|gpu_wait" "$VELO_CHAT_HOME/logs/velo-chat.log" | cut -c1-160 | sort | uniq -c | tail -12
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
runs = {}
for path in sorted(pathlib.Path("/tmp/res").glob("*.json"), key=lambda p: p.stat().st_mtime):
    try:
        runs[path.stem] = json.loads(path.read_text())
    except ValueError:
        print(path.stem, "no JSON")
print("run | plan | idle auto (runs) own | fixed 1/2/4 idle | busy auto = x idle (worst) own, thr | busy fixed 1/2/4 x idle")
for name, d in runs.items():
    x, t, ld = d["decode"], d["sections"].get("threads"), d["sections"].get("load")
    fixed = "/".join(str(round(r["tok_s"])) for r in t["fixed"]) if t else "-"
    line = f"{name} | {d['threads']['plan'].split(';')[-1].strip()} | {x['tok_s']:.0f} {x['tok_s_runs']} {x.get('own_cores')} | {fixed}"
    if ld:
        y = ld["decode"]
        lf = "/".join(f"{r['over_idle']:.2f}" for r in ld.get("fixed", []))
        line += (f" | {y['tok_s']:.0f} = {ld['over_idle']:.3f} ({ld['worst_run_over_idle']:.3f}) own {y.get('own_cores')}"
                 f" others {y.get('other_cores')} thr {y['threads_after'][0]} | {lf}")
    print(line)
for line in (out / "switch.jsonl").read_text().splitlines() if (out / "switch.jsonl").exists() else []:
    print("switch", line)
PY
echo "total $(( $(date +%s) - t_start )) s"
