"""The stats JSON the store keeps with each reply reads back into `TurnStats` and its parts.

The rows below are exactly what velo-chat wrote before `TurnStats` had parts (captured from that
code: `store.rows.stats_json(done.stats.to_json())`): a local turn with checkpoints and
speculation on, one whose verify batches drafted, a remote turn on llama.cpp's server (which
reports `timings`), one on a server that reports nothing, and a row as the first release wrote
it. A local row reads back to the same JSON; a remote row's server times move into its server
part, and the parts it never had are null."""

from __future__ import annotations

import dataclasses
import json

import pytest

from velo_chat.engine.events import (
    CheckpointStats,
    LlamaTimings,
    SavedCheckpoint,
    ServerStats,
    SpeculationStats,
    TurnDone,
    TurnStats,
)
from velo_chat.engine.diagnostics import diagnostics
from velo_chat.engine.prompt.chat_template import ChatMessage

LOCAL = (
    '{"answer_tokens": 24, "backend": "local", "cached_tokens": 0, "checkpoint": {"close_s": 0.0219, '
    '"restore_s": 0.0, "saved": [{"bytes": 945876, "tokens": 41}, {"bytes": 1637436, "tokens": 71}], '
    '"source": "none"}, "decode_threads": 2.0, "decode_tok_s": 95.29, "decode_tokens": 24, '
    '"finish_reason": "length", "first_answer_s": 2.3105, "graphs_reused": 23, "llama_eval_ms": 238.77, '
    '"llama_prompt_eval_ms": 1112.264, "prefill_tok_s": 18.22, "prefill_tokens": 42, "prompt_tokens": 42, '
    '"reasoning_tokens": 0, "speculation": {"acceptance": 0.0, "accepted": 0, "after_verify_steps": 0.0, '
    '"batch_steps": {}, "batches": {}, "declined": 8, "decode_calls": 23, "drafted": 0, "exactness": '
    "\"batch rounding: decode on 2 threads splits one token's attention otherwise than a batch's "
    '(n_threads = 1 keeps them alike)", "guarded": 0, "rounds": 0, "tokens_per_call": 1.0}, '
    '"total_s": 2.5519, "ttft_s": 2.3105, "wall_ms": 241.765}'
)
DRAFTED = (
    '{"answer_tokens": 60, "backend": "local", "cached_tokens": 0, "checkpoint": {"close_s": 0.0277, '
    '"restore_s": 0.0, "saved": [{"bytes": 2213736, "tokens": 96}, {"bytes": 3735168, "tokens": 162}], '
    '"source": "none"}, "decode_threads": 1.0, "decode_tok_s": 48.94, "decode_tokens": 60, '
    '"finish_reason": "length", "first_answer_s": 2.5699, "graphs_reused": 23, "llama_eval_ms": 274.754, '
    '"llama_prompt_eval_ms": 2550.562, "prefill_tok_s": 37.83, "prefill_tokens": 97, "prompt_tokens": 97, '
    '"reasoning_tokens": 0, "speculation": {"acceptance": 1.0, "accepted": 30, "after_verify_steps": 1.498, '
    '"batch_steps": {"11": 4.264, "2": 33.122}, "batches": {"11": 2, "2": 2, "9": 1}, "declined": 23, '
    '"decode_calls": 29, "drafted": 30, "exactness": "bit-identical", "guarded": 1, "rounds": 5, '
    '"tokens_per_call": 2.034}, "total_s": 3.7754, "ttft_s": 2.5699, "wall_ms": 1205.901}'
)
REMOTE = (
    '{"answer_tokens": 6, "backend": "remote", "cached_tokens": 12, "checkpoint": {"source": "server"}, '
    '"decode_threads": 0.0, "decode_tok_s": 100.0, "decode_tokens": 6, "finish_reason": "stop", '
    '"first_answer_s": 0.0747, "graphs_reused": 0, "llama_eval_ms": 60.0, "llama_prompt_eval_ms": 4.0, '
    '"prefill_tok_s": 1250.0, "prefill_tokens": 5, "prompt_tokens": 17, "reasoning_tokens": 0, "server": '
    '{"cache_n": 12, "client_tok_s": 6250.27, "draft_n": 4, "draft_n_accepted": 3, "predicted_per_second": '
    '100.0, "prompt_n": 5, "prompt_per_second": 1250.0, "usage": {"completion_tokens": 6, "prompt_tokens": '
    '17, "prompt_tokens_details": {"cached_tokens": 12}, "total_tokens": 23}}, "speculation": '
    '{"acceptance": 0.0, "accepted": 0, "after_verify_steps": 0.0, "batch_steps": {}, "batches": {}, '
    '"declined": 0, "decode_calls": 0, "drafted": 0, "exactness": "", "guarded": 0, "rounds": 0, '
    '"tokens_per_call": 0.0}, "total_s": 0.0763, "ttft_s": 0.0747, "wall_ms": 0.8}'
)
REMOTE_PLAIN = (
    '{"answer_tokens": 6, "backend": "remote", "cached_tokens": 0, "checkpoint": {"source": "none"}, '
    '"decode_threads": 0.0, "decode_tok_s": 8603.04, "decode_tokens": 6, "finish_reason": "stop", '
    '"first_answer_s": 0.045, "graphs_reused": 0, "llama_eval_ms": 0.0, "llama_prompt_eval_ms": 0.0, '
    '"prefill_tok_s": 0.0, "prefill_tokens": 0, "prompt_tokens": 0, "reasoning_tokens": 0, "server": '
    '{"client_tok_s": 8603.04}, "speculation": {"acceptance": 0.0, "accepted": 0, "after_verify_steps": '
    '0.0, "batch_steps": {}, "batches": {}, "declined": 0, "decode_calls": 0, "drafted": 0, "exactness": '
    '"", "guarded": 0, "rounds": 0, "tokens_per_call": 0.0}, "total_s": 0.0458, "ttft_s": 0.045, '
    '"wall_ms": 0.581}'
)
FIRST_RELEASE = (
    '{"ttft_s": 0.31, "prompt_tokens": 30, "cached_tokens": 20, "prefill_tokens": 10, "prefill_tok_s": 50.0, '
    '"decode_tokens": 5, "decode_tok_s": 40.0, "graphs_reused": 3, "llama_eval_ms": 90.5, '
    '"llama_prompt_eval_ms": 200.25, "wall_ms": 100.0, "total_s": 0.45, "finish_reason": "stop", '
    '"checkpoint": {"source": "ram", "restore_s": 0.002, "saved": [{"tokens": 29, "bytes": 1000}]}}'
)


def stored(text: str) -> TurnStats:
    return TurnStats.from_json(json.loads(text))


@pytest.mark.parametrize("row", [LOCAL, DRAFTED], ids=["local", "drafted"])
def test_a_local_row_reads_into_the_parts_and_writes_back_the_same(row):
    stats = stored(row)
    assert stats.to_json() == json.loads(row)
    assert stats.backend == "local" and stats.server is None
    assert isinstance(stats.checkpoint, CheckpointStats) and isinstance(stats.llama, LlamaTimings)
    assert isinstance(stats.speculation, SpeculationStats)


def test_the_parts_hold_the_numbers_of_the_row():
    s = stored(DRAFTED)
    assert (s.prompt_tokens, s.prefill_tokens, s.decode_tokens, s.finish_reason) == (97, 97, 60, "length")
    assert (s.ttft_s, s.first_answer_s, s.total_s, s.source) == (2.5699, 2.5699, 3.7754, "none")
    assert s.checkpoint == CheckpointStats(
        0.0, (SavedCheckpoint(96, 2213736), SavedCheckpoint(162, 3735168)), 0.0277
    )
    assert s.llama == LlamaTimings(23, 274.754, 2550.562, 1205.901, 1.0)
    spec = s.speculation
    assert spec is not None
    assert (spec.drafted, spec.accepted, spec.rounds, spec.declined, spec.guarded) == (30, 30, 5, 23, 1)
    assert spec.batches == {11: 2, 2: 2, 9: 1} and spec.batch_steps == {11: 4.264, 2: 33.122}
    assert (spec.after_verify_steps, spec.decode_calls, spec.exactness) == (1.498, 29, "bit-identical")
    assert spec.acceptance == 1.0 and round(s.tokens_per_call, 3) == 2.034
    # not stored: from the counts and the rates
    assert s.prefill_s == pytest.approx(97 / 37.83) and s.decode_s == pytest.approx(59 / 48.94)


def test_a_remote_row_keeps_the_servers_numbers_and_has_no_local_parts():
    s = stored(REMOTE)
    assert (s.backend, s.source, s.cached_tokens, s.prefill_tokens, s.decode_tok_s) == (
        "remote",
        "server",
        12,
        5,
        100.0,
    )
    assert s.checkpoint is None and s.speculation is None and s.llama is None
    assert s.server == ServerStats(
        client_tok_s=6250.27,
        prompt_n=5,
        cache_n=12,
        prompt_ms=4.0,  # the row kept the server's times in llama_prompt_eval_ms and llama_eval_ms
        prompt_per_second=1250.0,
        predicted_ms=60.0,
        predicted_per_second=100.0,
        draft_n=4,
        draft_n_accepted=3,
        usage={
            "completion_tokens": 6,
            "prompt_tokens": 17,
            "prompt_tokens_details": {"cached_tokens": 12},
            "total_tokens": 23,
        },
    )
    out, before = s.to_json(), json.loads(REMOTE)
    assert set(out) == set(before)  # the same keys; those of the parts a server lacks are null
    for key in (
        "graphs_reused",
        "llama_eval_ms",
        "llama_prompt_eval_ms",
        "wall_ms",
        "decode_threads",
        "speculation",
    ):
        assert out[key] is None
    assert out["checkpoint"] == {"source": "server"}
    assert out["server"] == {**before["server"], "prompt_ms": 4.0, "predicted_ms": 60.0}
    same = {
        k
        for k in before
        if k
        not in (
            "graphs_reused",
            "llama_eval_ms",
            "llama_prompt_eval_ms",
            "wall_ms",
            "decode_threads",
            "speculation",
            "server",
        )
    }
    assert {k: out[k] for k in same} == {k: before[k] for k in same}
    assert TurnStats.from_json(out) == s  # and the new JSON reads back the same


def test_a_server_that_reported_nothing():
    s = stored(REMOTE_PLAIN)
    assert s.server == ServerStats(client_tok_s=8603.04)  # 0.0 in the old row: not reported
    assert s.to_json()["server"] == {"client_tok_s": 8603.04}


def test_a_row_of_the_first_release_reads_with_what_it_has():
    s = stored(FIRST_RELEASE)
    assert (s.backend, s.source, s.reasoning_tokens, s.first_answer_s) == ("local", "ram", 0, None)
    assert s.checkpoint == CheckpointStats(0.002, (SavedCheckpoint(29, 1000),), 0.0)
    assert s.llama == LlamaTimings(3, 90.5, 200.25, 100.0, 0.0)  # decode threads: unknown
    assert s.speculation is None and s.to_json()["speculation"] is None


@pytest.mark.parametrize("row", [{}, {"error": "llama_decode failed"}, [], "text"])
def test_rows_without_a_turns_stats_say_so(row):
    """A user message stores `{}`, a failed turn `{"error": ...}`."""
    with pytest.raises(ValueError):
        TurnStats.from_json(row)


def test_a_turn_writes_the_keys_it_wrote_before(smol_engine):
    """The JSON of a turn on the real engine has the keys and the nesting of the rows above."""
    diagnostics(smol_engine).reset()
    with smol_engine.turn([ChatMessage("user", "Name a colour.")], max_tokens=6) as turn:
        done = next(e for e in turn if isinstance(e, TurnDone))
    out, before = done.stats.to_json(), json.loads(LOCAL)

    def shape(d):
        return {
            k: shape(v) if isinstance(v, dict) and k not in ("batches", "batch_steps") else type(v).__name__
            for k, v in d.items()
        }

    # Keys added since those rows were captured, written only when they apply.
    added = {"checkpoint": {"decision", "restore_est_s", "prefill_est_s"}, "": {"reasoning_budget_hit"}}

    def without_added(d, where=""):
        return {
            k: without_added(v, k) if isinstance(v, dict) else v
            for k, v in d.items()
            if k not in added.get(where, set())
        }

    assert list(out) == [k for k in json.loads(json.dumps(done.stats.to_json()))]  # plain JSON
    assert without_added(shape(json.loads(json.dumps(out, sort_keys=True)))) == shape(before)
    assert TurnStats.from_json(out).to_json() == out


def test_a_snapshots_time_on_the_turns_thread_round_trips():
    """Rows stored before a snapshot's seconds were kept read them as 0.0 (above); new rows
    keep them."""
    saved = (SavedCheckpoint(96, 2213736, 0.01234), SavedCheckpoint(162, 3735168, 0.5))
    s = dataclasses.replace(stored(DRAFTED), checkpoint=CheckpointStats(0.0, saved, 0.0277))
    out = json.loads(json.dumps(s.to_json()))
    assert [x["s"] for x in out["checkpoint"]["saved"]] == [0.0123, 0.5]
    back = TurnStats.from_json(out).checkpoint
    assert back is not None
    assert back.saved == (SavedCheckpoint(96, 2213736, 0.0123), SavedCheckpoint(162, 3735168, 0.5))
