#!/usr/bin/env bash
# The whole test suite on the GPU machine's CUDA build, every test file, twice: without
# VELO_TEST_GPU_LAYERS (the CPU paths of a CUDA build) and with VELO_TEST_GPU_LAYERS=-1 (every
# layer of every test model on the GPU). Inputs come from benchmarks/device/prepare_suite.sh
# and prepare_device.sh, over two calls on a warm machine (64 MiB a call, the tree's 4 MiB
# included; .device/ple is for device_ple.sh and stays behind):
#   1. carry [".device/llcpp.tar.xz", ".device/whl", ".device/tiny-qwen4exp.gguf",
#      ".device-suite/whl", ".device-suite/test-data", ".device-suite/smol/part-00",
#      ".device-suite/smol/sha256"]
#   2. carry [".device-suite/smol/part-01", ".device-suite/smol/parts"]
# then more calls with no carry to wait (each call waits up to WAIT seconds, 540 by default).
#
#   WAIT=540 bash benchmarks/device/device_suite.sh      (the same command every call)
#
# Everything lives in /tmp/suite while the machine is warm: the wheels, SmolLM2 reassembled
# and checked against its sha256, a snapshot of the tree taken at the first call (later calls
# copy the tree again; the suite keeps running on the snapshot), the CUDA build
# (device_build.sh, in the background from the first call), and the two runs, side by side in
# the background, each as SHARDS pytest processes (4; test files dealt round-robin; every file
# runs once per mode), each pinned to CORES_PER_SHARD cores of its own (2, with taskset): a
# shard then sees the 2-core machine CI runs on. Unpinned, each shard sees all 16 cores, so
# every GPU-mode prefill of six processes takes 16 threads, and the checkpoint writers (nice
# 19) wait behind them, past the engine's close timeout (the likely cause of the resume tests
# that failed in such a run, docs/results/scale.md). How long the build and the runs took is
# in docs/results/scale.md.
# SEQUENTIAL=1 runs the GPU mode after the CPU one. Each call packs the logs so far into
# $OUT/suite.tgz: build.log, cpu-N.log and gpu-N.log per shard (pytest -v names each test as it
# ends; -rfEs names every failure, error and skip at the end), cpu-N.failures and
# gpu-N.failures (each failure's traceback as it happens, tests/support/failure_log.py: a shard
# the lease cuts off never reaches pytest's summary), status.txt.
# PYTEST_ARGS adds arguments to both runs (e.g. "-x", or "-k resume" to try the set-up).
set -uo pipefail
export PYTHONUNBUFFERED=1
S=${SUITE_DIR:-/tmp/suite}
mkdir -p "$S/whl" "$S/smol" "$S/test-data" "$S/logs" "${OUT:=/tmp/out}"
say() { echo "suite: $*" | tee -a "$S/logs/status.txt"; }

# -- keep what this call carried ------------------------------------------------------------
[ -d .device-suite/whl ] && cp -n .device-suite/whl/*.whl "$S/whl/"
[ -d .device-suite/test-data ] && mkdir -p "$S/test-data/llama-cpp-python-0.3.36-templates" \
  && cp -r .device-suite/test-data/. "$S/test-data/llama-cpp-python-0.3.36-templates/"
[ -d .device-suite/smol ] && cp -n .device-suite/smol/* "$S/smol/"
if [ ! -d "$S/repo" ]; then  # the snapshot the build and the suite run from
  mkdir -p "$S/repo" && tar --exclude=./.device-suite -cf - . | tar -xf - -C "$S/repo"
fi

# -- the CUDA build, once, in the background --------------------------------------------------
if [ ! -e "$S/build.started" ] && [ -e "$S/repo/.device/llcpp.tar.xz" ]; then
  touch "$S/build.started"
  setsid bash -c "cd $S/repo && OUT=$S/logs source benchmarks/device/device_build.sh > $S/logs/build.out 2>&1; \
    echo \$? > $S/build.done" < /dev/null > /dev/null 2>&1 &
  say "build started"
fi

# -- SmolLM2, once every part is here ----------------------------------------------------------
model=$S/test-data/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -e "$model" ] && [ -e "$S/smol/parts" ]; then
  have=$(ls "$S/smol" | grep -c '^part-'); want=$(cat "$S/smol/parts")
  if [ "$have" = "$want" ]; then
    cat "$S/smol"/part-* > "$model.tmp"
    if (cd "$S/smol" && sed "s#  .*#  $model.tmp#" sha256 | sha256sum -c --quiet -); then
      mv "$model.tmp" "$model"; say "SmolLM2 reassembled and checked"
    else
      rm -f "$model.tmp"; say "SmolLM2's parts do not match its sha256"
    fi
  else
    say "SmolLM2: $have of $want parts so far (the next call carries the others)"
  fi
fi

# -- the two runs, once the build, the wheels and the model are there (checked again while
# waiting: a build that ends during a call starts them then) --------------------------------
start_runs() {
if [ ! -e "$S/runs.started" ] && [ "$(cat "$S/build.done" 2>/dev/null)" = 0 ] && [ -e "$model" ] \
  && ls "$S/whl"/textual-*.whl > /dev/null 2>&1; then
  touch "$S/runs.started"
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$S/site" "$S/whl"/*.whl \
    > "$S/logs/pip.log" 2>&1 || say "pip install failed (logs/pip.log)"
  shards=${SHARDS:-4} per_shard=${CORES_PER_SHARD:-2}
  cat > "$S/run.sh" <<RUN
cd $S/repo
export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libstdc++.so.6 PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/pkg:\${VELO_SITE:-/tmp/velo-site-ple}:$S/site:$S/repo
export VELO_TEST_CACHE=$S/test-data
one_run() (  # one_run MODE SHARD SLOT: that shard's test files in that mode, on its own cores
  export VELO_CHAT_HOME=$S/home-\$1-\$2 VELO_TEST_FAILURES=$S/logs/\$1-\$2.failures
  cores=\$(for c in \$(seq \$(( \$3 * $per_shard )) \$(( \$3 * $per_shard + $per_shard - 1 ))); do
    echo \$(( c % \$(nproc) )); done | paste -sd,)
  if [ \$1 = gpu ]; then export VELO_TEST_GPU_LAYERS=-1; else unset VELO_TEST_GPU_LAYERS; fi
  files=\$(ls tests/test_*.py | awk -v n=$shards -v k=\$2 '(NR - 1) % n == k')
  start=\$(date +%s)
  taskset -c \$cores python3 -m pytest -v --tb=short -p no:cacheprovider -rfEs ${PYTEST_ARGS:-} \$files \
    > $S/logs/\$1-\$2.log 2>&1
  echo "\$1 shard \$2: pytest rc \$? in \$(( \$(date +%s) - start )) s" >> $S/logs/status.txt
)
slot=0
for mode in cpu gpu; do
  [ "${SEQUENTIAL:-0}" = 1 ] && slot=0
  for k in \$(seq 0 $(( shards - 1 ))); do one_run \$mode \$k \$slot & slot=\$(( slot + 1 )); done
  [ "${SEQUENTIAL:-0}" = 1 ] && wait
done
wait
touch $S/runs.done
RUN
  setsid bash "$S/run.sh" < /dev/null > /dev/null 2>&1 &
  say "runs started"
fi
}
start_runs

# -- wait, then report ---------------------------------------------------------------------------
for _ in $(seq 1 "${WAIT:-540}"); do
  start_runs
  [ -e "$S/runs.done" ] && break
  [ ! -e "$S/runs.started" ] && [ -e "$S/build.done" ] && [ ! -e "$model" ] && break  # needs a carry
  sleep 1
done
tar czf "$OUT/suite.tgz" -C "$S/logs" . 2>/dev/null
cat "$S/logs/status.txt" 2>/dev/null
for log in "$S"/logs/cpu-*.log "$S"/logs/gpu-*.log; do
  [ -e "$log" ] && { echo "== $(basename "$log")"; tail -3 "$log"; }
done
[ -e "$S/build.done" ] && echo "build rc $(cat "$S/build.done")" || echo "building"
