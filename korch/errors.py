"""The exceptions korch raises on purpose: user-facing errors (exit 2) and failed checks (exit 1)."""


class KorchError(Exception):
    """Bad input or an unsupported request; the CLI prints the message on one line and exits 2."""


class ShapeError(KorchError):
    """An input shape the model cannot take: a pin (--shape, shapes=) naming an unknown input or
    contradicting the model's rank or a fixed dimension, or symbolic dimensions left unpinned."""


class CheckFailed(Exception):
    """A numerical check did not pass; the CLI exits 1."""


class Unsupported(Exception):
    """Raised by a fission rule that cannot lower this particular node; the node stays opaque."""


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first non-blank line of an exception's message (at most `limit` characters): error
    texts from ONNX, ONNX Runtime and compilers run over many lines; korch reports one."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0][:limit] if lines else ""


def error_line(e: BaseException, limit: int = 300) -> str:
    """first_line, or the exception's type name when its message is empty."""
    return first_line(e, limit) or type(e).__name__


def cannot_create(path, error: OSError) -> str:
    """Why a directory at `path` (a pathlib.Path) could not be made: the file standing where a
    directory should be, else the system's reason."""
    blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    return f"{blocker} exists and is not a directory" if blocker else (error.strerror or str(error))
