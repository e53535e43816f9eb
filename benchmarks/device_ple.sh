#!/usr/bin/env bash
# The GPU PLE gather on the device machine (H200): a patched CUDA build, the GPU tests, and decode
# with llama.cpp's CPU gather (stock, at each thread count) against the provider, in one call.
#
#   bash benchmarks/device_ple.sh        (run from the repo root; carry: .device)
#
# Inputs in .device/ (ignored by git; benchmarks/prepare_device.sh makes them): llcpp.tar.xz (the llama-cpp-python 0.3.36
# sdist), whl/*.whl (its runtime deps), tiny-qwen4exp.gguf, and ple/tiny-qwen4exp-<type>.gguf for
# the PLE table types but f32 (tests/support/tiny_qwen4exp.py with ple_type=...). The build applies
# packaging/patches/*.patch and lives in /tmp (a warm machine reuses it; the stamp holds the flags
# and the patches' hash). Logs and JSON go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
source benchmarks/device_build.sh
# the f32 one is tiny-qwen4exp.gguf itself (the generator's default): linked, not carried twice
mkdir -p /tmp/ple-models && ln -sf "$root"/.device/ple/*.gguf /tmp/ple-models/
[ -e /tmp/ple-models/tiny-qwen4exp-f32.gguf ] || \
  ln -s "$root/.device/tiny-qwen4exp.gguf" /tmp/ple-models/tiny-qwen4exp-f32.gguf
export VELO_TEST_QWEN=$root/.device/tiny-qwen4exp.gguf VELO_TEST_PLE_MODELS=/tmp/ple-models
export VELO_CHAT_HOME=/tmp/velo-home-ple
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; cat /proc/loadavg

# The GPU tests, the CPU-path inertness test, and hybrid resume with every layer on the GPU (the
# engine's default "auto" now takes the provider path there: checkpoints on that path).
timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:randomly tests/test_ple_provider.py \
  -k "not plan_says and not engine_reports" 2>&1 | tee "$out/tests.log" | tail -8
VELO_TEST_GPU_LAYERS=-1 timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:randomly \
  tests/test_resume.py -k "qwen4exp or hybrid or interval" 2>&1 | tee -a "$out/tests.log" | tail -4

mkdir -p "$VELO_CHAT_HOME/config/profiles"
for mode in stock gpu; do
  printf '[model]\nn_gpu_layers = -1\nple_gather = "%s"\n[context]\nn_ctx = 4096\nflash_attn = "on"\n' \
    "$mode" > "$VELO_CHAT_HOME/config/profiles/ple-$mode.toml"
done
n=$(nproc)
bench() {  # name, args...
  local name=$1; shift
  timeout 100 python3 -m velo_chat.app.cli bench --model "$VELO_TEST_QWEN" --json --no-resume \
    --prefill-sizes 512 --decode-tokens 512 --repeats 3 "$@" > "$out/bench_$name.json" \
    2> "$out/bench_$name.err" || { echo "bench $name failed"; tail -5 "$out/bench_$name.err"; }
}
bench stock --profile ple-stock --threads "1,2,4,$n"
bench gpu --profile ple-gpu --threads "1,2"
# Around each llama_decode (no sampling, no engine turn): stock and provider, with and without
# CUDA graphs (read at CUDA start-up, so one process each).
for g in 0 1; do
  for mode in stock gpu; do
    envs=(); [ $g = 1 ] && envs=(GGML_CUDA_DISABLE_GRAPHS=1)
    env "${envs[@]}" timeout 60 python3 benchmarks/ple_decode.py \
      --model "$VELO_TEST_QWEN" --mode $mode --tokens 512 --threads 1 2> "$out/decode_${mode}_g$g.err" \
      | tee "$out/decode_${mode}_g$g.json" | sed "s/^/no-graphs=$g /"
  done
done
python3 - "$out" <<'PY'
import json, sys, pathlib
for path in sorted(pathlib.Path(sys.argv[1]).glob("bench_*.json")):
    try:
        d = json.loads(path.read_text())
    except ValueError:
        print(path.name, "no JSON"); continue
    x = d["decode"]
    print(f"== {path.stem}: ple {d['sections'].get('ple')}")
    print(f"   decode {x['tok_s']} tok/s runs {x.get('tok_s_runs')} graphs {x['graphs_reused']}"
          f" overhead {x.get('overhead')}; prefill {d['prefill'][0]['tok_s']} tok/s; {d['threads']['plan']}")
    t = d["sections"].get("threads")
    if t:
        print("   fixed threads:", [(r["decode_threads"], r["tok_s"]) for r in t["fixed"]])
PY
