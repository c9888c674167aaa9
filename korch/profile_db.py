"""The profile database: SQLite in WAL mode, one row per (candidate key, backend and its version,
device). Each result is committed on its own, so a killed run loses only the kernels in flight."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from korch.errors import KorchError, cannot_create

SCHEMA = """
CREATE TABLE IF NOT EXISTS profiles (
    key TEXT NOT NULL,
    backend TEXT NOT NULL,
    backend_version TEXT NOT NULL,
    device TEXT NOT NULL,
    signature TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'failed')),
    median_ms REAL,
    min_ms REAL,
    max_ms REAL,
    kernels INTEGER,
    compile_s REAL,
    reason TEXT,
    spec TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, backend, backend_version, device)
)
"""
REWRITE_SCHEMA = """
CREATE TABLE IF NOT EXISTS rewrite_timings (
    key TEXT NOT NULL,
    version TEXT NOT NULL,
    device TEXT NOT NULL,
    before_ms REAL NOT NULL,
    after_ms REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, version, device)
)
"""


@dataclass(frozen=True)
class Profile:
    key: str
    backend: str
    status: str  # "ok" or "failed"
    median_ms: float | None = None
    min_ms: float | None = None
    max_ms: float | None = None
    kernels: int | None = None
    compile_s: float | None = None
    reason: str | None = None

    @property
    def cost_ms(self) -> float:
        return self.median_ms if self.status == "ok" and self.median_ms is not None else float("inf")


def default_path() -> Path:
    return Path(os.path.expanduser("~/.cache/korch/profiles.sqlite"))


LOCK_WAIT_S = 60.0  # how long a run waits for another run's lock on the database


@functools.cache
def _columns(table: str) -> tuple[str, ...]:
    """The columns of korch's TABLE, in order (rows are written positionally)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute(SCHEMA)
        conn.execute(REWRITE_SCHEMA)
        return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
    finally:
        conn.close()


def _make_directory(path: Path) -> None:
    """The database's directory, or one line saying why it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KorchError(
            f"cannot create the profile database {path}: {cannot_create(path.parent, e)}"
        ) from None


class ProfileDB:
    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path else default_path()
        _make_directory(self.path)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=LOCK_WAIT_S, isolation_level=None)
        except sqlite3.DatabaseError as e:
            raise KorchError(f"{self.path}: not a usable profile database ({e})") from None
        try:
            self._check_schema()  # reads only: another program's database is refused unchanged
            self._wal_mode()
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.execute(SCHEMA)
            self.conn.execute(REWRITE_SCHEMA)  # an older korch database gains it here
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise KorchError(f"{self.path}: not a usable profile database ({e})") from None
        except BaseException:
            self.conn.close()
            raise

    def _check_schema(self) -> None:
        """A file that holds tables must hold korch's: writing ours beside another program's (or
        switching its file to WAL) would change a database that is not ours."""
        rows = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        names = sorted(name for _, name in rows if not name.startswith("sqlite_"))
        tables = sorted(name for kind, name in rows if kind == "table" and name in names)
        if not names:
            return  # a new (empty) database
        if "profiles" not in tables:
            held = f"table{'s' * (len(tables) > 1)} {', '.join(tables)}" if tables else ", ".join(names)
            raise KorchError(f"{self.path} is not a korch profile database (it holds {held})")
        for table in ("profiles", "rewrite_timings"):
            have = tuple(row[1] for row in self.conn.execute(f"PRAGMA table_info({table})"))
            if table in tables and have != _columns(table):
                raise KorchError(
                    f"{self.path} is not a korch profile database "
                    f"(its {table} table has other columns: {', '.join(have)})"
                )

    def _wal_mode(self) -> None:
        """Switch the file to WAL. While another run still writes to a new file in its first
        journal mode, SQLite refuses the switch at once ("database is locked") instead of waiting
        as it does for other locks, so the switch is retried for as long as a lock is waited for."""
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                self.conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def close(self) -> None:
        self.conn.close()

    def lookup(self, key: str, backend: str, version: str, device: str) -> Profile | None:
        row = self.conn.execute(
            "SELECT status, median_ms, min_ms, max_ms, kernels, compile_s, reason FROM profiles "
            "WHERE key=? AND backend=? AND backend_version=? AND device=?",
            (key, backend, version, device),
        ).fetchone()
        return None if row is None else Profile(key, backend, *row)

    def spec_json(self, key: str) -> dict | None:
        row = self.conn.execute("SELECT spec FROM profiles WHERE key=? LIMIT 1", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    def store(self, profile: Profile, version: str, device: str, signature: str, spec: dict) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO profiles VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                profile.key,
                profile.backend,
                version,
                device,
                signature,
                profile.status,
                profile.median_ms,
                profile.min_ms,
                profile.max_ms,
                profile.kernels,
                profile.compile_s,
                profile.reason,
                json.dumps(spec),
                time.time(),
            ),
        )

    def rewrite_timing(self, key: str, version: str, device: str) -> tuple[float, float] | None:
        """(ms before, ms after) of a measured rewrite (korch.rewrite.common.Timer), if kept."""
        row = self.conn.execute(
            "SELECT before_ms, after_ms FROM rewrite_timings WHERE key=? AND version=? AND device=?",
            (key, version, device),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    def store_rewrite_timing(
        self, key: str, version: str, device: str, before_ms: float, after_ms: float
    ) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO rewrite_timings VALUES (?,?,?,?,?,?)",
            (key, version, device, before_ms, after_ms, time.time()),
        )

    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM profiles").fetchone()[0]

    def integrity_ok(self) -> bool:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
