"""The profiler's scratch directory: the graph's activations spilled for the workers to read and
the source model's bytes. It goes when the profiler closes; one
whose process was killed stays behind, so each new one first removes those of dead processes."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

PREFIX = "korch-profile-"
_NAME = re.compile(rf"{PREFIX}(\d+)-[a-z0-9_]{{8}}")  # (tempfile's eight characters after it)


def scratch_directory() -> tempfile.TemporaryDirectory:
    """A new scratch directory in $TMPDIR (on disk, not in RAM), named with this process's id;
    the scratch directories there of korch processes that are gone, removed first."""
    remove_dead(Path(tempfile.gettempdir()))
    return tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-")


def process_gone(pid: int) -> bool:
    """Whether no process has this id: signal 0 probes it (POSIX only: elsewhere it is not a mere
    probe, and nothing is known to be gone). A live process, or one of another user's that may
    not be signalled, is not gone."""
    if not hasattr(os, "getuid"):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (ValueError, OSError):
        return False
    return False


def remove_dead(folder: Path) -> list[Path]:
    """Remove the scratch directories in `folder` of processes that no longer exist (this user's
    only: another's may not be ours to remove, nor its process visible); the ones removed."""
    removed: list[Path] = []
    if not hasattr(os, "getuid"):
        return removed
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for path in entries:
        match = _NAME.fullmatch(path.name)
        if match is None or path.is_symlink() or not path.is_dir():
            continue
        try:
            ours = path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if ours and process_gone(int(match[1])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
