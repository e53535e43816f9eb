#!/usr/bin/env bash
# Decode of a model on the GPU beside one busy process per core, the busy processes in
# velo-chat's cgroup against a cgroup beside it (docs/threads.md, "Which cgroup the load runs
# in"), on the device machine (H200), in one call: the patched CUDA build (device_build.sh,
# reused on a warm machine), the cgroup test, then ROUNDS alternations of
#   velo-chat bench --load <cores>                  (their own session, velo-chat's cgroup)
#   velo-chat bench --load <cores> --load-cgroup    (their own session, a sibling cgroup)
# each with its own idle decode just before, so every ratio is side by side.
#
#   ROUNDS=3 bash benchmarks/device/device_load_cgroup.sh     (repo root; carry: .device)
#
# GPU_LAYERS=0 runs the model on the CPU with one decode thread instead (the same scheduling
# question without the GPU); PREBUILT=DIR skips the CUDA build and imports llama-cpp-python from
# DIR (e.g. a CPU build copied from a machine with the same glibc, with .device/whl installed
# beside it). The run starts in a cgroup of its own (velo-chat-run, under the root: the machine's
# own cgroup may have no cpu controller below it), standing for velo-chat's terminal scope.
# Results: $OUT/load_cgroup.jsonl (every run's JSON) and a summary line per run.
set -uo pipefail
export PYTHONUNBUFFERED=1
if [ -n "${PREBUILT:-}" ]; then
  root=$PWD; out=${OUT:-/tmp/out}; site=$root/$PREBUILT; mkdir -p "$out" /tmp/res
  export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .device/whl/*.whl
  mkdir -p /tmp/pkg/velo_chat
  for d in app engine kernels store assets; do ln -sfn "$root/$d" "/tmp/pkg/velo_chat/$d"; done
  export PYTHONPATH=/tmp/pkg:$site:$root
else
  source benchmarks/device/device_build.sh
fi
export VELO_TEST_QWEN=$root/.device/tiny-qwen4exp.gguf VELO_CHAT_HOME=/tmp/velo-home-cg
mkdir -p "$VELO_CHAT_HOME/config/profiles"
if [ "${GPU_LAYERS:--1}" = 0 ]; then
  printf '[model]\nn_gpu_layers = 0\n[context]\nn_ctx = 4096\nn_threads = 1\nadapt_threads = false\n' \
    > "$VELO_CHAT_HOME/config/profiles/gpu.toml"
else
  printf '[model]\nn_gpu_layers = -1\nple_gather = "stock"\n[context]\nn_ctx = 4096\nflash_attn = "on"\n' \
    > "$VELO_CHAT_HOME/config/profiles/gpu.toml"
fi
mkdir -p /sys/fs/cgroup/velo-chat-run && echo $$ > /sys/fs/cgroup/velo-chat-run/cgroup.procs
head -1 /proc/self/cgroup; cat /proc/loadavg
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:randomly -rs tests/test_cpu_group.py 2>&1 | tail -3
n=$(nproc)
for r in $(seq "${ROUNDS:-3}"); do
  for place in "" "--load-cgroup"; do
    timeout 60 python3 -m velo_chat.app.cli bench --profile gpu --model "$VELO_TEST_QWEN" --json \
      --no-resume --prefill-sizes 64 --decode-tokens 256 --repeats 2 --load "$n" $place \
      > /tmp/cg.json 2>> "$out/load_cgroup.err" || { echo "bench $place failed"; continue; }
    python3 - "$r" "${place:-flat}" <<'PY'
import json, sys
d = json.load(open("/tmp/cg.json"))
ld = d["sections"]["load"]
print(f"round {sys.argv[1]} {sys.argv[2]:13} idle {d['decode']['tok_s']:8.1f}  loaded {ld['decode']['tok_s']:8.1f}"
      f"  = {ld['over_idle']:.3f} x idle (worst run {ld['worst_run_over_idle']:.3f}), others used"
      f" {ld['decode']['other_cores']} cores")
PY
    cat /tmp/cg.json | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin)))" >> "$out/load_cgroup.jsonl"
  done
done
