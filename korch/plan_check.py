"""Plan integrity: the manifest of file checksums written last, and the versions a plan was built with."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from korch.errors import KorchError

MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = "korch.manifest/1"
VERSIONED = ("korch", "torch", "onnxruntime")

log = logging.getLogger("korch")


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_manifest(directory: Path, known: dict[str, str] | None = None) -> None:
    """Record every file's size and sha256 (`known`: digests of files the caller just wrote from
    bytes it hashed); written after all of them, so its presence says the directory was complete
    when it was sealed."""
    known = known or {}
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != MANIFEST)
    doc = {
        "format": MANIFEST_FORMAT,
        "files": {
            p.name: {"bytes": p.stat().st_size, "sha256": known.get(p.name) or _sha256(p)} for p in files
        },
    }
    (directory / MANIFEST).write_text(json.dumps(doc, indent=1))


def check_manifest(directory: Path) -> dict[str, str]:
    """Refuse a plan directory whose files are missing, truncated or changed since it was written;
    file name -> sha256 of every file it holds."""
    try:
        doc = json.loads((directory / MANIFEST).read_text())
        files = doc["files"]
        if doc.get("format") != MANIFEST_FORMAT or not isinstance(files, dict):
            raise ValueError("unknown manifest format")
    except FileNotFoundError:
        raise KorchError(f"{directory}: incomplete plan (no {MANIFEST}); write it again") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise KorchError(f"{directory}: damaged plan ({MANIFEST} unreadable: {e})") from None
    for name, want in files.items():
        path = directory / name
        if not path.is_file():
            raise KorchError(f"{directory}: damaged plan ({name} is missing)")
        try:
            size, digest = want["bytes"], want["sha256"]
        except (KeyError, TypeError):
            raise KorchError(f"{directory}: damaged plan ({MANIFEST} entry for {name})") from None
        if path.stat().st_size != size:
            raise KorchError(
                f"{directory}: damaged plan ({name} has {path.stat().st_size} bytes, expected {size})"
            )
        if _sha256(path) != digest:
            raise KorchError(f"{directory}: damaged plan ({name} does not match its checksum)")
    return {name: want["sha256"] for name, want in files.items()}


def current_versions(backends: set[str]) -> dict[str, str]:
    import onnxruntime
    import torch

    import korch
    from korch.backends import all_backends

    known = all_backends()
    out = {"korch": korch.__version__, "torch": torch.__version__, "onnxruntime": onnxruntime.__version__}
    out.update({f"backend:{b}": known[b].version() for b in sorted(backends) if b in known})
    return out


def _model(device_name: str) -> str:
    """The device without the thread count (cpu:MODEL:Nthreads): threads change speed, not results."""
    head, _, tail = device_name.rpartition(":")
    return head if head and tail.endswith("threads") else device_name


def _current_device(device: str) -> str | None:
    import torch

    from korch.backends import device_name

    if device.startswith("cuda") and not torch.cuda.is_available():
        return None  # the runtime refuses the plan itself, saying so
    return device_name(device)


def check_versions(
    directory: Path, meta: dict, device: str, backends: set[str], allow_mismatch: bool
) -> None:
    """A plan built with other versions of korch, torch, onnxruntime or its backends may hold stale
    kernels (or kernels chosen for another device): refuse it, naming what differs, unless the
    caller allows it explicitly."""
    recorded = meta.get("versions") if isinstance(meta, dict) else None
    if not isinstance(recorded, dict):
        return  # a plan assembled by hand, not by korch.optimize: nothing to compare
    now = current_versions(backends)
    keys = [k for k in (*VERSIONED, *(f"backend:{b}" for b in sorted(backends))) if k in recorded]
    differ = [f"{k} {recorded[k]} (now {now.get(k, 'missing')})" for k in keys if recorded[k] != now.get(k)]
    device, built = _current_device(device), meta.get("device_name")
    if device is not None and isinstance(built, str) and _model(built) != _model(device):
        differ.append(f"device {_model(built)!r} (now {_model(device)!r})")
    if not differ:
        return
    message = f"{directory}: built with other versions: {', '.join(differ)}"
    if not allow_mismatch:
        raise KorchError(f"{message}; optimize again, or pass --allow-version-mismatch")
    log.warning("warning: %s; loading it anyway", message)
