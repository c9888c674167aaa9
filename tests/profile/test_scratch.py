"""The profiler's scratch directory (korch.profile.scratch): a killed process's is removed by the
next profiler, never a live process's or anything not named as korch names its own."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from korch.profile import scratch


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX")
def test_a_dead_processs_scratch_goes_and_the_rest_stays(tmp_path, monkeypatch):
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(done.stdout)  # (a process that has exited)
    folders = {
        "dead": tmp_path / f"korch-profile-{dead}-abcd_123",
        "alive": tmp_path / f"korch-profile-{os.getpid()}-abcd_123",
        "other": tmp_path / f"korch-profile-{dead}-notours",  # (not tempfile's eight characters)
        "plain": tmp_path / "korch-profile-x",
    }
    for folder in folders.values():
        folder.mkdir()
        (folder / "v0.npy").write_bytes(b"x" * 100)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch.scratch_directory() as new:
        assert os.path.basename(new).startswith(f"korch-profile-{os.getpid()}-")
        assert not folders["dead"].exists()
        assert all(folders[k].exists() for k in ("alive", "other", "plain"))
        assert scratch.remove_dead(tmp_path) == []  # (its own, in use, stays too)
    assert not os.path.exists(new)
