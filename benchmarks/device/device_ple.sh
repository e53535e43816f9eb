#!/usr/bin/env bash
# The GPU PLE gather on the device machine (H200): a patched CUDA build, the GPU tests, and decode
# with llama.cpp's CPU gather (stock) against the provider, on the tiny model and on one with the
# real PLE geometry, in one call. `velo-chat bench --profile ple-stock|ple-gpu` is in device_engine_check.sh.
#
#   bash benchmarks/device/device_ple.sh        (run from the repo root; carry: .device)
#
# Inputs in .device/ (ignored by git; benchmarks/device/prepare_device.sh makes them): llcpp.tar.xz (the llama-cpp-python 0.3.36
# sdist), whl/*.whl (its runtime deps), tiny-qwen4exp.gguf, and ple/tiny-qwen4exp-<type>.gguf for
# the PLE table types but f32 (devkit/tiny_qwen4exp.py with ple_type=...). The build applies
# packaging/patches/*.patch and lives in /tmp (a warm machine reuses it; the stamp holds the flags
# and the patches' hash). Logs and JSON go to $OUT. RESUME=0 skips the resume tests, BIG=0 the
# model with the real PLE geometry (BIG_GIB: its table's size, 4 GiB); ROUNDS=N alternates the
# modes N times; NOGRAPHS=0 leaves out the runs without CUDA graphs; SCHED_MODEL=M lists M's
# graph splits instead of the tiny model's; BENCH=0 leaves out `velo-chat bench --ple`, BENCH_THREADS
# ("1") lists the decode thread counts it runs with ("1 16": also llama.cpp's default here).
set -uo pipefail
export PYTHONUNBUFFERED=1
source benchmarks/device/device_build.sh
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
if [ "${RESUME:-1}" = 1 ]; then
  VELO_TEST_GPU_LAYERS=-1 timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:randomly \
    tests/test_resume.py -k "qwen4exp or hybrid or interval" 2>&1 | tee -a "$out/tests.log" | tail -4
fi

# Around each llama_decode (no sampling, no engine turn): stock, the provider with decode gathers
# launched from C ("gpu") and with every gather through the Python callback ("gpu-python"),
# with and without CUDA graphs (read at CUDA start-up, so one process each).
decode() {  # tag, model, mode, extra args...
  local tag=$1 model=$2 mode=$3; shift 3
  timeout 120 python3 benchmarks/ple_decode.py --model "$model" --mode "$mode" --threads 1 "$@" \
    2> >(sed "s/^/$tag: /" >> "$out/decode.err") | tee -a "$out/decode.jsonl" | sed "s/^/$tag /"
}
# ROUNDS alternations of the modes (this VM's speed drifts between processes by 10-20%).
for r in $(seq "${ROUNDS:-1}"); do
  for mode in stock gpu gpu-python; do decode "tiny_${mode}_r$r" "$VELO_TEST_QWEN" $mode --tokens 512; done
done
if [ "${NOGRAPHS:-1}" = 1 ]; then
  for mode in stock gpu; do
    GGML_CUDA_DISABLE_GRAPHS=1 decode "tiny-nographs_${mode}" "$VELO_TEST_QWEN" $mode --tokens 512
  done
fi
# The real PLE geometry (160-value IQ4_NL rows, 16 heads, a 4 GiB table in host memory).
if [ "${BIG:-1}" = 1 ]; then
  timeout 150 python3 benchmarks/ple_big_model.py /tmp/ple-big.gguf --tokenizer "$VELO_TEST_QWEN" \
    --table-gib "${BIG_GIB:-4}" 2>&1 | tail -2
  for r in $(seq "${ROUNDS:-1}"); do
    for mode in stock gpu gpu-python; do
      decode "big_${mode}_r$r" /tmp/ple-big.gguf $mode --tokens 256 --prefill 2048
    done
  done
fi

# The engine end to end (turns, sampling, stats): `velo-chat bench --ple stock,gpu`, one thread.
if [ "${BENCH:-1}" = 1 ]; then
  mkdir -p "$VELO_CHAT_HOME/config/profiles"
  for t in ${BENCH_THREADS:-1}; do  # decode threads: 1 is the best stock count, 16 llama.cpp's default here
  printf '[model]\nn_gpu_layers = -1\n[context]\nn_ctx = 4096\nflash_attn = "on"\nn_threads = %s\nadapt_threads = false\n' \
    "$t" > "$VELO_CHAT_HOME/config/profiles/ple.toml"
  for m in "$VELO_TEST_QWEN" /tmp/ple-big.gguf; do
    [ -e "$m" ] || continue
    timeout 150 python3 -m velo_chat.app.cli bench --profile ple --model "$m" --ple stock,gpu --json \
      --no-resume --prefill-sizes 512,2048 --decode-tokens 256 --repeats 3 > /tmp/bench_ple.json \
      2>> "$out/decode.err" && python3 -c "import json,sys; d=json.load(open('/tmp/bench_ple.json')); \
print('\n'.join(d['comparison']['lines'])); \
print('overhead', {k: v['decode'].get('overhead') for k, v in d['ple'].items()})" | sed "s|^|bench $(basename "$m") threads $t: |"
    cat /tmp/bench_ple.json >> "$out/bench_ple.jsonl" 2>/dev/null
  done
  done
fi

# What splits a decode step: the scheduler's own listing of splits and node backends.
for mode in stock gpu; do
  GGML_SCHED_DEBUG=2 timeout 60 python3 benchmarks/ple_decode.py --model "${SCHED_MODEL:-$VELO_TEST_QWEN}" \
    --mode $mode --tokens 3 --prefill 8 --debug-log /tmp/sched_$mode.log > /dev/null 2>&1
  { echo "== $mode"; grep -E "SPLIT|\[  CPU" /tmp/sched_$mode.log | tail -100; } >> "$out/sched.txt"
done
python3 - "$out" <<'PY'
import collections, json, statistics, sys, pathlib
rows = collections.defaultdict(list)
for line in (pathlib.Path(sys.argv[1]) / "decode.jsonl").read_text().splitlines():
    d = json.loads(line)
    model = "big" if d["prefill_tokens"] == 2048 else "tiny"
    rows[(model, d["mode"])].append(d)
for (model, mode), ds in rows.items():
    rates = [d["tok_s"] for d in ds]
    d = ds[-1]
    print(f"{model:4} {mode:11} tok/s median {statistics.median(rates):7.1f} runs {rates}"
          f"  step {d['step_us_median']} us  splits {d['splits_pp_tg']}  reused {d['graphs_reused']}"
          f"  prefill {d['prefill_tokens']}: {[x['prefill_s'] for x in ds]} s  argmax {d['argmax_digest']}"
          f"  py-calls {d.get('python_calls')} gathers {d.get('gathers')} cb {d.get('callback_us_mean')} us")
PY
