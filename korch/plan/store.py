"""A plan directory on disk: read whole from one save, and replaced by a new one in one step."""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import json
import os
import stat
from pathlib import Path

from korch.errors import KorchError
from korch.plan.check import MANIFEST, MANIFEST_FORMAT


class PlanReplaced(KorchError):
    """The directory was replaced by another save while it was read: reading it again gives the
    new plan, whole."""


class PlanFiles:
    """A plan directory opened once: every file is read through this one handle, so all of them
    come from one save even while another process replaces the directory (a save renames a whole
    new directory into its place). Each file is read once; what is checked is what is parsed."""

    def __init__(self, directory: Path):
        self.directory = directory
        try:
            self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise KorchError(f"{directory}: no such plan directory") from None
        except NotADirectoryError:
            raise KorchError(f"{directory}: not a plan directory (a file)") from None
        except OSError as e:
            raise KorchError(f"{directory}: unreadable plan ({e.strerror or e})") from None

    def __enter__(self) -> PlanFiles:
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)

    def replaced(self) -> bool:
        """Whether the path names another directory now than the one opened."""
        try:
            now = os.stat(self.directory)
        except OSError:
            return True
        opened = os.fstat(self.fd)
        return (now.st_dev, now.st_ino) != (opened.st_dev, opened.st_ino)

    def read(self, name: str) -> bytes | None:
        """The bytes of the regular file `name`, or None where there is none."""
        if name in ("", ".", "..") or "/" in name or "\0" in name:
            raise KorchError(f"{self.directory}: damaged plan ({MANIFEST} lists {name!r}, not a file name)")
        # (no symbolic links: a plan holds its own files; non-blocking: a FIFO must not hang us)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=self.fd)
        except FileNotFoundError:
            self._raise_if_replaced()
            return None
        except OSError as e:
            self._raise_if_replaced()
            why = "a symbolic link" if e.errno == errno.ELOOP else f"unreadable: {e.strerror or e}"
            raise KorchError(f"{self.directory}: damaged plan ({name} is {why})") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # (before fdopen, which refuses a directory)
            os.close(fd)
            raise KorchError(f"{self.directory}: damaged plan ({name} is not a regular file)")
        with os.fdopen(fd, "rb") as f:
            return f.read()

    def sealed(self, have: dict[str, bytes]) -> tuple[dict[str, bytes], dict[str, str]]:
        """(file name -> bytes, file name -> sha256) of every file the manifest lists, each checked
        against it (`have`: files read already). A plan whose files are missing, truncated or
        changed since it was written is refused."""
        manifest = self._manifest()
        data, digests = {}, {}
        for name, want in manifest.items():
            try:
                size, digest = want["bytes"], want["sha256"]
            except (KeyError, TypeError):
                raise KorchError(f"{self.directory}: damaged plan ({MANIFEST} entry for {name})") from None
            blob = have[name] if name in have else self.read(name)
            problem = _mismatch(name, blob, size, digest)
            if problem:
                self._raise_if_replaced()
                raise KorchError(f"{self.directory}: damaged plan ({problem})")
            data[name], digests[name] = blob, digest
        for name in ("plan.json", "weights.npz"):
            if name not in data:
                raise KorchError(f"{self.directory}: damaged plan ({MANIFEST} does not list {name})")
        return data, digests

    def _manifest(self) -> dict:
        text = self.read(MANIFEST)
        if text is None:
            raise KorchError(f"{self.directory}: incomplete plan (no {MANIFEST}); write it again")
        try:
            doc = json.loads(text)
            files = doc["files"]
            if doc.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
                raise ValueError("unknown manifest format")
        except (ValueError, KeyError, TypeError) as e:
            raise KorchError(f"{self.directory}: damaged plan ({MANIFEST} unreadable: {e})") from None
        return files

    def _raise_if_replaced(self) -> None:
        if self.replaced():
            raise PlanReplaced(f"{self.directory}: replaced while it was read")


def _mismatch(name: str, blob: bytes | None, size, digest) -> str | None:
    """Why `blob` is not the file the manifest describes, or None."""
    if blob is None:
        return f"{name} is missing"
    if len(blob) != size:
        return f"{name} has {len(blob)} bytes, expected {size}"
    if hashlib.sha256(blob).hexdigest() != digest:
        return f"{name} does not match its checksum"
    return None


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2  # from <fcntl.h> and <linux/fs.h>


def exchange(a: Path, b: Path) -> bool:
    """Swap two directories atomically (Linux's renameat2 with RENAME_EXCHANGE; Python's os has no
    wrapper); False where the system or its file system cannot."""
    renameat2 = _renameat2()
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@functools.cache
def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):  # not glibc 2.28 or later (macOS, musl before 1.2.6)
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return fn
