#!/usr/bin/env bash
# Threads on the GPU machine (H200, 16 cores): `auto` against fixed thread counts, idle and beside
# one busy process per core, with the tiny qwen4exp model and every layer on the GPU.
#
#   bash benchmarks/device_threads.sh build-test   # CUDA build (kept in /tmp/velo-site), tests
#   bash benchmarks/device_threads.sh bench        # the benchmarks (builds first if needed)
#
# Inputs travel in .device/ (ignored by git, made by hand; see device_engine_check.sh):
# llcpp.tar.xz, whl/*.whl, tiny-qwen4exp.gguf. VELO_SRC: the source tree to run (default: here).
# Results go to $OUT: build.log, tests.log, bench_*.json and a summary at the end of the output.
# The build lives outside the repo: the device copy of the repo keeps only files that .gitignore
# ignores (not .git/info/exclude), and a warm machine keeps /tmp.
set -uo pipefail
export PYTHONUNBUFFERED=1
root=$PWD
out=${OUT:-/tmp/out}
src=$(cd "${VELO_SRC:-$root}" && pwd)
site=${VELO_SITE:-/tmp/velo-site}
mkdir -p "$out" "$site" /tmp/src
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
flags="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF"
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

if [ "${1:-}" = "build-test" ]; then
  # Those that need SmolLM2 (not on the machine: no registry) or Textual are left out.
  python3 -m pytest -q -p no:cacheprovider tests/test_threads.py \
    -k "not pools_and and not print_config and not done_turn and not settings_form" \
    2>&1 | tee "$out/tests.log" | tail -5
  python3 -m pytest -q -p no:cacheprovider tests/test_resume.py -k "qwen4exp or hybrid or interval" \
    2>&1 | tee -a "$out/tests.log" | tail -5
  exit 0
fi

mkdir -p "$VELO_CHAT_HOME/config/profiles"
gpu="[model]
n_gpu_layers = -1
[context]
n_ctx = 4096
flash_attn = \"on\""
echo "$gpu" > "$VELO_CHAT_HOME/config/profiles/gpu.toml"
# What velo-chat did before: 16 threads, llama.cpp's pool per step, no adaptation.
printf '%s\nn_threads = 0\nn_threads_batch = 0\nthread_pool = false\nadapt_threads = false\n' \
  "$gpu" > "$VELO_CHAT_HOME/config/profiles/gpu-before.toml"
n=$(nproc)
bench() {  # name, args...
  local name=$1; shift
  timeout 240 python3 -m velo_chat.app.cli bench --model "$VELO_TEST_QWEN" --json --no-resume \
    --prefill-sizes 512 --decode-tokens 128 --repeats 3 "$@" > "$out/bench_$name.json" \
    2> "$out/bench_$name.err" || { echo "bench $name failed"; tail -5 "$out/bench_$name.err"; }
}
bench auto --profile gpu --threads "1,2,4,$n" --load "$n"
bench auto-same-session --profile gpu --threads 1 --load "$n" --load-same-session
bench before --profile gpu-before --load "$n"
bench before-same-session --profile gpu-before --load "$n" --load-same-session
grep "threads:" "$VELO_CHAT_HOME/logs/velo-chat.log" | cut -c1-160 | tail -12
python3 - "$out" <<'PY'
import json, sys, pathlib
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench_*.json")):
    try:
        d = json.loads(path.read_text())
    except ValueError:
        print(path.name, "no JSON"); continue
    print(f"== {path.stem}: {d['threads']['plan']} (pool {d['threads']['pool']})")
    x = d["decode"]
    print(f"   idle decode {x['tok_s']} tok/s runs {x['tok_s_runs']} others {x['other_cores']}"
          f" graphs {x['graphs_reused']}; prefill {d['prefill'][0]['tok_s']} tok/s")
    t = d["sections"].get("threads")
    if t:
        print("   fixed:", [(r["decode_threads"], r["tok_s"]) for r in t["fixed"]],
              "auto/best", t["auto_over_best"])
    ld = d["sections"].get("load")
    if ld:
        y = ld["decode"]
        where = "same session" if ld.get("same_session") else "own session"
        print(f"   beside {ld['busy_processes']} busy ({where}): {y['tok_s']} tok/s runs {y['tok_s_runs']}"
              f" = {ld['over_idle']} x idle (worst {ld['worst_run_over_idle']}),"
              f" threads at end {y['threads_after']}")
        for r in ld.get("fixed", []):
            print(f"     fixed {r['decode_threads']}: {r['tok_s']} = {r['over_idle']} x idle"
                  f" runs {r['tok_s_runs']}")
PY
