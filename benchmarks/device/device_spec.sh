#!/usr/bin/env bash
# Exact n-gram speculation on the GPU machine (H200), in one call: the speculation tests with every
# layer on the GPU, CUDA's verify-batch logits against one-token logits, and `velo-chat bench
# --spec` with every layer on the GPU for the tiny qwen4exp and, when given, SmolLM2.
#
#   bash benchmarks/device/device_spec.sh [TINY_GGUF] [SMOLLM2_GGUF]     (repo root; carry: .device)
#
# TINY_GGUF: default .device/tiny-qwen4exp.gguf (benchmarks/device/prepare_device.sh makes it).
# SMOLLM2_GGUF: SmolLM2-135M-Instruct Q4_1; skipped, with a line saying so, when not given or
# missing. The CUDA build is device_build.sh's (sourced: a warm machine reuses it).
#
# Each model runs `bench --spec` under three profiles (every layer on the GPU, n_ctx 4096, greedy,
# decode on 1 thread: docs/threads.md):
# Every profile sets allow_batch_rounding = true: with layers on the GPU a verify batch rounds
# otherwise than a one-token step, and without it the engine does not speculate there (its load
# message and bench's speculation line say which guarantee a run had).
#   on      speculation enabled, prefill threads "auto" (the usable cores); verify batches run
#           on the decode thread (the engine's choice with every layer on the GPU), and the
#           section also times them on the prefill threads (`cost_on_prefill_threads`)
#   on-p02  the same with batch_cost_prior = 0.2 (the default 0.8 is a CPU's cost: until two
#           batches of a size are timed, a GPU turn's first ~15 tokens stay plain)
#   on-b1   the same with n_threads_batch = 1: a cross-check of the verify threads
#   (no "off" profile: `bench --spec` switches speculation on whatever a profile says, and
#   measures plain decoding in its "off" column; what a hybrid model's snapshots cost a plain
#   step is SPEC_SNAPSHOTS=1's side-by-side measurement, in one process)
#   on-nowarm  `on` with speculation.warm_up = false: every verify size's kernels and CUDA
#           graph made in the turns, not at load
#   on-perturn `on` with speculation.keep_costs = "off": the cost model learnt again in each turn
#           (`on` keeps it across turns, as "auto" does with every layer on a GPU)
# `bench --spec` rows: copy-edit and novel (real turns, off and on alternately), replay (the
# novel prompt's reply decoded again with that reply in the draft source: the best case on this
# backend, meaningful with random weights too), the verify-batch cost against one token, and the
# speedup limit it sets. The tiny model's weights are random: it copies nothing and does not
# loop either (greedy, 1,024 tokens past its end-of-generation token, on the CPU), so its
# copy-edit and novel rows draft nothing and measure only what speculation costs; replay shows
# what it gives when the reply does repeat session text.
#
# SPEC_SNAPSHOTS=1 first runs benchmarks/spec_snapshots.py on the tiny model (plain decoding in
# contexts with max_draft 0, 4 and 16 side by side, and a kernel profile of each; snapshots.json).
# SPEC_FILES="A.py B.py ...": SmolLM2's `on` profile again for each file, as the copy-edit
# workload (`bench --spec --spec-file`; the rename is the one bench picks). SPEC_TESTS=0 skips
# the tests (a warm call that only benchmarks).
# Environment: SPEC_TOKENS (decode tokens, default 512), SPEC_REPEATS (3), SPEC_BUDGET_S (no
# new bench run starts after this many seconds from the end of the build, default 200),
# SPEC_PLE (the tiny model's ple_gather, default "auto"), SPEC_PROFILES (which of the profiles
# above run, in order; default "on on-p02 on-b1"; also on-md4, on-md7 and on-md8, "on" with max_draft
# 4, 7 and 8 (7: the largest batch, 8 tokens, that ggml-cuda's matrix-vector kernels take): on a hybrid model what the recurrent-state snapshots cost a plain step, by their
# number), SPEC_MODELS (which models' logits and bench runs, default "tiny smol"), SPEC_GRAPH_KEYS (e.g. "1 0": the profiles again with GGML_CUDA_GRAPH_KEY_SHAPE set to
# each, packaging/patches/cuda-graph-per-shape.patch against upstream's CUDA graph key). SPEC_LOCAL=1 runs the same logic on
# this machine's .venv with the layers on the CPU and no build or GPU (a dry run of the script;
# use small SPEC_TOKENS).
# At most 8 files come back from the device: $OUT holds summary.txt, results.jsonl (every run's
# JSON, one line each), logits.jsonl, tests.log, bench.err, build.log (only when it built) and
# snapshots.json (with SPEC_SNAPSHOTS=1).
set -uo pipefail
export PYTHONUNBUFFERED=1
t_start=$(date +%s)
if [ "${SPEC_LOCAL:-0}" = 1 ]; then
  root=$PWD; out=${OUT:-/tmp/out-spec}; mkdir -p "$out"
  py=${PYTHON:-$root/.venv/bin/python}; layers=0
else
  source benchmarks/device/device_build.sh
  py=python3; layers=-1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
fi
echo "build done at $(( $(date +%s) - t_start )) s; $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
t_start=$(date +%s)  # SPEC_BUDGET_S counts from here (a cold CUDA build takes ~270 s before it)
tiny=${1:-$root/.device/tiny-qwen4exp.gguf}
smol=${2:-}
tokens=${SPEC_TOKENS:-512}; repeats=${SPEC_REPEATS:-3}; budget=${SPEC_BUDGET_S:-200}
home=$(mktemp -d /tmp/velo-spec-home.XXXXXX)
export VELO_CHAT_HOME=$home
mkdir -p "$home/config/profiles"
summary=$out/summary.txt; results=$out/results.jsonl
: > "$summary"; : > "$results"
say() { echo "$*" | tee -a "$summary"; }

profile() {  # name, n_threads_batch, speculation enabled, ple_gather, batch_cost_prior[, max_draft[,
  # warm_up]]
  {
    printf '[model]\nn_gpu_layers = %s\nple_gather = "%s"\n' "$layers" "$4"
    printf '[context]\nn_ctx = 4096\nn_threads = 1\nn_threads_batch = %s\nflash_attn = "on"\n' "$2"
    printf '[sampling]\ntemperature = 0.0\n[speculation]\nenabled = %s\nbatch_cost_prior = %s\n' "$3" "$5"
    printf 'allow_batch_rounding = true\nwarm_up = %s\n' "${7:-true}"
    [ -n "${6:-}" ] && printf 'max_draft = %s\n' "$6"
  } > "$home/config/profiles/$1.toml"
}
ple=${SPEC_PLE:-auto}
for m in tiny smol; do
  p=auto; [ $m = tiny ] && p=$ple
  profile $m-on '"auto"' true $p 0.8
  profile $m-on-p02 '"auto"' true $p 0.2; profile $m-on-b1 1 true $p 0.8
  profile $m-on-md4 '"auto"' true $p 0.8 4; profile $m-on-md8 '"auto"' true $p 0.8 8
  profile $m-on-md7 '"auto"' true $p 0.8 7
  profile $m-on-nowarm '"auto"' true $p 0.8 "" false
  profile $m-on-perturn '"auto"' true $p 0.8
  printf 'keep_costs = "off"\n' >> "$home/config/profiles/$m-on-perturn.toml"
done

# -- the tests with every layer on the GPU (SmolLM2's only when it is given) ----------------------
export VELO_TEST_QWEN=$tiny VELO_TEST_GPU_LAYERS=$layers
export VELO_TEST_CACHE=$home/test-data
mkdir -p "$VELO_TEST_CACHE"
select="qwen or hybrid or exactness or ngram or draft_length or speculative_sampling or replay"
select="$select or cost_model or decode_threads or bench_spec or warm_up_leaves"
select="$select or starts_from or carried_cost_is or begin_turn"
select="($select) and not keep_costs"  # (keep_costs' tests load SmolLM2)
if [ -n "$smol" ] && [ -f "$smol" ]; then
  ln -sf "$(cd "$(dirname "$smol")" && pwd)/$(basename "$smol")" \
    "$VELO_TEST_CACHE/SmolLM2-135M-Instruct.Q4_1.gguf"
  select=""
fi
[ "${SPEC_TESTS:-1}" = 1 ] && timeout 150 "$py" -m pytest -q -p no:cacheprovider -p no:randomly tests/test_speculation.py tests/test_spec_guard.py \
  tests/test_spec_warm_up.py tests/test_spec_carried_costs.py \
  ${select:+-k "$select"} > "$out/tests.log" 2>&1
[ "${SPEC_TESTS:-1}" = 1 ] && say "tests ($( [ -n "$select" ] && echo "without SmolLM2" || echo "all")): $(tail -1 "$out/tests.log")"

# -- what the rollback snapshots cost plain steps (SPEC_SNAPSHOTS=1; tiny model, kernel profile) --
if [ "${SPEC_SNAPSHOTS:-0}" = 1 ] && [[ " ${SPEC_MODELS:-tiny smol} " == *" tiny "* ]]; then
  timeout 200 "$py" benchmarks/spec_snapshots.py --model "$tiny" --profile tiny-on --drafts 0,4,16 \
    --tokens 256 --repeats 5 --kernels > "$out/snapshots.json" 2>> "$out/bench.err"
  say "snapshots: $(cat "$out/snapshots.json")"
fi

# -- verify-batch logits against one-token logits ------------------------------------------------
: > "$out/logits.jsonl"
logits() {  # label, model, profile
  timeout 40 "$py" benchmarks/spec_logits.py --model "$2" --profile "$3" --label "$1" \
    >> "$out/logits.jsonl" 2>> "$out/bench.err" || say "logits $1 failed (bench.err)"
}

# -- bench --spec -----------------------------------------------------------------------------------
bench() {  # label, model, profile[, extra bench arguments]
  if [ $(( $(date +%s) - t_start )) -gt "$budget" ]; then say "out of time before $1"; return; fi
  local json=$home/$1.json
  timeout 120 "$py" -m velo_chat.app.cli bench --spec --model "$2" --profile "$3" --json \
    --decode-tokens "$tokens" --repeats "$repeats" "${@:4}" > "$json" 2>> "$out/bench.err"
  "$py" - "$1" "$json" "$results" <<'PY' | tee -a "$summary"
import json, sys
name, path, results = sys.argv[1:]
try:
    d = json.load(open(path))
except ValueError:
    print(f"bench {name} failed (bench.err)")
    sys.exit()
with open(results, "a") as fh:
    fh.write(json.dumps({"run": name, "result": d}) + "\n")
s = d["sections"]["speculation"]
print(f"== {name}: {d['threads']['plan']}")
print(f"  speculation {s.get('speculation', '?')}")
for row in ("copy-edit", "novel", "replay"):
    r = s.get(row)
    if r:
        print(f"  {row:>9}: off {r['tok_s_off']:8.1f} on {r['tok_s_on']:8.1f} tok/s = {r['speedup']}x"
              f" accept {r['acceptance']} tok/call {r['tokens_per_call']} tokens {r['decode_tokens']}"
              f" identical {r['identical']} graphs reused {r.get('graphs_reused')}"
              f"  runs off {r['tok_s_off_runs']} on {r['tok_s_on_runs']}")
        if r.get("shared_tokens"):
            print(f"             the replies share {r['shared_tokens']} tokens: over those off"
                  f" {r['tok_s_off_shared']} on {r['tok_s_on_shared']} = {r['speedup_shared']}x")
        if r.get("batches") or r.get("declined"):
            print(f"             verify batches {r.get('batches')} declined {r.get('declined')}"
                  f" guarded {r.get('guarded')}")
        if len(r.get("on_runs", [])) > 1:
            print("             each on run: " + "; ".join(
                f"{x['tok_s']} tok/s, {x['accepted']}/{x['drafted']} accepted, batches {x['batches']}"
                for x in r["on_runs"]))
print(f"  verify cost (one token {s['cost_1_ms']} ms, {s.get('verify_threads')} threads): {s['cost']};"
      f" limit {s['limit_full']}x full, {s['limit_at_copy_acceptance']}x at copy-edit's acceptance")
print(f"  verify cost, each after another size (a new graph each time): {s.get('cost_alternating')}")
if "cost_on_prefill_threads" in s:
    print(f"  verify cost on the prefill threads: {s['cost_on_prefill_threads']}")
PY
}

# the most telling runs first: SPEC_BUDGET_S may leave the last ones out
models=${SPEC_MODELS:-tiny smol}
have_tiny=0; [[ " $models " == *" tiny "* ]] && have_tiny=1
have_smol=0; [ -n "$smol" ] && [ -f "$smol" ] && [[ " $models " == *" smol "* ]] && have_smol=1
[ $have_tiny = 1 ] && logits tiny "$tiny" tiny-on
[ $have_smol = 1 ] && logits smol "$smol" smol-on
for key in ${SPEC_GRAPH_KEYS:-default}; do
  tag=""
  if [ "$key" != default ]; then export GGML_CUDA_GRAPH_KEY_SHAPE=$key; tag="-key$key"; fi
  for p in ${SPEC_PROFILES:-on on-p02 on-b1}; do
    [ $have_tiny = 1 ] && bench "tiny-$p$tag" "$tiny" "tiny-$p"
    [ $have_smol = 1 ] && bench "smol-$p$tag" "$smol" "smol-$p"
  done
done
if [ $have_smol = 1 ]; then
  for f in ${SPEC_FILES:-}; do bench "smol-on-$(basename "$f")" "$smol" smol-on --spec-file "$f"; done
fi
[ $have_smol = 1 ] || say "SmolLM2 skipped: no model at '${smol}' (pass its path as the second argument)"
"$py" - "$out/logits.jsonl" <<'PY' | tee -a "$summary"
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print(f"== logits {d['label']}: batch against one token, max |diff| by batch size {d['max_abs_diff']};"
          f" argmax differs at {d['argmax_differs']} of {d['positions']} positions; smallest top-2 gap {d['min_top2_gap']}")
PY
say "total $(( $(date +%s) - t_start )) s"
rm -rf "$home"
