#!/usr/bin/env bash
# Qwen3.8-Flash-Next at full width on the device machine (H100/H200): devkit/full_qwen4exp.py writes
# a model with every per-layer shape and tensor type of the real one (LAYERS of its 48 layers,
# PLE_FRACTION of its PLE table's rows) into /tmp, then velo-chat's engine loads it with every
# layer on the GPU and measures what docs/results/scale.md tabulates.
#
#   PHASES="gen load" bash benchmarks/device/device_scale.sh     (repo root; carry: .device)
#   PHASES="fit bench" bash benchmarks/device/device_scale.sh    (the next calls, machine warm)
#   PHASES="ckpt session" bash benchmarks/device/device_scale.sh
#
# Phases (PHASES; all six by default, more than one call's 10 minutes: a cold machine builds
# first; the build and the model in /tmp are reused while the machine stays warm):
#   gen    write /tmp/scale/full-qwen4exp-<LAYERS>L-<PLE_FRACTION>.gguf (kept: a later call reuses
#          it), after checking the free disk against `--plan`; gen.json has the sizes and seconds
#   load   engine load time, with use_mmap on and off (page cache warm) and on again after the
#          file is evicted from the page cache (a first start), stock PLE path; each load's "fit
#          estimate vs llama.cpp" log lines (load.jsonl)
#   fit    benchmarks/fit_sweep.py: the fit estimate per term against the buffers llama.cpp logs,
#          n_ctx FIT_CTX (8K/32K/128K), n_ubatch FIT_UBATCH (UBATCH), flash attention on, stock
#          and GPU PLE, the scheduler's assignment at FIT_SCHED ("on,UBATCH,8192") (fit.json).
#          Buffer sizes, not times: it may run beside other work
#   bench  `velo-chat bench --ple PLE_MODES`: prefill at PREFILL sizes, DECODE_TOKENS greedy decode
#          tokens REPEATS times, every layer on the GPU, once per PLE path (bench.json)
#   ckpt   `velo-chat bench --ckpt-sizes CKPT_SIZES` (engine/bench/checkpoint_sizes.py): per size
#          the state's bytes, the TTFT saving adds, the disk write, restores from RAM, chunked
#          files and a single file (page cache dropped) against cold (ckpt.json)
#   session `velo-chat bench --resume-tokens SESSION_TOKENS --session-turns SESSION_TURNS`: what
#          each follow-up's checkpoints add in RAM and on disk, the last one from disk in a fresh
#          process (session.json)
#   spec   `velo-chat bench --spec`: one verify batch of 2-17 tokens against one token, and the
#          copy-edit and novel prompts with n-gram speculation off and on, SPEC_TOKENS tokens a
#          reply (spec.json; random weights draft little: the batch costs are what this shows)
# Inputs in .device/ (benchmarks/device/prepare_device.sh): the sdist and wheels the build needs,
# gguf among them, and tiny-qwen4exp.gguf, whose tokenizer (SmolLM2's) the model copies.
# Switches: LAYERS (12), PLE_FRACTION (0.25), THREADS (nproc), PLE_MODES ("stock,gpu"),
# PREFILL ("2048,32768,131072"), CKPT_SIZES ("8192,32768,131072"), SESSION_TOKENS (131072),
# SESSION_TURNS (10), DECODE_TOKENS (128), REPEATS (3), UBATCH (512), CLEAN=1 deletes the model
# at the end.
# Output in $OUT/scale/: env.txt, plan.json, gen.json, load.jsonl, fit.json, fit.log, bench.json,
# bench.err, ckpt.json, ckpt.err, session.json, session.err, spec.json, spec.err, and summary.txt (the lines printed
# below).
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s)
source benchmarks/device/device_build.sh
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps --no-compile \
  --target "$site" .device/whl/gguf-*.whl
scale=$out/scale
mkdir -p "$scale" /tmp/scale
layers=${LAYERS:-12} frac=${PLE_FRACTION:-0.25} ubatch=${UBATCH:-512}
prefill=${PREFILL:-2048,32768,131072} ckpt_sizes=${CKPT_SIZES:-8192,32768,131072}
model=/tmp/scale/full-qwen4exp-${layers}L-${frac}.gguf
export VELO_CHAT_HOME=/tmp/velo-home-scale CKPT_SIZES=$ckpt_sizes UBATCH=$ubatch
note() { echo "scale: $* ($(( $(date +%s) - t0 )) s)" | tee -a "$scale/summary.txt"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; free -g
  df -h /tmp; cat /proc/loadavg; } > "$scale/env.txt" 2>&1
note "build ready on $(head -1 "$scale/env.txt")"
# the context holds the largest prompt of any phase and the decode after it
max_tokens=$(tr ',' '\n' <<< "$prefill,$ckpt_sizes,${SESSION_TOKENS:-131072}" | sort -n | tail -1)
n_ctx=$(( max_tokens + 4096 ))
mkdir -p "$VELO_CHAT_HOME/config/profiles"
printf '[model]\npath = "%s"\nn_gpu_layers = -1\n[context]\nn_ctx = %d\nflash_attn = "on"\nn_ubatch = %d\nn_batch = %d\n[checkpoints]\nram_budget_mib = 16384\ndisk_budget_gib = 24.0\n' \
  "$model" "$n_ctx" "$ubatch" "$(( ubatch > 512 ? ubatch : 512 ))" > "$VELO_CHAT_HOME/config/profiles/scale.toml"

for phase in ${PHASES:-gen load fit bench ckpt session}; do
  if [ "$phase" != gen ] && [ ! -e "$model.done" ]; then
    note "$phase: no $model (the gen phase writes it, in this call or an earlier one)"; exit 1
  fi
  case $phase in
  gen)
    if [ -e "$model.done" ]; then note "gen: reusing $model"; continue; fi
    python3 -m devkit.full_qwen4exp "$model" --layers "$layers" --ple-fraction "$frac" --plan > "$scale/plan.json"
    rm -f /tmp/scale/*.gguf /tmp/scale/*.done  # another size's model: its disk is needed
    need=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['bytes'])" "$scale/plan.json")
    avail=$(df --output=avail -B1 /tmp/scale | tail -1)
    if [ "$need" -gt $(( avail - 8 * 2**30 )) ]; then  # room left for the checkpoints
      note "gen: $need bytes do not fit $avail free with 8 GiB to spare; lower LAYERS or PLE_FRACTION"
      exit 1
    fi
    timeout 560 python3 -m devkit.full_qwen4exp "$model" --layers "$layers" --ple-fraction "$frac" \
      --threads "${THREADS:-$(nproc)}" --tokenizer .device/tiny-qwen4exp.gguf > "$scale/gen.json" \
      && touch "$model.done" || { note "gen failed"; rm -f "$model"; exit 1; }
    note "gen: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(f\"{d['file_bytes']/2**30:.2f} GiB ({d['kinds']}, PLE {d['ple_bytes']/2**30:.2f} GiB) in {d['seconds']:.0f} s\")" "$scale/gen.json")"
    ;;
  fit)
    timeout 400 python3 benchmarks/fit_sweep.py "$model" --gpu-layers -1 --out "$scale/fit.json" \
      --ubatch "${FIT_UBATCH:-$ubatch}" --ctx "${FIT_CTX:-8192,32768,131072}" --flash-attn on \
      --sched-debug "${FIT_SCHED:-on,$ubatch,8192}" \
      > "$scale/fit.log" 2>&1
    note "fit: rc $?"; tail -14 "$scale/fit.log" | tee -a "$scale/summary.txt"
    ;;
  bench)
    timeout 560 python3 -m velo_chat.app.cli bench --profile scale --ple "${PLE_MODES:-stock,gpu}" --json \
      --no-resume --prefill-sizes "$prefill" --decode-tokens "${DECODE_TOKENS:-128}" \
      --repeats "${REPEATS:-3}" > "$scale/bench.json" 2> "$scale/bench.err"
    note "bench: rc $?"
    python3 - "$scale/bench.json" <<'PY' | tee -a "$scale/summary.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print("\n".join(d["comparison"]["lines"]))
for mode, r in d["ple"].items():
    rows = ", ".join(f"{p['tokens']}: {p['tok_s']} tok/s" for p in r["prefill"])
    print(f"{mode}: prefill {rows}; decode {r['decode']['tok_s']} tok/s (runs {r['decode']['tok_s_runs']})")
PY
    ;;
  spec)
    timeout 560 python3 -m velo_chat.app.cli bench --profile scale --json --spec \
      --decode-tokens "${SPEC_TOKENS:-128}" --repeats "${REPEATS:-3}" > "$scale/spec.json" 2> "$scale/spec.err"
    note "spec: rc $?"
    python3 - "$scale/spec.json" <<'PY' | tee -a "$scale/summary.txt"
import json, sys
from velo_chat.engine.bench.spec import format_spec_lines
print("\n".join(format_spec_lines(json.load(open(sys.argv[1]))["sections"]["speculation"])))
PY
    ;;
  ckpt | session)
    if [ "$phase" = ckpt ]; then
      what=(--ckpt-sizes "$ckpt_sizes" --no-resume)
    else  # one conversation of SESSION_TURNS turns at SESSION_TOKENS, its last follow-up from disk
      what=(--resume-tokens "${SESSION_TOKENS:-131072}" --session-turns "${SESSION_TURNS:-10}")
    fi
    timeout 560 python3 -m velo_chat.app.cli bench --profile scale --json --prefill-sizes 512 \
      --decode-tokens 8 --repeats 1 "${what[@]}" > "$scale/$phase.json" 2> "$scale/$phase.err"
    note "$phase: rc $?"
    python3 - "$scale/$phase.json" <<'PY' | tee -a "$scale/summary.txt"
import json, sys
from velo_chat.engine.bench import checkpoint_sizes, session
d = json.load(open(sys.argv[1]))["sections"]
lines = checkpoint_sizes.format_lines(d["checkpoint_sizes"]) if "checkpoint_sizes" in d else []
lines += session.format_lines(d["resume_session"]) if "resume_session" in d else []
print("\n".join(lines))
for r in d.get("resume_session", {}).get("growth", []):
    print(r)
PY
    ;;
  load)
    timeout 560 python3 - "$phase" "$model" > "$scale/$phase.jsonl" 2> "$scale/$phase.err" <<'PY'
import json, logging, os, sys, time

from velo_chat.engine import make_engine
from velo_chat.engine.diagnostics import drop_from_page_cache
from velo_chat.engine.config import build_profile

phase, model = sys.argv[1], sys.argv[2]
sizes = [int(x) for x in os.environ["CKPT_SIZES"].split(",")]
ubatch = int(os.environ["UBATCH"])
lines: list[str] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        lines.append(record.getMessage())


logging.getLogger("velo_chat").addHandler(Keep(logging.INFO))
logging.getLogger("velo_chat").setLevel(logging.INFO)


def profile(**model_settings):
    return build_profile("scale", {
        "model": {"path": model, "n_gpu_layers": -1, **model_settings},
        "context": {"n_ctx": max(sizes) + 4096, "flash_attn": "on", "n_ubatch": ubatch,
                    "n_batch": max(ubatch, 512)},
        "checkpoints": {"interval_tokens": 0, "ram_budget_mib": 16384, "disk_budget_gib": 24.0},
    })


def cached_gib() -> float:
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return round(int(meminfo["Cached"].split()[0]) / 2**20, 1)


def emit(row) -> None:
    print(json.dumps(row), flush=True)


for mmap, cold in ((True, False), (False, False), (True, True)):
    if cold:
        drop_from_page_cache([model])
    lines.clear()
    engine = make_engine(profile(use_mmap=mmap, ple_gather="stock"), model_path=model)
    cached = cached_gib()
    t = time.perf_counter()
    engine.check()  # the fit estimate, then llama.cpp's buffers beside it in the log
    engine.load()
    wall = time.perf_counter() - t
    info = engine.info
    emit({"use_mmap": mmap, "page_cache": "evicted" if cold else "warm", "cached_gib_before": cached,
          "load_s": round(info.load_s, 2), "check_and_load_s": round(wall, 2),
          "fit_vs_llama": [x for x in lines if "fit estimate vs llama.cpp" in x]})
    engine.close()
PY
    note "$phase: rc $?"
    python3 - "$scale/$phase.jsonl" <<'PY' | tee -a "$scale/summary.txt"
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    print({k: v for k, v in d.items() if k != "fit_vs_llama"})
PY
    ;;
  *) note "unknown phase $phase"; exit 2 ;;
  esac
done
[ "${CLEAN:-0}" = 1 ] && rm -f "$model" "$model.done"
note "done; $(df -h /tmp/scale | tail -1)"
