#!/usr/bin/env bash
# Where a speculative turn's time goes on the GPU machine: `benchmarks/spec_trace.py` with every
# layer on the GPU, for each workload, after device_build.sh's CUDA build (sourced: a warm machine
# reuses it, and then needs no .device/).
#
#   bash benchmarks/device/device_trace.sh MODEL_GGUF [WORKLOAD ...]     (repo root; carry: .device cold)
#
# WORKLOAD: copy-edit (default) and/or novel. The profile is device_spec.sh's `on`: every layer on
# the GPU, n_ctx 4096, decode on 1 thread, greedy, speculation on with allow_batch_rounding.
# $OUT/trace-<workload>.json: spec_trace.py's object, with each kind of step's CUDA graph counts
# (`cuda_graph_changed`: steps run eagerly because their rebuilt graph differed from the captured
# one). TRACE_TOKENS (512), TRACE_REPEATS (2), TRACE_KEY_SHAPE (the per-shape CUDA graph key,
# GGML_CUDA_GRAPH_KEY_SHAPE, default 1), TRACE_BEFORE (a workload run once first, untraced:
# spec_trace.py's --before).
set -u
model=${1:?usage: device_trace.sh MODEL_GGUF [WORKLOAD ...]}; shift
workloads=${*:-copy-edit}
source benchmarks/device/device_build.sh || exit 1
export VELO_CHAT_HOME=/tmp/velo-trace-home GGML_CUDA_GRAPH_KEY_SHAPE=${TRACE_KEY_SHAPE:-1}
mkdir -p "$VELO_CHAT_HOME/config/profiles"
printf '[model]\nn_gpu_layers = -1\n[context]\nn_ctx = 4096\nn_threads = 1\nflash_attn = "on"\n[sampling]\ntemperature = 0.0\n[speculation]\nenabled = true\nallow_batch_rounding = true\n' \
  > "$VELO_CHAT_HOME/config/profiles/gpu-spec.toml"
for w in $workloads; do
  timeout 240 python3 benchmarks/spec_trace.py --model "$model" --profile gpu-spec --workload "$w" \
    --tokens "${TRACE_TOKENS:-512}" --repeats "${TRACE_REPEATS:-2}" ${TRACE_BEFORE:+--before "$TRACE_BEFORE"} > "$out/trace-$w.json" 2> "$out/trace-$w.err"
  echo "== $w rc=$?"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ('one_step_ms','rates','identical','on','on_total_in_steps','plain_stepper_total_in_steps')}))" "$out/trace-$w.json"
done
