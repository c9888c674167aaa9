"""The profiler's scratch directory: the graph's activations spilled for the workers to read (a
large model's are a gigabyte) and the source model's bytes. It goes when the profiler closes; one
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


def remove_dead(folder: Path) -> list[Path]:
    """Remove the scratch directories in `folder` of processes that no longer exist (this user's
    only: another's may not be ours to remove, nor its process visible); the ones removed."""
    removed: list[Path] = []
    if not hasattr(os, "getuid"):  # (POSIX only: elsewhere signal 0 is not a mere probe)
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
            if path.stat().st_uid != os.getuid():
                continue
            os.kill(int(match[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except (ValueError, OSError):
            continue  # alive, or not to be told
    return removed
