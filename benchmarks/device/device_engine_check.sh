#!/usr/bin/env bash
# One device call: build llama-cpp-python 0.3.36 with CUDA for sm_90 (the flags `make run
# CUDA_ARCH=90` uses), then run the hybrid-resume tests and `velo-chat bench` on the GPU with the
# tiny qwen4exp model. Inputs are carried in .device/ (ignored by git; made by
# benchmarks/device/prepare_device.sh, so the call names it: carry .device):
#   .device/llcpp.tar.xz         the llama-cpp-python sdist, trimmed to what the build reads
#   .device/whl/*.whl            platformdirs, diskcache (not in the device image)
#   .device/tiny-qwen4exp.gguf   built by devkit/tiny_qwen4exp.py
# The build applies packaging/patches/*.patch, as the bootstrap does.
# Results go to $OUT (build.log, tests.log, bench.json).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out" /tmp/src /tmp/site
tar xJf .device/llcpp.tar.xz -C /tmp/src
for p in packaging/patches/*.patch; do
  [ -e "$p" ] || continue
  patch -p1 --batch --forward --silent -d /tmp/src/llama_cpp_python-0.3.36 < "$p" || exit 1
done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
t0=$(date +%s)
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_OPENMP=OFF -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF" \
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-index --no-deps \
  --no-build-isolation --target /tmp/site /tmp/src/llama_cpp_python-0.3.36 > "$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
# The package mapping of pyproject.toml, as links (no build backend needed there).
mkdir -p /tmp/pkg/velo_chat
for d in app engine kernels store assets; do ln -sfn "$PWD/$d" "/tmp/pkg/velo_chat/$d"; done
export PYTHONPATH=/tmp/pkg:$PYTHONPATH
export VELO_TEST_QWEN=$PWD/.device/tiny-qwen4exp.gguf VELO_TEST_GPU_LAYERS=-1
export VELO_CHAT_HOME=/tmp/velo-home
python3 -m pytest -q -p no:cacheprovider tests/test_resume.py -k "qwen4exp or hybrid or interval" \
  2>&1 | tee "$out/tests.log" | tail -15
mkdir -p "$VELO_CHAT_HOME/config/profiles"
cat > "$VELO_CHAT_HOME/config/profiles/gpu.toml" <<'TOML'
[model]
n_gpu_layers = -1
[context]
n_ctx = 4096
flash_attn = "on"
TOML
python3 -m velo_chat.app.cli bench --profile gpu --model "$VELO_TEST_QWEN" --json \
  --prefill-sizes 512,2048 --decode-tokens 512 --resume-tokens 3000 > "$out/bench.json" \
  2> "$out/bench.err" || tail -20 "$out/bench.err"
python3 -c "import json; d=json.load(open('$out/bench.json')); print(json.dumps({k: d[k] for k in ('prefill', 'decode', 'sections')}, indent=1))"
grep -m3 -i "CUDA0\|offloaded" "$VELO_CHAT_HOME/logs/velo-chat.log"
