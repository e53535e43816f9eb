#!/usr/bin/env bash
# Decode of a model on the GPU beside a busy machine, on a CUDA machine (the H200 device), in one
# call: the patched CUDA build (kept in /tmp: a warm machine reuses it), then
#  1. `velo-chat bench --load <cores>` with gpu_wait spin, block and yield, the busy processes in
#     one session of their own and as the benchmark's children (--load-same-session);
#  2. decode beside <cores> busy processes started here, each in a session of its own: at normal
#     priority (twice) and at nice 19, with an idle run before each pair.
#
#   bash benchmarks/device/device_busy.sh        (repo root; carry: .device, made by prepare_device.sh)
#
# Prints one line per run (tok/s, each run, the CPU this process and the others used, threads).
set -uo pipefail
t_start=$(date +%s)
export PYTHONUNBUFFERED=1
source benchmarks/device/device_build.sh
echo "build done at $(( $(date +%s) - t_start )) s"
export VELO_TEST_QWEN=$root/.device/tiny-qwen4exp.gguf
export VELO_CHAT_HOME=/tmp/velo-home-s
mkdir -p "$VELO_CHAT_HOME/config/profiles"
for mode in spin block yield; do
  printf '[model]\nn_gpu_layers = -1\ngpu_wait = "%s"\nple_gather = "stock"\n[context]\nn_ctx = 4096\nflash_attn = "on"\n' \
    "$mode" > "$VELO_CHAT_HOME/config/profiles/gpu-$mode.toml"
done
n=$(nproc)
bench() {
  local name=$1; shift
  [ $(( $(date +%s) - t_start )) -gt 400 ] && { echo "out of time before $name"; return; }
  timeout 45 python3 -m velo_chat.app.cli bench --model "$VELO_TEST_QWEN" --json --no-resume \
    --prefill-sizes 64 --decode-tokens 256 --repeats 2 "$@" > "/tmp/res/$name.json" 2>> "$out/bench.err" \
    || echo "bench $name failed"
  python3 - "$name" "/tmp/res/$name.json" <<'PY' | tee -a "$out/gpu_wait.txt"
import json, sys
try:
    d = json.load(open(sys.argv[2]))
except Exception as e:
    print(sys.argv[1], "no result", e); sys.exit()
x = d["decode"]; ld = d["sections"].get("load", {})
y = ld.get("decode", {})
print(f"{sys.argv[1]}: idle {x['tok_s']:.0f} {x['tok_s_runs']} own {x.get('own_cores')} | busy {y.get('tok_s', 0):.0f} {y.get('tok_s_runs')} = {ld.get('over_idle', 0):.3f} (worst {ld.get('worst_run_over_idle', 0):.3f}) own {y.get('own_cores')} others {y.get('other_cores')} | plan {d['threads']['plan'][-60:]}")
PY
}
for mode in spin block yield; do bench "$mode-own" --profile "gpu-$mode" --load "$n"; done
for mode in spin block yield; do bench "$mode-same" --profile "gpu-$mode" --load "$n" --load-same-session; done
printf '[model]\nn_gpu_layers = -1\nple_gather = "stock"\n[context]\nn_ctx = 4096\nflash_attn = "on"\n' > "$VELO_CHAT_HOME/config/profiles/gpu-default.toml"
n=$(nproc)
ext_bench() {  # name, prefix command...
  local name=$1; shift
  [ $(( $(date +%s) - t_start )) -gt 560 ] && { echo "out of time before $name"; return; }
  timeout 40 "$@" python3 -m velo_chat.app.cli bench --profile gpu-default --model "$VELO_TEST_QWEN" --json --no-resume \
    --prefill-sizes 64 --decode-tokens 256 --repeats 3 > "/tmp/res/$name.json" 2>> "$out/bench.err" || echo "bench $name failed"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[2])); x=d["decode"]; print(sys.argv[1], round(x["tok_s"]), x["tok_s_runs"], "own", x.get("own_cores"), "others", x.get("other_cores"), "thr", x.get("threads_after"))' "$name" "/tmp/res/$name.json" | tee -a "$out/nice.txt"
}
busy() {  # nice level
  pids=""
  for i in $(seq "$n"); do setsid nice -n "$1" python3 -c 'while True: pass' & pids="$pids $!"; done
  sleep 1
}
stop() { kill $pids 2>/dev/null; wait $pids 2>/dev/null; }
ext_bench idle env
busy 0; ext_bench busy-normal env; stop
busy 19; ext_bench busy-nice19 env; stop
ext_bench idle-again env
busy 0; ext_bench busy-normal-2 env; stop
echo "total $(( $(date +%s) - t_start )) s"
