#!/usr/bin/env bash
# The fit check's GPU terms on the device machine (H200): the `gpu` fit test, the fit sweep with
# every layer on the GPU (stock and GPU PLE gather, 42 contexts each), the same sweep of a wider
# model with shapes CUDA runs whole, and `velo-chat doctor`: one call of about a minute once the
# CUDA build exists.
#
#   bash benchmarks/device/device_fit.sh        (run from the repo root; carry: .device)
#
# It sources benchmarks/device/device_build.sh (the patched CUDA build in /tmp, reused when its stamp
# matches, else built: minutes), so it can follow device_ple.sh in the same call or run alone.
# Inputs in .device/ (benchmarks/device/prepare_device.sh): the sdist, whl/*.whl with gguf (the test's
# split-model helper imports it; installed here when a reused build lacks it), and
# tiny-qwen4exp.gguf. Writes seven files to $OUT/fit/:
#   tests.log    pytest -k "on_the_gpu and qwen" with VELO_TEST_GPU_LAYERS=-1
#   sweep.json   benchmarks/fit_sweep.py --out, stock and GPU PLE gather, n_ubatch 1-512: every
#                context's settings, terms, buffer lines, graph nodes/splits, sched copies; the
#                scheduler's split assignment (GGML_SCHED_DEBUG=2) for four contexts at n_ctx 8192
#   sweep.log    the sweep's summary and stderr
#   big.json     the sweep of benchmarks/ple_big_model.py's model (2560 wide, head dim 128, conv
#                channels 512, a 20 MiB PLE table), n_ubatch 1-512, n_ctx 512-16384
#   big.log      its writing and the sweep's summary
#   doctor.txt   `velo-chat doctor --profile fit` (text, then stderr, then the exit code)
#   doctor.json  `velo-chat doctor --profile fit --json`
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s)
source benchmarks/device/device_build.sh
fit=$out/fit
mkdir -p "$fit"
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target "$site" .device/whl/gguf-*.whl
export VELO_TEST_QWEN=$root/.device/tiny-qwen4exp.gguf VELO_CHAT_HOME=/tmp/velo-home-fit
echo "fit: build ready after $(( $(date +%s) - t0 )) s"

VELO_TEST_GPU_LAYERS=-1 timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:randomly -rA \
  tests/test_fit.py -k "on_the_gpu and qwen" > "$fit/tests.log" 2>&1
echo "fit: tests rc $? after $(( $(date +%s) - t0 )) s"; tail -4 "$fit/tests.log"

# n_ubatch 1: the decode graph alone (llama.cpp reserves the larger of the prefill and decode graphs)
timeout 90 python3 benchmarks/fit_sweep.py "$VELO_TEST_QWEN" --gpu-layers -1 --out "$fit/sweep.json" \
  --ubatch 1,16,32,64,128,256,512 --sched-debug "off,512,8192;on,512,8192;on,32,8192;on,1,8192" \
  > "$fit/sweep.log" 2>&1
echo "fit: sweep rc $? after $(( $(date +%s) - t0 )) s"; tail -12 "$fit/sweep.log"

# a qwen4exp with shapes CUDA runs whole (head dim 128, conv channels 512) and 2560 wide: no CPU
# split but the input one, as a real model; a small PLE table, so it writes in seconds
timeout 60 python3 benchmarks/ple_big_model.py /tmp/fit-big.gguf --tokenizer "$VELO_TEST_QWEN" \
  --table-gib 0.02 > "$fit/big.log" 2>&1 &&
  timeout 90 python3 benchmarks/fit_sweep.py /tmp/fit-big.gguf --gpu-layers -1 --out "$fit/big.json" \
    --ubatch 1,64,512 --ctx 512,4096,16384 --sched-debug "on,512,4096" >> "$fit/big.log" 2>&1
echo "fit: big model rc $? after $(( $(date +%s) - t0 )) s"; tail -12 "$fit/big.log"

# doctor on the tiny model: the device has no default model, so a profile names it
mkdir -p "$VELO_CHAT_HOME/config/profiles"
printf '[model]\npath = "%s"\nn_gpu_layers = -1\n[context]\nn_ctx = 4096\n' "$VELO_TEST_QWEN" \
  > "$VELO_CHAT_HOME/config/profiles/fit.toml"
{ timeout 60 python3 -m velo_chat.app.cli doctor --profile fit 2>&1; echo "exit $?"; } > "$fit/doctor.txt"
timeout 60 python3 -m velo_chat.app.cli doctor --profile fit --json > "$fit/doctor.json" 2>> "$fit/doctor.txt"
echo "fit: doctor --json rc $? after $(( $(date +%s) - t0 )) s"; tail -3 "$fit/doctor.txt"
