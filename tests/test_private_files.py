"""Every folder velo-chat creates is 0700 and every file it writes 0600, whatever the umask.

Real files under an isolated VELO_CHAT_HOME, written by the real code paths (the session store,
the log, profiles, settings, exports, checkpoints), under umask 022 (the usual one) and 000 (the
worst one); one end-to-end case runs the real `velo-chat ask` and checks everything it left.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from velo_chat.engine.llama import log as llama_log
from velo_chat.engine.config import locations
from velo_chat.engine.atomic_file import atomic_produce, atomic_write_text
from velo_chat.engine.config.profiles import save_user_profile, set_active_profile
from velo_chat.store import SessionStore

from tests.support.engine_helpers import run_cli, test_profile

UMASKS = [0o022, 0o000]


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes_under(root: Path) -> dict[str, int]:
    """`{relative path: mode}` for `root` and everything below it (links not followed)."""
    found = {".": mode(root)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            if not path.is_symlink():
                found[str(path.relative_to(root))] = mode(path)
    return found


def assert_private(root: Path) -> None:
    """Folders 0700, files 0600: one message listing every exception."""
    wrong = {
        rel: f"{m:o}"
        for rel, m in modes_under(root).items()
        if m != (0o700 if (root / rel).is_dir() else 0o600)
    }
    assert not wrong, f"not private under {root}: {wrong}"


@pytest.fixture(params=UMASKS, ids=lambda u: f"umask{u:03o}")
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """Run the test under this umask (restored afterwards; pytest runs tests one at a time)."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


@pytest.fixture
def new_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A VELO_CHAT_HOME that does not exist yet, two levels deep: velo-chat creates it all."""
    home = tmp_path / "not-yet" / "home"
    monkeypatch.setenv(locations.HOME_ENV, str(home))
    return home


def test_database_wal_and_shm_are_private(umask: int, new_home: Path) -> None:
    db = locations.database_path()
    with SessionStore(db) as store:
        session = store.create_session("default")
        store.add_message(session.id, "user", "my API key is hunter2")
        family = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        assert all(p.exists() for p in family)  # WAL mode, a write done, connection open
        assert {p.name: f"{mode(p):o}" for p in family} == {p.name: "600" for p in family}
    assert_private(new_home.parent)  # not-yet/ and home/ were created by velo-chat too


def test_an_existing_open_database_is_tightened(umask: int, new_home: Path) -> None:
    db = locations.database_path()
    os.chmod(db.parent, 0o755)  # as an older velo-chat left it
    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("CREATE TABLE t (x)")
    raw.execute("INSERT INTO t VALUES (1)")  # -wal and -shm exist while `raw` is open
    try:
        family = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
        for p in family:
            os.chmod(p, 0o644)
        SessionStore(db).close()
        assert {p.name: f"{mode(p):o}" for p in family} == {p.name: "600" for p in family}
        assert locations.data_dir() == db.parent and mode(db.parent) == 0o700
    finally:
        raw.close()


def test_folders_of_ours_are_tightened_but_not_the_users_parents(new_home: Path) -> None:
    new_home.mkdir(parents=True, mode=0o755)
    os.chmod(new_home, 0o755)  # the user's own VELO_CHAT_HOME: not ours, left alone
    (new_home / "config").mkdir(mode=0o755)
    os.chmod(new_home / "config", 0o755)
    assert mode(locations.config_dir()) == 0o700
    assert mode(new_home) == 0o755


def test_the_log_is_private(umask: int, new_home: Path) -> None:
    handler = llama_log.setup_file_logging(str(locations.log_path()))
    try:
        logging.getLogger("velo_chat.test").warning("something about a secret")
        handler.flush()
    finally:
        logging.getLogger("velo_chat").removeHandler(handler)
        handler.close()
    assert "something about a secret" in locations.log_path().read_text()
    assert_private(new_home)


def test_an_existing_open_log_is_tightened(new_home: Path) -> None:
    path = locations.log_path()
    path.write_text("old lines\n")
    os.chmod(path, 0o644)
    handler = llama_log.setup_file_logging(str(path))
    logging.getLogger("velo_chat").removeHandler(handler)
    handler.close()
    assert mode(path) == 0o600 and path.read_text() == "old lines\n"


def test_profiles_settings_and_tui_exports_are_private(umask: int, new_home: Path, tmp_path: Path) -> None:
    save_user_profile(test_profile(tmp_path / "model.gguf"))
    set_active_profile("test")
    atomic_write_text(locations.exports_dir() / "session.md", "# a conversation\n")
    assert (new_home / "config" / "profiles" / "test.toml").is_file()
    assert (new_home / "config" / "settings.toml").is_file()
    assert_private(new_home)


def test_cli_export_creates_a_private_file(umask: int, new_home: Path, tmp_path: Path) -> None:
    with SessionStore(locations.database_path()) as store:
        session = store.create_session("default")
        store.add_message(session.id, "user", "private words")
    out = tmp_path / "export.json"
    proc = run_cli("sessions", "export", session.id, "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "private words" in out.read_text() and mode(out) == 0o600
    # A file the user made is theirs: overwritten in place, its mode kept.
    mine = tmp_path / "shared.md"
    mine.write_text("")
    os.chmod(mine, 0o640)
    assert run_cli("sessions", "export", session.id, "-o", str(mine)).returncode == 0
    assert "private words" in mine.read_text() and mode(mine) == 0o640


def test_ask_end_to_end_leaves_only_private_files(umask: int, new_home: Path, smollm2_path: Path) -> None:
    """The real CLI in a fresh home: folders, database, log, checkpoints (all of it)."""
    save_user_profile(test_profile(smollm2_path))
    proc = run_cli("ask", "Say hello.", "--profile", "test", "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    tree = modes_under(new_home)
    assert "data/sessions.sqlite3" in tree and "logs/velo-chat.log" in tree
    checkpoints = [rel for rel in tree if rel.endswith(".vckpt")]
    assert checkpoints, sorted(tree)  # the profile saves a checkpoint before every reply
    assert_private(new_home.parent)


def test_a_file_made_by_path_is_private_and_whole_or_absent(umask: int, tmp_path: Path) -> None:
    """`atomic_produce` (llama.cpp's quantizer writes by path): the result is 0600 whatever the
    umask, and a writer that fails leaves neither the target nor its temp file."""
    target = tmp_path / "copy.gguf"
    atomic_produce(target, lambda tmp: tmp.write_bytes(b"whole"))
    assert target.read_bytes() == b"whole" and stat.S_IMODE(target.stat().st_mode) == 0o600

    def fails(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_produce(tmp_path / "other.gguf", fails)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copy.gguf"]
