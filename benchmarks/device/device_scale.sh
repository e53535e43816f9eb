#!/usr/bin/env bash
# Qwen3.8-Flash-Next at full width on the device machine (H100/H200): devkit/full_qwen4exp.py writes
# a model with every per-layer shape and tensor type of the real one (LAYERS of its 48 layers,
# PLE_FRACTION of its PLE table's rows) into /tmp, then velo-chat's engine loads it with every
# layer on the GPU and measures what docs/results/scale.md tabulates.
#
#   PHASES="gen load" bash benchmarks/device/device_scale.sh     (repo root; carry: .device)
#   PHASES="fit bench" bash benchmarks/device/device_scale.sh    (the next calls, machine warm)
#   PHASES="ckpt"      bash benchmarks/device/device_scale.sh
#
# Phases (PHASES; all five by default, more than one call's 10 minutes: a cold machine builds
# first; the build and the model in /tmp are reused while the machine stays warm):
#   gen    write /tmp/scale/full-qwen4exp-<LAYERS>L-<PLE_FRACTION>.gguf (kept: a later call reuses
#          it), after checking the free disk against `--plan`; gen.json has the sizes and seconds
#   load   engine load time, with use_mmap on and off (page cache warm) and on again after the
#          file is evicted from the page cache (a first start), stock PLE path; each load's "fit
#          estimate vs llama.cpp" log lines (load.jsonl)
#   fit    benchmarks/fit_sweep.py: the fit estimate per term against the buffers llama.cpp logs,
#          n_ctx 8K/32K/128K, n_ubatch UBATCH, flash attention on, stock and GPU PLE (fit.json)
#   bench  `velo-chat bench --ple PLE_MODES`: prefill at PREFILL sizes, DECODE_TOKENS greedy decode
#          tokens REPEATS times, every layer on the GPU, once per PLE path (bench.json)
#   ckpt   one engine (PLE path CKPT_PLE): per CKPT_SIZES conversation, a cold prefill, the same
#          turn saving checkpoints (their bytes; the wait for their disk writes after it), then the
#          turn again restored from the RAM tier, and from the disk tier in a new checkpoint store
#          after evicting the files from the page cache (ckpt.jsonl)
# Inputs in .device/ (benchmarks/device/prepare_device.sh): the sdist and wheels the build needs,
# gguf among them, and tiny-qwen4exp.gguf, whose tokenizer (SmolLM2's) the model copies.
# Switches: LAYERS (12), PLE_FRACTION (0.25), THREADS (nproc), PLE_MODES ("stock,gpu"), CKPT_PLE
# ("auto"), PREFILL ("2048,32768,131072"), CKPT_SIZES ("8192,32768,131072"), DECODE_TOKENS (128),
# REPEATS (3), UBATCH (512), CLEAN=1 deletes the model at the end.
# Output in $OUT/scale/: env.txt, plan.json, gen.json, load.jsonl, fit.json, fit.log, bench.json,
# bench.err, ckpt.jsonl, ckpt.err, and summary.txt (the lines printed below).
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
max_tokens=$(tr ',' '\n' <<< "$prefill,$ckpt_sizes" | sort -n | tail -1)
n_ctx=$(( max_tokens + 4096 ))
mkdir -p "$VELO_CHAT_HOME/config/profiles"
printf '[model]\npath = "%s"\nn_gpu_layers = -1\n[context]\nn_ctx = %d\nflash_attn = "on"\nn_ubatch = %d\nn_batch = %d\n' \
  "$model" "$n_ctx" "$ubatch" "$(( ubatch > 512 ? ubatch : 512 ))" > "$VELO_CHAT_HOME/config/profiles/scale.toml"

for phase in ${PHASES:-gen load fit bench ckpt}; do
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
      --ubatch "$ubatch" --ctx 8192,32768,131072 --flash-attn on --sched-debug "on,$ubatch,8192" \
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
  load | ckpt)
    timeout 560 python3 - "$phase" "$model" > "$scale/$phase.jsonl" 2> "$scale/$phase.err" <<'PY'
import json, logging, os, shutil, sys, tempfile, time
from pathlib import Path

from velo_chat.engine import make_engine
from velo_chat.engine.bench.result import conversation_of
from velo_chat.engine.config import build_profile
from velo_chat.engine.diagnostics import CHECKPOINT_SUFFIX, diagnostics, read_checkpoint_header

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


def evict(paths) -> None:
    """Written out and dropped from the page cache: the next read comes from the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_gib() -> float:
    meminfo = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return round(int(meminfo["Cached"].split()[0]) / 2**20, 1)


def emit(row) -> None:
    print(json.dumps(row), flush=True)


if phase == "load":
    for mmap, cold in ((True, False), (False, False), (True, True)):
        if cold:
            evict([model])
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
else:
    root = Path(tempfile.mkdtemp(prefix="scale-ckpt-", dir="/tmp"))
    engine = make_engine(profile(ple_gather=os.environ.get("CKPT_PLE", "auto")), model_path=model,
                         checkpoint_root=root / "unused")
    engine.load()
    diag = diagnostics(engine)
    emit({"load_s": round(engine.info.load_s, 2), "ple": engine.info.ple.gather if engine.info.ple else ""})
    with diag.checkpoints_at(None):  # warm-up: the first turn's one-off costs stay out of the rows
        diag.complete(conversation_of(engine, 512), max_tokens=1)

    def turn(conv):
        s = diag.complete(conv, max_tokens=1).stats
        c = s.checkpoint
        return {"ttft_s": round(s.ttft_s, 3), "prompt": s.prompt_tokens, "cached": s.cached_tokens,
                "prefill": s.prefill_tokens, "prefill_tok_s": round(s.prefill_tok_s, 1), "source": s.source,
                "restore_s": round(c.restore_s, 4) if c else None, "close_s": round(c.close_s, 4) if c else None,
                "saved": [[x.tokens, x.bytes] for x in c.saved] if c else []}

    for n in sizes:
        conv = conversation_of(engine, n)
        store = root / f"n{n}"
        row = {"size": n}
        diag.reset()
        with diag.checkpoints_at(None):
            row["cold"] = turn(conv)
        diag.reset()
        with diag.checkpoints_at(store):
            row["saving"] = turn(conv)
            t = time.perf_counter()
            diag.flush_checkpoints()
            row["write_wait_s"] = round(time.perf_counter() - t, 3)
            diag.reset()  # the live sequence goes; the RAM tier keeps the states
            row["from_ram"] = turn(conv)
        files = [p for p in store.rglob("*") if p.is_file()]
        headers = [read_checkpoint_header(p)[0] for p in store.glob(f"*/*{CHECKPOINT_SUFFIX}")]
        row["state_bytes"] = max((h.payload_bytes for h in headers), default=0)
        row["file_bytes"] = sum(p.stat().st_size for p in files)
        row["save_overhead_s"] = round(row["saving"]["ttft_s"] - row["cold"]["ttft_s"], 3)
        evict(files)
        diag.reset()
        with diag.checkpoints_at(store):  # a new store: an empty RAM tier, the files on disk
            row["from_disk"] = turn(conv)
        emit(row)
        shutil.rmtree(store)
    engine.close()
    shutil.rmtree(root, ignore_errors=True)
PY
    note "$phase: rc $?"
    python3 - "$scale/$phase.jsonl" <<'PY' | tee -a "$scale/summary.txt"
import json, sys
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "size" not in d:
        print({k: v for k, v in d.items() if k != "fit_vs_llama"})
        continue
    print(f"{d['size']:>7} tokens: state {d['state_bytes'] / 2**20:.1f} MiB, files {d['file_bytes'] / 2**20:.1f} MiB, "
          f"cold TTFT {d['cold']['ttft_s']} s, saving {d['saving']['ttft_s']} s ({d['save_overhead_s']:+} s), "
          f"write wait {d['write_wait_s']} s, restore RAM {d['from_ram']['restore_s']} s / disk "
          f"{d['from_disk']['restore_s']} s ({d['from_disk']['source']}, {d['from_disk']['cached']} cached)")
PY
    ;;
  *) note "unknown phase $phase"; exit 2 ;;
  esac
done
[ "${CLEAN:-0}" = 1 ] && rm -f "$model" "$model.done"
note "done; $(df -h /tmp/scale | tail -1)"
