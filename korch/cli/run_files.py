"""The files `korch run` reads and writes: an --inputs .npz checked against the plan before any of
its data is read, and an --output .npz written atomically, never into a plan (no command's output
goes into one: `refuse_inside_plan`) or over its inputs."""

from __future__ import annotations

import contextlib
import os
import stat
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.lib import format as npy

from korch.errors import KorchError, first_line
from korch.ir.prims import BFLOAT16, TensorType, from_npy
from korch.ir.serialize import atomic_write

NPZ_HELP = "--inputs wants an .npz of named arrays (numpy.savez)"
CHUNK = 1 << 20  # bytes read at a time: a member is never held twice

# what zipfile, zlib and numpy raise on a damaged archive or member (an unsupported compression
# method is NotImplementedError, an encrypted member RuntimeError, a bad header ValueError)
_DAMAGED = (
    zipfile.BadZipFile,
    zlib.error,
    EOFError,
    NotImplementedError,
    RuntimeError,
    ValueError,
    struct.error,
)


# ---------------------------------------------------------------------------------- --inputs
def read_inputs(path, wants: Mapping[str, TensorType]) -> dict[str, np.ndarray]:
    """The arrays of the .npz at `path`, one per input the plan `wants`. The names, and each
    member's .npy header (shape and dtype), are checked against the plan before any array data is
    read, so no file can make korch hold more than the plan's own inputs: a zip bomb, an unused
    member of many gigabytes or a header promising a huge array is refused unread."""
    with _open_regular(path) as f:
        head = f.read(6)
        if head.startswith(b"\x93NUMPY"):
            raise KorchError(f"{path}: a single array (.npy); {NPZ_HELP}")
        if not head.startswith(b"PK"):
            raise KorchError(f"{path}: not an .npz of arrays; {NPZ_HELP}")
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as archive:
                members = _members(path, archive, wants)
                return {n: _read_member(path, archive, info, wants[n]) for n, info in members.items()}
        except KorchError:
            raise
        except (*_DAMAGED, OSError) as e:
            raise KorchError(f"{path}: a damaged .npz ({type(e).__name__}: {first_line(e)})") from None


def _open_regular(path):
    """`path` opened for reading if it is a regular file. O_NONBLOCK: opening a FIFO with no
    writer would otherwise wait forever, before fstat could say what it is."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise KorchError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise KorchError(f"{path}: is a directory; {NPZ_HELP}") from None
    except OSError as e:  # permission, a symlink loop, a name too long
        raise KorchError(f"{path}: cannot read inputs ({e.strerror or e})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else f"not a regular file ({_kind(mode)})"
        raise KorchError(f"{path}: is {what}; {NPZ_HELP}")
    return os.fdopen(fd, "rb")


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((word for test, word in kinds if test(mode)), "not a file")


def _members(path, archive: zipfile.ZipFile, wants: Mapping[str, TensorType]) -> dict:
    """The archive's members by the name numpy.load gives them (`x.npy` is `x`): every input the
    plan takes, once, and nothing else."""
    found: dict[str, zipfile.ZipInfo] = {}
    for info in archive.infolist():
        name = info.filename.removesuffix(".npy")
        if name in found:
            raise KorchError(
                f"{path}: holds {name!r} twice ({found[name].filename!r} and {info.filename!r}); "
                "which one is meant?"
            )
        found[name] = info
    missing = [n for n in wants if n not in found]
    unknown = [n for n in found if n not in wants]
    if missing or unknown:
        lists = (("missing", missing), ("unknown", unknown))
        why = ", ".join(f"{word} {_listing(names)}" for word, names in lists if names)
        takes = ", ".join(f"{n}: {_show(t.dtype, t.shape)}" for n, t in wants.items())
        raise KorchError(f"{path}: arrays do not match the plan's inputs ({why}); it takes {takes}")
    return found


def _listing(names: list[str], most: int = 5) -> str:
    """Names as a list literal (a newline in a name stays escaped: the error is one line), the
    first few of many."""
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return f"{names[:most]}{more}"


def _read_member(path, archive: zipfile.ZipFile, info: zipfile.ZipInfo, want: TensorType) -> np.ndarray:
    """One member: its header read and checked, then exactly the bytes the plan's input holds."""
    with archive.open(info) as fp:
        shape, fortran, dtype = _header(path, info, fp)
        if dtype.hasobject:
            raise KorchError(f"{path}: {info.filename!r} holds Python objects, not plain arrays; {NPZ_HELP}")
        if shape != want.shape or not _same_dtype(dtype, want.dtype):
            wanted = _show(want.dtype, want.shape)
            raise KorchError(f"{path}: {info.filename!r} is {_show(dtype, shape)}, the plan wants {wanted}")
        data = np.empty(want.nbytes, np.uint8)
        view, done = memoryview(data), 0
        while done < want.nbytes:
            chunk = fp.read(min(CHUNK, want.nbytes - done))
            if not chunk:
                raise KorchError(f"{path}: {info.filename!r} ends before its {want.nbytes} bytes of data")
            view[done : done + len(chunk)] = chunk
            done += len(chunk)
        if fp.read(1):  # (reading to the end also checks the member's CRC)
            raise KorchError(f"{path}: {info.filename!r} holds more data than its header says")
    return from_npy(data.view(dtype).reshape(shape, order="F" if fortran else "C"))


def _header(path, info: zipfile.ZipInfo, fp) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npy.read_magic(fp)
        if version == (1, 0):
            return npy.read_array_header_1_0(fp)
        if version == (2, 0):
            return npy.read_array_header_2_0(fp)
    except ValueError as e:
        raise KorchError(f"{path}: {info.filename!r} is not an .npy array ({first_line(e)})") from None
    raise KorchError(f"{path}: {info.filename!r} is .npy format {version[0]}.{version[1]}; {NPZ_HELP}")


def _same_dtype(found: np.dtype, want: str) -> bool:
    """A dtype in either byte order (the runtime converts it); numpy writes bfloat16 as 2-byte
    records (korch.ir.prims.from_npy)."""
    if want == "bfloat16":
        return found == BFLOAT16 or (found.kind == "V" and found.itemsize == 2 and found.names is None)
    return found.names is None and found.newbyteorder("=") == np.dtype(want)


def _show(dtype, shape) -> str:
    return f"{dtype}{list(shape)}"


# ---------------------------------------------------------------------------------- --output
def output_target(output: str, plan_dir, inputs=None) -> Path:
    """Where --output writes (an .npz: the suffix is added as numpy.savez would), refused when it
    would land in a plan directory, over one of the plan's files or over the --inputs file
    (symlinks and hard links followed: the same inode is the same file), or on anything that is
    not a regular file: the write replaces what is there."""
    path = Path(output)
    if path.is_dir():
        raise KorchError(f"--output {output}: is a directory; name the .npz file to write")
    path = path if path.name.endswith(".npz") else path.with_name(path.name + ".npz")
    real = Path(os.path.realpath(path))
    try:
        existing = os.stat(real) if os.path.lexists(real) else None
    except OSError as e:  # a symlink loop
        raise KorchError(f"--output {path}: cannot write there ({e.strerror or e})") from None
    if not real.parent.is_dir():
        raise KorchError(f"--output {path}: no such directory {real.parent}")
    refuse_inside_plan(path, "--output", plan_dir)
    if existing is not None:
        if not stat.S_ISREG(existing.st_mode):
            raise KorchError(f"--output {path}: exists and is not a regular file; not replacing it")
        _check_not_precious(path, existing, plan_dir, inputs)
    _probe(real.parent, path)
    return path


def refuse_inside_plan(path: Path, flag: str, plan_dir=None) -> None:
    """No command writes into a plan directory (`plan_dir`, or any korch plan): a file put there
    could replace one of the plan's own, and a plan is only ever replaced whole."""
    from korch.plan.plan import is_korch_plan

    folder = Path(os.path.realpath(path)).parent
    if is_korch_plan(folder) or (plan_dir is not None and _same_dir(folder, plan_dir)):
        raise KorchError(f"{flag} {path}: inside the plan directory {folder}; korch writes nothing there")


def _same_dir(a: Path, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _check_not_precious(path: Path, existing: os.stat_result, plan_dir, inputs) -> None:
    """Refuse a target that is the --inputs file or one of the plan's files under another name."""
    precious = [(Path(inputs), "the --inputs file")] if inputs else []
    with contextlib.suppress(OSError):  # (no plan there: Plan.load says so next)
        precious += [(p, f"the plan's {p.name}") for p in Path(plan_dir).iterdir()]
    for other, what in precious:
        try:
            there = os.stat(other)
        except OSError:
            continue
        if (there.st_dev, there.st_ino) == (existing.st_dev, existing.st_ino):
            raise KorchError(f"--output {path}: is {what} ({other}); not overwriting it")


def write_outputs(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Write the arrays as an .npz that numpy.load reads, atomically (a symlink keeps pointing at
    the new file). Not numpy.savez: its keyword arguments would take an output named `file`."""
    target = Path(os.path.realpath(path))
    try:
        atomic_write(target, lambda f: _write_npz(f, arrays))
    except OSError as e:
        raise KorchError(f"{path}: cannot write outputs ({e.strerror or e})") from None


def _write_npz(f, arrays: Mapping[str, np.ndarray]) -> None:
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                npy.write_array(member, np.asanyarray(array), allow_pickle=False)


def _probe(folder: Path, path: Path) -> None:
    """Create and remove a file in `folder`: whether the outputs can be written there is known
    before the plan runs."""
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".korch-probe-")
    except OSError as e:
        raise KorchError(f"--output {path}: cannot write in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(tmp)
