"""Files given as the profile database or the zoo directory: another program's SQLite database is
refused unchanged, an older korch database is upgraded, and a path through a regular file is one
`korch: error:` line and exit 2."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
import threading

import pytest
from helpers import relu_model

from korch.cli import commands as cli
from korch.errors import KorchError
from korch.profile.database import SCHEMA, Profile, ProfileDB


def _model(path):
    return relu_model(path, opset=13)


def _sqlite(path, *statements):
    conn = sqlite3.connect(path)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return path


def _state(path) -> tuple[str, int]:
    return hashlib.md5(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def _one_error_line(code, err) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, (code, err)
    assert lines[0].startswith("korch: error: ") and "unexpected" not in lines[0], lines[0]
    return lines[0]


def _optimize(tmp_path, cache, capsys) -> tuple[int, str]:
    argv = ["optimize", str(_model(tmp_path / "m.onnx")), "-o", str(tmp_path / "plan"), "--quiet"]
    code = cli.main([*argv, "--backends", "onnxruntime", "--max-size", "2", "--cache", str(cache)])
    return code, capsys.readouterr().err


FOREIGN = {
    "profiles-of-its-own": ("CREATE TABLE profiles (a INTEGER)", "INSERT INTO profiles VALUES (1)"),
    "other-tables": ("CREATE TABLE users (name TEXT)", "CREATE TABLE orders (id INTEGER)"),
    "korch-and-wrong-rewrite-timings": (SCHEMA, "CREATE TABLE rewrite_timings (key TEXT)"),
}


@pytest.mark.parametrize("statements", FOREIGN.values(), ids=FOREIGN.keys())
def test_another_programs_database_is_refused_and_left_unchanged(statements, tmp_path, capsys):
    db = _sqlite(tmp_path / "other.sqlite", *statements)
    before = _state(db)
    code, err = _optimize(tmp_path, db, capsys)
    line = _one_error_line(code, err)
    assert "is not a korch profile database" in line and str(db) in line
    assert _state(db) == before
    assert not (tmp_path / "plan").exists()
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    conn.close()


def test_the_refusal_names_the_tables_it_found(tmp_path):
    db = _sqlite(tmp_path / "other.sqlite", *FOREIGN["other-tables"])
    with pytest.raises(
        KorchError, match=r"is not a korch profile database \(it holds tables orders, users\)"
    ):
        ProfileDB(db)


def test_a_real_process_refusing_a_foreign_database_prints_no_traceback(tmp_path):
    db = _sqlite(tmp_path / "other.sqlite", *FOREIGN["profiles-of-its-own"])
    before = _state(db)
    argv = ["optimize", str(_model(tmp_path / "m.onnx")), "-o", str(tmp_path / "plan"), "--cache", str(db)]
    proc = subprocess.run([sys.executable, "-m", "korch.cli.commands", *argv], capture_output=True, text=True)
    _one_error_line(proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert _state(db) == before


@pytest.mark.e2e
def test_an_older_korch_database_without_rewrite_timings_is_upgraded(tmp_path, capsys):
    db = _sqlite(tmp_path / "old.sqlite", SCHEMA)
    opened = ProfileDB(db)
    opened.store(Profile("k", "onnxruntime", "ok", median_ms=1.0), "v1", "cpu", "sig", {"a": 1})
    opened.close()
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE rewrite_timings")  # as korch wrote it before rewrite timings were kept
    conn.commit()
    conn.close()
    code, err = _optimize(tmp_path, db, capsys)
    assert code == 0, err
    upgraded = ProfileDB(db)
    try:
        assert upgraded.lookup("k", "onnxruntime", "v1", "cpu").median_ms == 1.0
        assert upgraded.count() > 1
        assert upgraded.rewrite_timing("k", "v", "cpu") is None  # the table is there
        assert upgraded.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        upgraded.close()


def test_missing_and_empty_files_become_new_databases(tmp_path):
    (tmp_path / "empty.sqlite").write_bytes(b"")
    for path in (tmp_path / "empty.sqlite", tmp_path / "new" / "dir" / "p.sqlite"):
        db = ProfileDB(path)
        try:
            assert db.count() == 0 and db.rewrite_timing("k", "v", "cpu") is None
            assert db.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        finally:
            db.close()


def test_opening_waits_for_another_run_creating_korchs_tables(tmp_path):
    """Another run still creates the database in its first journal mode, where SQLite refuses the
    switch to WAL at once ("database is locked"): the check of the schema and the switch wait for
    it instead of failing (two optimizes on one fresh database could lose one of them), and its
    tables are korch's, so the file is accepted."""
    path = tmp_path / "p.sqlite"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute(SCHEMA)
    writer.execute(
        "INSERT INTO profiles (key, backend, backend_version, device, signature, status, spec, "
        "created) VALUES ('k', 'b', 'v', 'cpu', 's', 'failed', '{}', 0)"
    )
    threading.Timer(0.5, writer.execute, ["COMMIT"]).start()
    db = ProfileDB(path)
    try:
        assert db.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert db.lookup("k", "b", "v", "cpu").status == "failed"
    finally:
        db.close()
        writer.close()


@pytest.mark.parametrize("below", ["x.sqlite", "sub/x.sqlite"])
def test_a_cache_path_through_a_regular_file_is_one_line(below, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code, err = _optimize(tmp_path, blocker / below, capsys)
    line = _one_error_line(code, err)
    assert f"{blocker} exists and is not a directory" in line
    assert blocker.read_text() == "not a directory"


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_zoo_dir_through_a_regular_file_is_one_line_before_any_build(below, tmp_path, capsys, monkeypatch):
    from korch.cli import zoo

    def no_build(name):
        raise AssertionError("a model was built before the directory was checked")

    monkeypatch.setattr(zoo, "make_module", no_build)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = cli.main(["zoo", "candy", "--dir", str(blocker / below) if below else str(blocker)])
    line = _one_error_line(code, capsys.readouterr().err)
    assert f"{blocker} exists and is not a directory" in line
    assert blocker.read_text() == "not a directory"
