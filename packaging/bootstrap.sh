#!/usr/bin/env bash
# Bring a checkout to a runnable state: .venv, llama-cpp-python built from source, the project
# installed (editable, with test extras), and the embedded default model fetched.
#
# Idempotent and fast on re-runs: llama-cpp-python is rebuilt only when the installed version, the
# build flavour (CPU, or CUDA for a given arch) or the patches in packaging/patches/ differ from
# what is asked for. The patches are applied to the sdist before every build (packaging/README.md).
#
#   CUDA_ARCH=      CPU build (default)
#   CUDA_ARCH=121a  CUDA build for a DGX Spark (GB10)
#   CUDA_ARCH=90    CUDA build for an H200
#   LLAMA_SDIST=    a local llama-cpp-python sdist (.tar.gz/.tar.xz) instead of downloading one
#   NATIVE_CPU=1    on x86_64, build ggml's CPU code for this machine instead of x86-64-v3
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
LLAMA_VERSION=0.3.36
CUDA_ARCH=${CUDA_ARCH:-}
LLAMA_SDIST=${LLAMA_SDIST:-}

log() { printf 'bootstrap: %s\n' "$*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip setuptools wheel
fi
py="$VENV/bin/python"

# GGML_OPENMP=OFF: with OpenMP, a decode driven from any thread but the main one runs ~35%
# slower (measured: 69-79 vs 113-125 tok/s on 2 cores), and the TUI decodes in a worker thread.
# ggml's own thread pool is as fast from any thread (110-119 tok/s on the same machine).
if [ -n "$CUDA_ARCH" ]; then
  cmake_args="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH -DGGML_OPENMP=OFF"
else
  cmake_args="-DGGML_CUDA=off -DGGML_OPENMP=OFF"
fi
# ggml's CPU backend. On x86_64 it is built for a fixed instruction set (x86-64-v3: AVX2, FMA,
# F16C, BMI2; no AVX-512, no AMX) rather than for the build machine (-march=native): virtual
# machines differ in what they report, and some report AMX yet fault on its first tile
# instruction, so a native build died in ggml's AMX matrix multiply on the first decode on one
# machine and not on the next. The same build then computes the same way on every x86_64 host.
# NATIVE_CPU=1 builds for this machine instead (AMX kept only where packaging/amx_probe.c runs
# a tile configuration). On aarch64 (a DGX Spark's Grace cores) the build stays native.
NATIVE_CPU=${NATIVE_CPU:-}
cc=${CC:-cc}
no_amx=""
if [ "$(uname -m)" = x86_64 ] && [ -z "$NATIVE_CPU" ]; then
  cmake_args="$cmake_args -DGGML_NATIVE=OFF"
elif echo | "$cc" -march=native -dM -E - 2>/dev/null | grep -q __AMX_TILE__; then
  probe=$(mktemp -d)
  if ! { "$cc" -O1 -mamx-tile -o "$probe/amx" packaging/amx_probe.c && "$probe/amx"; } 2>/dev/null; then
    no_amx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    log "this CPU reports AMX but does not run it: building without AMX"
  fi
  rm -rf "$probe"
fi
patches=$(ls packaging/patches/*.patch 2>/dev/null | sort || true)
patch_hash=$(cat $patches /dev/null | sha256sum | cut -c1-16)
flavour="$cmake_args patches=$patch_hash${no_amx:+ cflags=$no_amx}"
stamp="$VENV/.llama-cpp-python-build"
installed=$("$py" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)
if [ "$installed" != "$LLAMA_VERSION" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$flavour" ]; then
  jobs=$("$py" -c 'import os; print(len(os.sched_getaffinity(0)))')
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  sdist=$LLAMA_SDIST
  if [ -z "$sdist" ]; then
    "$py" -m pip download --quiet --no-deps --no-binary llama-cpp-python --dest "$work" \
      "llama-cpp-python==$LLAMA_VERSION"
    sdist=$(ls "$work"/llama_cpp_python-"$LLAMA_VERSION".tar.*)
  fi
  tar xf "$sdist" -C "$work"
  src="$work/llama_cpp_python-$LLAMA_VERSION"
  for p in $patches; do
    log "applying $(basename "$p")"
    patch -p1 --batch --forward --silent -d "$src" < "$p"
  done
  log "building llama-cpp-python $LLAMA_VERSION from source ($flavour, $jobs jobs; a few minutes)"
  CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" \
    CFLAGS="${CFLAGS:-} $no_amx" CXXFLAGS="${CXXFLAGS:-} $no_amx" \
    "$py" -m pip install --quiet --force-reinstall --no-deps "$src"
  echo "$flavour" > "$stamp"
fi

# The project itself (and llama-cpp-python's own runtime deps, which --no-deps skipped above).
want=$(cat pyproject.toml | "$py" -c 'import sys,hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')
proj_stamp="$VENV/.velo-chat-install"
if [ "$(cat "$proj_stamp" 2>/dev/null)" != "$want" ]; then
  log "installing velo-chat (editable) with test extras"
  "$py" -m pip install --quiet -e ".[test]"
  echo "$want" > "$proj_stamp"
fi

"$VENV/bin/velo-chat" fetch-model --quiet
