"""The profile database: SQLite in WAL mode, one row per (candidate key, backend and its version,
device). Each result is committed on its own, so a killed run loses only the kernels in flight. A
failure of the machine rather than of the kernel (its worker died, it timed out, memory ran out) is
counted instead of kept: later runs profile it again, up to ENVIRONMENTAL_CAP failures."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from korch.config import ENVIRONMENTAL_CAP, LOCK_WAIT_S
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
    env_failures INTEGER NOT NULL DEFAULT 0,
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
# a plan measured in place, or a runoff between plans (korch.profile.plan_timing): what
# korch.plan.refine decided by, so a later optimize on the same prices decides the same without
# compiling and running the plans again
PLAN_SCHEMA = """
CREATE TABLE IF NOT EXISTS plan_timings (
    key TEXT NOT NULL,
    version TEXT NOT NULL,
    device TEXT NOT NULL,
    ms REAL NOT NULL,
    min_ms REAL NOT NULL,
    detail TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (key, version, device)
)
"""
# the device's fastest copy and matmul ever measured (korch.measure.roofline.measure_ceilings), the
# floors of the lower bounds' rates: kept, so that a certificate does not move with each run's noise
CEILING_SCHEMA = """
CREATE TABLE IF NOT EXISTS ceilings (
    device TEXT NOT NULL,
    version TEXT NOT NULL,
    name TEXT NOT NULL,
    value REAL NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (device, version, name)
)
"""
SCHEMAS = (SCHEMA, REWRITE_SCHEMA, PLAN_SCHEMA, CEILING_SCHEMA)


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
    # a failure of the machine, not of the kernel (its worker died, it timed out, memory ran
    # out): a later run profiles it again, up to ENVIRONMENTAL_CAP times
    transient: bool = False

    @property
    def cost_ms(self) -> float:
        return self.median_ms if self.status == "ok" and self.median_ms is not None else float("inf")


def default_path() -> Path:
    return Path(os.path.expanduser("~/.cache/korch/profiles.sqlite"))


# the columns that hold numbers, none negative: anything else (text written by another program,
# a damaged row) would reach the solver as a latency
_NUMBERS = {
    "profiles": ("median_ms", "min_ms", "max_ms", "kernels", "compile_s", "env_failures"),
    "rewrite_timings": ("before_ms", "after_ms"),
    "plan_timings": ("ms", "min_ms"),
    "ceilings": ("value",),
}
# an older korch's failures that were the machine's, by the reasons it wrote: a migrated database
# profiles them again
_ENVIRONMENTAL_REASONS = (
    "worker died%",
    "timed out%",
    "Ray worker failed%",
    "MemoryError%",
    "OutOfMemoryError%",
)


@functools.cache
def _columns(table: str) -> tuple[str, ...]:
    """The columns of korch's TABLE, in order."""
    conn = sqlite3.connect(":memory:")
    try:
        for schema in SCHEMAS:
            conn.execute(schema)
        return _table_columns(conn, table)
    finally:
        conn.close()


def _legacy_profiles() -> tuple[str, ...]:
    """The profiles table as korch wrote it before environmental failures were counted."""
    return tuple(c for c in _columns("profiles") if c != "env_failures")


def _make_directory(path: Path) -> None:
    """The database's directory, or one line saying why it cannot be made."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KorchError(
            f"cannot create the profile database {path}: {cannot_create(path.parent, e)}"
        ) from None


def _check_file(path: Path) -> None:
    """A path SQLite would open but cannot use as a database: a directory ("unable to open"), a
    FIFO or a device (it would read and write it as if it were a file)."""
    if path.is_dir():
        raise KorchError(f"{path} is a directory, not a profile database file")
    if path.exists() and not path.is_file():
        raise KorchError(
            f"{path} is not a regular file (a FIFO, a socket or a device): not a profile database"
        )


def _error(path: Path, e: sqlite3.Error) -> KorchError:
    """SQLite's error as one line that says what to do about it."""
    text = str(e)
    if "locked" in text or "busy" in text:
        return KorchError(
            f"{path} is locked by another program (waited {LOCK_WAIT_S:g} s); try again when it "
            "is done, or use another profile database"
        )
    if "readonly" in text:
        return KorchError(f"cannot write the profile database {path}: it is read-only")
    if "unable to open" in text:
        return KorchError(
            f"cannot write the profile database {path}: unable to open it, or to create its "
            f"journal beside it (is {path.parent} writable?)"
        )
    if "full" in text or "I/O" in text:
        return KorchError(f"cannot write the profile database {path}: {text}")
    if "malformed" in text:  # korch's file, damaged: what it held can be measured again
        return KorchError(
            f"{path}: the profile database is damaged ({text}); it is a cache and can be deleted"
        )
    return KorchError(f"{path}: not a usable profile database ({text})")


def _one_line(method):
    """A ProfileDB method whose SQLite errors (a lock held past LOCK_WAIT_S, a full disk, a page
    found damaged) are one line, not a traceback, wherever in the run they happen."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as e:
            raise _error(self.path, e) from None

    return wrapped


class ProfileDB:
    def __init__(self, path: str | os.PathLike | None = None):
        """Open the database for writing, or refuse it with one line before any work: checks that
        only read come first, so a file that is not korch's, or is damaged, is left unchanged."""
        self.path = Path(path) if path else default_path()
        _check_file(self.path)
        _make_directory(self.path)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=LOCK_WAIT_S, isolation_level=None)
        except sqlite3.Error as e:
            raise _error(self.path, e) from None
        try:
            tables = self._check_schema()
            self._check_contents(tables)
            self._wal_mode()
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self._prepare(tables)
        except sqlite3.Error as e:
            self.conn.close()
            raise _error(self.path, e) from None
        except BaseException:
            self.conn.close()
            raise

    def _check_schema(self) -> dict[str, tuple[str, ...]]:
        """korch's tables in the file, each with its columns (none: a new database). A file that
        holds anything else is refused: writing ours beside another program's (or switching its
        file to WAL) would change a database that is not ours."""
        rows = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        names = sorted(name for _, name in rows if not name.startswith("sqlite_"))
        tables = sorted(name for kind, name in rows if kind == "table" and name in names)
        if not names:
            return {}
        if "profiles" not in tables:
            held = f"table{'s' * (len(tables) > 1)} {', '.join(tables)}" if tables else ", ".join(names)
            raise KorchError(f"{self.path} is not a korch profile database (it holds {held})")
        foreign = [f"{kind} {name}" for kind, name in sorted(rows) if name in names and name not in _NUMBERS]
        if foreign:
            raise KorchError(
                f"{self.path} holds korch's profiles and also {', '.join(foreign)}, which korch did "
                "not create: refused, to leave another program's data alone"
            )
        columns: dict[str, tuple[str, ...]] = {}
        for table in tables:
            have = columns[table] = _table_columns(self.conn, table)
            if have != _columns(table) and not (table == "profiles" and have == _legacy_profiles()):
                raise KorchError(
                    f"{self.path} is not a korch profile database "
                    f"(its {table} table has other columns: {', '.join(have)})"
                )
        return columns

    def _check_contents(self, tables: dict[str, tuple[str, ...]]) -> None:
        """SQLite's check of every page (a damaged one would otherwise fail a lookup in the middle
        of profiling), and numbers where korch keeps numbers."""
        problem = self.conn.execute("PRAGMA quick_check(1)").fetchone()[0]
        if problem != "ok":
            where = " ".join(problem.replace("*** in database main ***", "").split())  # (over lines)
            raise KorchError(
                f"{self.path}: the profile database is damaged ({where}); it is a cache and can be deleted"
            )
        for table, have in tables.items():
            columns = [c for c in _NUMBERS[table] if c in have]
            bad = " OR ".join(f"typeof({c}) NOT IN ('integer', 'real', 'null') OR {c} < 0" for c in columns)
            row = self.conn.execute(
                f"SELECT {', '.join(columns)} FROM {table} WHERE {bad} LIMIT 1"
            ).fetchone()
            if row is not None:
                column, value = next(
                    (c, v)
                    for c, v in zip(columns, row)
                    if not (isinstance(v, (int, float)) and v >= 0 or v is None)
                )
                raise KorchError(
                    f"{self.path}: not a usable profile database (a row's {column} is {value!r}, not a "
                    "number of at least 0); it is a cache and can be deleted"
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

    def _prepare(self, tables: dict[str, tuple[str, ...]]) -> None:
        """In one write transaction: prove that the file can be written (a read-only file opens,
        and failed only at the first result stored, after the compiles), create korch's tables
        and bring an older korch's up to date. Waiting for the transaction is waiting for a lock."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            self.conn.execute("SAVEPOINT probe")  # a write that always writes, then undone
            self.conn.execute("CREATE TABLE korch_write_probe (x)")
            self.conn.execute("ROLLBACK TO probe")
            self.conn.execute("RELEASE probe")
            if "profiles" in tables and "env_failures" not in tables["profiles"]:
                self._count_environmental_failures()
            for schema in SCHEMAS:  # an older korch database gains the tables it lacks here
                self.conn.execute(schema)
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:  # (SQLite ends it itself after some errors: a full disk)
                self.conn.execute("ROLLBACK")
            raise

    def _count_environmental_failures(self) -> None:
        """An older korch stored a worker's death or a timeout as a permanent failure: the new
        column counts each as one environmental failure, so the next run profiles it again."""
        self.conn.execute("ALTER TABLE profiles ADD COLUMN env_failures INTEGER NOT NULL DEFAULT 0")
        like = " OR ".join("reason LIKE ?" for _ in _ENVIRONMENTAL_REASONS)
        self.conn.execute(
            f"UPDATE profiles SET env_failures = 1 WHERE status = 'failed' AND ({like})",
            _ENVIRONMENTAL_REASONS,
        )

    def close(self) -> None:
        self.conn.close()

    @_one_line
    def lookup(self, key: str, backend: str, version: str, device: str) -> Profile | None:
        """The stored profile, or None: never profiled, or failed for reasons of the machine
        fewer than ENVIRONMENTAL_CAP times (then it is profiled again)."""
        row = self.conn.execute(
            "SELECT status, median_ms, min_ms, max_ms, kernels, compile_s, reason, env_failures "
            "FROM profiles WHERE key=? AND backend=? AND backend_version=? AND device=?",
            (key, backend, version, device),
        ).fetchone()
        if row is None or row[0] == "failed" and 0 < row[-1] < ENVIRONMENTAL_CAP:
            return None
        return Profile(key, backend, *row[:-1])

    def spec_json(self, key: str) -> dict | None:
        row = self.conn.execute("SELECT spec FROM profiles WHERE key=? LIMIT 1", (key,)).fetchone()
        return None if row is None else json.loads(row[0])

    @_one_line
    def store(self, profile: Profile, version: str, device: str, signature: str, spec: dict) -> None:
        """Keep a result. A transient failure adds one to the environmental failures counted for
        its row (a failure after them all is kept as the kernel's own); any other result replaces
        the row and its count."""
        columns = _columns("profiles")
        values = (
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
            int(profile.transient),
        )
        replaced = ", ".join(f"{c}=excluded.{c}" for c in columns[4:-1])
        self.conn.execute(
            f"INSERT INTO profiles ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT (key, backend, backend_version, device) DO UPDATE SET {replaced}, "
            "env_failures = CASE WHEN excluded.env_failures > 0 AND profiles.status = 'failed' "
            "THEN profiles.env_failures + 1 ELSE excluded.env_failures END",
            values,
        )

    @_one_line
    def rewrite_timing(self, key: str, version: str, device: str) -> tuple[float, float] | None:
        """(ms before, ms after) of a measured rewrite (korch.profile.rewrite_timing), if kept."""
        row = self.conn.execute(
            "SELECT before_ms, after_ms FROM rewrite_timings WHERE key=? AND version=? AND device=?",
            (key, version, device),
        ).fetchone()
        return None if row is None else (row[0], row[1])

    @_one_line
    def store_rewrite_timing(
        self, key: str, version: str, device: str, before_ms: float, after_ms: float
    ) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO rewrite_timings VALUES (?,?,?,?,?,?)",
            (key, version, device, before_ms, after_ms, time.time()),
        )

    @_one_line
    def plan_timing(self, key: str, version: str, device: str) -> dict | None:
        """What a plan or a runoff measured (korch.profile.plan_timing), if kept and readable."""
        row = self.conn.execute(
            "SELECT detail FROM plan_timings WHERE key=? AND version=? AND device=?",
            (key, version, device),
        ).fetchone()
        try:
            detail = None if row is None else json.loads(row[0])
        except ValueError:  # damaged: measured again, and replaced
            return None
        return detail if isinstance(detail, dict) else None

    @_one_line
    def store_plan_timing(
        self, key: str, version: str, device: str, ms: float, min_ms: float, detail: dict
    ) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO plan_timings VALUES (?,?,?,?,?,?,?)",
            (key, version, device, ms, min_ms, json.dumps(detail), time.time()),
        )

    @_one_line
    def raise_ceilings(self, device: str, version: str, measured: dict[str, float]) -> dict[str, float]:
        """The largest of each ceiling ever kept for the device and `measured` now, kept and returned."""
        for name, value in measured.items():
            self.conn.execute(
                "INSERT INTO ceilings VALUES (?,?,?,?,?) ON CONFLICT (device, version, name) "
                "DO UPDATE SET value = excluded.value, created = excluded.created "
                "WHERE excluded.value > ceilings.value",
                (device, version, name, value, time.time()),
            )
        query = "SELECT name, value FROM ceilings WHERE device=? AND version=?"
        rows = self.conn.execute(query, (device, version))
        return {name: value for name, value in rows if name in measured}

    @_one_line
    def count(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM profiles").fetchone()[0]

    def integrity_ok(self) -> bool:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))
