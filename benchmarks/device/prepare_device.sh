#!/usr/bin/env bash
# Prepare .device/, the inputs that benchmarks/device/device_engine_check.sh and device_threads.sh need on
# the GPU machine, which reaches no package registry:
#   .device/llcpp.tar.xz        the llama-cpp-python sdist, trimmed to what its CMake build reads
#                               (no git history, docs, models, tests, examples, tools but mtmd, or
#                               ggml backends other than CPU and CUDA)
#   .device/whl/*.whl           the Python packages the device image lacks (platformdirs, diskcache,
#                               gguf: devkit imports it),
#                               as wheels for its Python (3.12), at the versions of this .venv
#   .device/tiny-qwen4exp.gguf  the tiny hybrid qwen4exp model the GPU tests and bench run on
#                               (devkit/tiny_qwen4exp.py; its tokenizer is SmolLM2's, from
#                               the test-data cache, fetched if missing)
#   .device/ple/tiny-qwen4exp-<type>.gguf  the same model with its PLE table in each other type the
#                               GPU gather reads (f16, bf16, q8_0, iq4_nl), for device_ple.sh (the
#                               f32 one is tiny-qwen4exp.gguf itself: device_ple.sh links it, so it
#                               is not carried twice)
#
#   bash benchmarks/device/prepare_device.sh          # from the repo root, after `make bootstrap`
#
# Everything is built in a temporary folder first. A file missing from .device/ is added; one
# that exists is kept as it is (a device call may be carrying it) and the script says whether the
# new one differs; FORCE=1 replaces those that differ. .device/ is ignored by git, and the device
# tool copies an ignored folder only when a call names it: `carry: [".device"]`.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
LLAMA_VERSION=0.3.36
DEVICE_PYTHON=3.12
dest=${DEST:-.device}  # another folder for a fresh set (e.g. to try it beside one in use)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { printf 'prepare_device: %s\n' "$*" >&2; }

# -- wheels -------------------------------------------------------------------------------------
mkdir -p "$work/whl"
for name in platformdirs diskcache gguf; do
  version=$("$py" -c "import importlib.metadata as m; print(m.version('$name'))")
  "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" \
    --implementation cp --platform manylinux2014_x86_64 --dest "$work/whl" "$name==$version"
done

# -- the trimmed sdist ----------------------------------------------------------------------------
"$py" -m pip download --quiet --no-deps --no-binary :all: --dest "$work/sdist" \
  "llama-cpp-python==$LLAMA_VERSION"
mkdir -p "$work/src"
tar xzf "$work/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$work/src"
root="$work/src/llama_cpp_python-$LLAMA_VERSION"
lc="$root/vendor/llama.cpp"
rm -rf "$root"/{.git,.github,docker,docs,examples,tests,scripts} \
  "$lc"/{.git,.github,.devops,docs,models,media,tests,examples,pocs,benches,gguf-py,conversion,scripts,app} \
  "$lc"/*.py
find "$lc/tools" -mindepth 1 -maxdepth 1 ! -name mtmd ! -name CMakeLists.txt -exec rm -rf {} +
find "$lc/ggml/src" -mindepth 1 -maxdepth 1 -type d -name 'ggml-*' \
  ! -name ggml-cpu ! -name ggml-cuda -exec rm -rf {} +
# Check that the trimmed tree still configures (CPU; ggml-cuda/ is kept whole, and a CUDA
# configure needs the CUDA toolkit's libraries, which this machine may lack). LLAVA_BUILD is on so
# tools/mtmd is checked too.
if ! cmake -S "$root" -B "$work/configure" -DGGML_CUDA=off -DGGML_OPENMP=OFF -DLLAVA_BUILD=ON \
  > "$work/configure.log" 2>&1; then
  tail -20 "$work/configure.log" >&2
  log "the trimmed llama-cpp-python tree does not configure"
  exit 1
fi
log "the trimmed tree configures: $(du -sh "$root" | cut -f1)"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work/src" \
  -cJf "$work/llcpp.tar.xz" "llama_cpp_python-$LLAMA_VERSION"

# -- the tiny qwen4exp model ----------------------------------------------------------------------
"$py" - "$work" <<'PY'
import shutil
import sys
from pathlib import Path

from devkit.data_cache import smollm2
from devkit.tiny_qwen4exp import tiny_qwen4exp_path

work = Path(sys.argv[1])
tokenizer = smollm2(None)
shutil.copyfile(tiny_qwen4exp_path(work / "tiny", tokenizer), work / "tiny-qwen4exp.gguf")
(work / "ple").mkdir()
for ple_type in ("f16", "bf16", "q8_0", "iq4_nl"):
    built = tiny_qwen4exp_path(work / "tiny", tokenizer, ple_type=ple_type)
    shutil.copyfile(built, work / "ple" / f"tiny-qwen4exp-{ple_type}.gguf")
PY

# -- into .device/, adding what is missing ------------------------------------------------------
mkdir -p "$dest/whl" "$dest/ple"
place() {  # built file, its place in .device/
  local new=$1 old=$2
  if [ ! -e "$old" ]; then
    cp "$new" "$old.tmp.$$" && mv "$old.tmp.$$" "$old"
    log "added $old ($(du -h "$old" | cut -f1))"
  elif cmp -s "$new" "$old"; then
    log "kept $old (identical)"
  elif [ "${FORCE:-0}" = 1 ]; then
    cp "$new" "$old.tmp.$$" && mv "$old.tmp.$$" "$old"
    log "replaced $old ($(du -h "$old" | cut -f1))"
  else
    log "kept $old; the new one differs ($(du -h "$new" | cut -f1)): FORCE=1 replaces it"
  fi
}
for whl in "$work"/whl/*.whl; do place "$whl" "$dest/whl/$(basename "$whl")"; done
place "$work/llcpp.tar.xz" "$dest/llcpp.tar.xz"
place "$work/tiny-qwen4exp.gguf" "$dest/tiny-qwen4exp.gguf"
for model in "$work"/ple/*.gguf; do place "$model" "$dest/ple/$(basename "$model")"; done
du -sh "$dest" >&2
