"""Binary and invalid-UTF-8 input: refused in one line (NUL bytes) or replaced with U+FFFD.

The CLI cases run the real `velo-chat` in a subprocess with real bytes on stdin and in argv and
real files to import, then read what got stored through the store API. The store cases check
that no text with lone surrogates can crash a write (docs/privacy-and-input.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from velo_chat.engine.config import locations
from velo_chat.store import FORMAT, FORMAT_VERSION, InvalidImport, SessionStore
from velo_chat.store.input_text import BinaryInput, clean_text, decode_text, replace_surrogates

from tests.support.engine_helpers import run_cli, run_cli_bytes

BINARY = Path("/bin/ls").read_bytes()[:3000]  # the reported case: `head -c 3000 /bin/ls`
LATIN1 = "café déjà".encode("latin-1")  # text, but not UTF-8: é and à are one byte each


def stored() -> list[tuple[str, list[tuple[str, str]]]]:
    """Every session's title and (role, content) pairs, read back through the store API."""
    path = locations.database_path()
    if not path.exists():
        return []
    with SessionStore(path) as store:
        return [
            (s.title or "", [(m.role, m.content) for m in store.messages(s.id)])
            for s in store.list_sessions()
        ]


def stderr_lines(proc) -> list[str]:
    err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err, err
    return err.splitlines()


def session_file(**message: object) -> dict:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "session": {"title": "imported", "created_at": 1.0, "profile": "default"},
        "messages": [{"role": "user", "content": "hi", **message}],
    }


# -- the policy, as functions -------------------------------------------------------------------


def test_clean_text_replaces_lone_surrogates_and_joins_pairs() -> None:
    assert clean_text("plain ✓") == clean_text("plain ✓", "x")
    assert clean_text("a\udcff\udcfeb").text == "a\ufffd\ufffdb"  # argv bytes 0xff 0xfe
    assert clean_text("a\udcff\udcfeb").replaced == 2
    assert clean_text("x\ud800y").text == "x\ufffdy"  # a JSON "\ud800" escape
    joined = clean_text("\ud83d\ude00")  # a UTF-16 pair split into two code points
    assert joined.text == "😀" and joined.replaced == 0
    with pytest.raises(BinaryInput, match="the composer text is binary"):
        clean_text("pasted\0junk", "the composer text")


def test_decode_text_counts_bytes() -> None:
    clean = decode_text(LATIN1, "stdin")
    assert clean.text == "caf\ufffd d\ufffdj\ufffd" and clean.replaced == 3
    assert decode_text("ok ✓".encode(), "stdin").replaced == 0
    with pytest.raises(BinaryInput, match="^stdin is binary"):
        decode_text(BINARY, "stdin")
    assert replace_surrogates("keeps \0 NUL") == "keeps \0 NUL"  # storable; only input refuses


# -- the store boundary -------------------------------------------------------------------------


def test_no_text_with_surrogates_crashes_a_write(db_path: Path) -> None:
    with SessionStore(db_path) as store:
        s = store.create_session(
            "default\udcff", system_prompt="sys\ud800", title="t\udcff", model_fingerprint="fp\udcff"
        )
        assert (s.profile, s.system_prompt, s.title) == ("default\ufffd", "sys\ufffd", "t\ufffd")
        m = store.add_message(s.id, "user", "q\udcff", stats={"k\ud800": "v\udcff"})
        store.update_message(m.id, content="edited\udcfe", stats={"x": "\ud800"})
        store.rename(s.id, "renamed\udcff")
        store.update_session(s.id, system_prompt="new\ud800")
        assert store.search("edited\udcfe") is not None  # a query is bound too
        with pytest.raises(LookupError):
            store.resolve_id("\udcff")
        with pytest.raises(LookupError):
            store.delete("\udcff")
    with SessionStore(db_path) as store:  # what the rows hold, not what the objects said
        s = store.get_session(s.id)
        assert (s.title, s.system_prompt, s.model_fingerprint) == ("renamed\ufffd", "new\ufffd", "fp\ufffd")
        [m] = store.messages(s.id)
        assert (m.content, m.stats) == ("edited\ufffd", {"x": "\ufffd"})


def test_import_replaces_surrogate_escapes_and_refuses_nul_bytes(db_path: Path) -> None:
    escaped = json.dumps(session_file(content="bad \ud800 escape", stats={"a": "\udcff"}))
    assert "\\ud800" in escaped  # the file holds the escape, as another tool would write it
    with SessionStore(db_path) as store:
        s = store.import_json(escaped)
        [m] = store.messages(s.id)
        assert (m.content, m.stats) == ("bad \ufffd escape", {"a": "\ufffd"})
        with pytest.raises(InvalidImport, match="NUL bytes"):
            store.import_json(escaped.encode() + b"\0")
        assert len(store.list_sessions()) == 1


# -- the real CLI -------------------------------------------------------------------------------


def test_ask_refuses_binary_stdin() -> None:
    proc = run_cli_bytes("ask", "-", stdin=BINARY)
    assert proc.returncode == 2
    assert stderr_lines(proc) == [
        "velo-chat: error: stdin is binary (it contains NUL bytes), not text; nothing was stored"
    ]
    assert proc.stdout == b""
    assert stored() == []


def test_ask_replaces_invalid_utf8_on_stdin(velo_home: Path) -> None:
    proc = run_cli_bytes("ask", "-", "--max-tokens", "4", "--json", stdin=b"Say " + LATIN1)
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == ["velo-chat: warning: stdin: replaced 3 invalid UTF-8 bytes with U+FFFD"]
    [(title, messages)] = stored()
    assert messages[0] == ("user", "Say caf\ufffd d\ufffdj\ufffd")
    assert json.loads(proc.stdout)["session_id"]


def test_ask_replaces_undecodable_argv_bytes(velo_home: Path) -> None:
    # Python decodes argv with surrogateescape: b"\xff" arrives as "\udcff".
    proc = run_cli_bytes("ask", b"Hello \xff\xfe world", "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == [
        "velo-chat: warning: the prompt: replaced 2 invalid UTF-8 bytes with U+FFFD"
    ]
    [(title, messages)] = stored()
    assert messages[0] == ("user", "Hello \ufffd\ufffd world")
    assert title == "Hello \ufffd\ufffd world"


def test_rename_and_search_with_undecodable_argv_bytes() -> None:
    with SessionStore(locations.database_path()) as store:
        sid = store.create_session("default").id
    proc = run_cli_bytes("sessions", "rename", sid, b"caf\xe9")
    assert proc.returncode == 0 and stderr_lines(proc) == []
    assert stored() == [("caf\ufffd", [])]
    proc = run_cli_bytes("sessions", "search", b"caf\xe9")
    assert proc.returncode == 0 and stderr_lines(proc) == []


def test_import_refuses_a_binary_file(tmp_path: Path) -> None:
    path = tmp_path / "session.json"
    path.write_bytes(json.dumps(session_file()).encode() + b"\0\0\0")
    proc = run_cli("sessions", "import", str(path))
    assert proc.returncode == 2
    assert stderr_lines(proc) == [
        f"velo-chat: error: {path} is binary (it contains NUL bytes), not text; nothing was stored"
    ]
    assert stored() == []


def test_import_replaces_invalid_utf8_and_surrogate_escapes(tmp_path: Path) -> None:
    raw = json.dumps(session_file(content="XX and \udcff"), ensure_ascii=True).encode()
    path = tmp_path / "session.json"
    path.write_bytes(raw.replace(b"XX", LATIN1))  # raw Latin-1 inside a JSON string
    proc = run_cli("sessions", "import", str(path))
    assert proc.returncode == 0, proc.stderr
    assert stderr_lines(proc) == [f"velo-chat: warning: {path}: replaced 3 invalid UTF-8 bytes with U+FFFD"]
    assert stored() == [("imported", [("user", "caf\ufffd d\ufffdj\ufffd and \ufffd")])]
    assert proc.stdout.strip() == run_cli("sessions", "list", "--json").stdout.split('"')[3]


def test_import_of_an_unreadable_or_invalid_file_is_one_line(tmp_path: Path) -> None:
    missing = run_cli("sessions", "import", str(tmp_path / "nope.json"))
    assert missing.returncode == 2 and len(stderr_lines(missing)) == 1
    bad = tmp_path / "bad.json"
    bad.write_bytes(b"\xff\xfe{not json")
    proc = run_cli("sessions", "import", str(bad))
    assert proc.returncode == 2
    [line] = stderr_lines(proc)  # a refusal is one line: no warning about the bytes before it
    assert line.startswith("velo-chat: error: invalid session file: not JSON"), line
    assert stored() == []
    assert os.environ[locations.HOME_ENV]  # every case ran in an isolated home
