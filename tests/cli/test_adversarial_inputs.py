"""Hostile inputs: .npz files built to exhaust memory or confuse the reader, --output targets that
would destroy a plan or its inputs, and odd flag values. Each is one `korch: error:` line and exit 2,
with every plan and input file byte-identical afterwards."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import stat
import struct
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from badinput import Case, _one, _vi, good_model, problem, run_main
from numpy.lib import format as npy
from onnx import TensorProto, numpy_helper

import korch
from korch.cli import commands as cli
from korch.ir import reference
from korch.ir.prims import TensorType
from korch.plan.plan import Plan

BOOL = TensorProto.BOOL
X = np.arange(8, dtype="float32").reshape(2, 4)  # what the good plan's input x holds
BIG = 64 << 20  # bytes of zeros in a bomb: numpy.load would hold them all
CODE = b"{'descr': __import__('os')}    \n"  # a header that is code, not a literal


# ------------------------------------------------------------------------------- the files
def _npy(array: np.ndarray, version=None) -> bytes:
    out = io.BytesIO()
    npy.write_array(out, array, version=version, allow_pickle=True)
    return out.getvalue()


def _header(shape, descr="<f4", pad=0) -> bytes:
    """An .npy header alone; `pad` spaces make it a format-2.0 header too long to read safely."""
    text = repr({"descr": descr, "fortran_order": False, "shape": shape})
    if pad:
        body = (text + " " * pad + "\n").encode()
        return b"\x93NUMPY\x02\x00" + struct.pack("<I", len(body)) + body
    out = io.BytesIO()
    npy.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def _zip(path: Path, members: dict[str, bytes], method=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _bomb(path: Path, name: str, head: bytes, extra: dict[str, bytes] = None) -> Path:
    """A deflated member: `head`, then BIG zeros (a few dozen KiB on disk)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in (extra or {}).items():
            z.writestr(n, data)
        with z.open(name, "w", force_zip64=True) as f:
            f.write(head)
            zeros = bytes(1 << 20)
            for _ in range(BIG >> 20):
                f.write(zeros)
    return path


def _patched(good: Path, path: Path, edit) -> Path:
    data = bytearray(good.read_bytes())
    edit(data)
    path.write_bytes(bytes(data))
    return path


def _flip_a_data_byte(data: bytearray) -> None:
    """One byte of the array's data (past the .npy header), so only the CRC can tell."""
    at = data.find(b"\x93NUMPY") + len(_npy(X)) - 16
    data[at] ^= 0xFF


def _set_in_both_headers(offset_local: int, offset_central: int, value: bytes):
    """An edit of a field of the local file header and of the central directory entry."""

    def edit(data: bytearray):
        central = data.rfind(b"PK\x01\x02")
        data[offset_local : offset_local + len(value)] = value
        data[central + offset_central : central + offset_central + len(value)] = value

    return edit


def hostile_inputs(root: Path) -> dict[str, Path]:
    """--inputs files for a plan taking x: float32[2, 4]."""
    root.mkdir(parents=True, exist_ok=True)
    good = root / "good.npz"
    np.savez(good, x=X)
    x = _npy(X)
    files = {
        "huge-declared-member": _bomb(root / "huge.npz", "x.npy", _header((BIG // 4,))),
        "huge-declared-no-data": _zip(root / "liar.npz", {"x.npy": _header((1 << 40,))}),
        "unused-huge-member": _bomb(root / "unused.npz", "junk.npy", _header((BIG // 4,)), {"x.npy": x}),
        "zip-bomb-after-the-data": _bomb(root / "trailing-bomb.npz", "x.npy", x),
        "unused-small-member": _zip(root / "extra.npz", {"x.npy": x, "y.npy": x}),
        "x-and-x.npy": _zip(root / "dup.npz", {"x.npy": x, "x": x}),
        "no-arrays": _zip(root / "empty-zip.npz", {}),
        "wrong-dtype-float64": _zip(root / "f64.npz", {"x.npy": _npy(X.astype("float64"))}),
        "wrong-dtype-int32": _zip(root / "i32.npz", {"x.npy": _npy(X.astype("int32"))}),
        "wrong-dtype-bool": _zip(root / "bool.npz", {"x.npy": _npy(X > 2)}),
        "wrong-shape": _zip(root / "shape.npz", {"x.npy": _npy(np.ones((3, 4), "float32"))}),
        "wrong-rank": _zip(root / "rank.npz", {"x.npy": _npy(X.reshape(-1))}),
        "scalar": _zip(root / "scalar.npz", {"x.npy": _npy(np.float32(1))}),
        "negative-dimension": _zip(root / "negative.npz", {"x.npy": _header((-2, 4))}),
        "object-array": _zip(root / "object.npz", {"x.npy": _npy(np.array([{"a": 1}], dtype=object))}),
        "structured-dtype": _zip(root / "struct.npz", {"x.npy": _npy(np.zeros((2, 4), [("a", "<f4")]))}),
        "npy-format-3": _zip(root / "v3.npz", {"x.npy": _npy(X, version=(3, 0))}),
        "member-not-npy": _zip(root / "text.npz", {"x.npy": b"hello, not an array"}),
        "member-is-a-zip": _zip(root / "nested.npz", {"x.npy": good.read_bytes()}),
        "header-code": _zip(root / "code.npz", {"x.npy": b"\x93NUMPY\x01\x00\x1f\x00" + CODE}),
        "header-too-large": _zip(root / "big-header.npz", {"x.npy": _header((2, 4), pad=20000)}),
        "member-data-short": _zip(root / "short.npz", {"x.npy": x[:-5]}),
        "member-data-long": _zip(root / "long.npz", {"x.npy": x + b"12345"}),
        "bad-crc": _patched(good, root / "crc.npz", _flip_a_data_byte),
        "encrypted-member": _patched(good, root / "encrypted.npz", _set_in_both_headers(6, 8, b"\x01\x00")),
        "unknown-compression": _patched(good, root / "method.npz", _set_in_both_headers(8, 10, b"\x63\x00")),
        "truncated-zip": root / "truncated.npz",
        "name-with-newline": _zip(root / "newline.npz", {"x\nevil.npy": x}),
        "thousands-of-members": _zip(root / "many.npz", {f"m{i}.npy": b"" for i in range(3000)}),
        "empty-file": root / "empty.npz",
        "random-bytes": root / "random.npz",
        "pk-then-garbage": root / "pk.npz",
        "single-npy": root / "single.npy",
        "directory": root / "a-directory.npz",
        "fifo": root / "fifo.npz",
        "dev-zero": Path("/dev/zero"),
        "dev-null": Path("/dev/null"),
        "symlink-loop": root / "loop.npz",
        "dangling-symlink": root / "dangling.npz",
        "missing": root / "missing.npz",
    }
    files["truncated-zip"].write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    files["empty-file"].write_bytes(b"")
    files["random-bytes"].write_bytes(np.random.default_rng(0).bytes(500))
    files["pk-then-garbage"].write_bytes(b"PK\x03\x04" + np.random.default_rng(1).bytes(200))
    np.save(files["single-npy"], X)
    files["directory"].mkdir()
    os.mkfifo(files["fifo"])  # (opening it to read would wait for a writer forever)
    os.symlink(files["symlink-loop"].name, files["symlink-loop"])
    os.symlink("nowhere.npz", files["dangling-symlink"])
    return files


def _int_model(elem, dtype) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones(2, dtype), "w")
    return _one("Add", ["x", "w"], inputs=[_vi("x", (2,), elem)], outputs=[_vi("y", (2,), elem)], inits=[w])


def _external(location: str) -> onnx.ModelProto:
    """The good model with its weight in an external file at `location`."""
    model = good_model()
    w = model.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    return model


def _shadowed() -> onnx.ModelProto:
    """The good model with its initializer w listed as a graph input too (as old exporters did)."""
    model = good_model()
    model.graph.input.append(_vi("w"))
    return model


# ------------------------------------------------------------------------------- fixture
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A good plan (optimized once), its good inputs, and every hostile file."""
    root = tmp_path_factory.mktemp("adversarial")
    models = {
        "good": good_model(),
        "int32": _int_model(TensorProto.INT32, "int32"),
        "int64": _int_model(TensorProto.INT64, "int64"),
        "bool": _one("Not", ["x"], inputs=[_vi("x", (2,), BOOL)], outputs=[_vi("y", (2,), BOOL)]),
        "ext-missing": _external("nowhere.bin"),
        "ext-escape": _external("../../etc/passwd"),
        "ext-absolute": _external("/etc/passwd"),
        "shadowed": _shadowed(),
    }
    for name, model in models.items():
        (root / f"{name}.onnx").write_bytes(model.SerializeToString())
    argv = ["optimize", str(root / "good.onnx"), "-o", str(root / "plan"), "--quiet"]
    argv += ["--backends", "onnxruntime", "--max-size", "2", "--cache", str(root / "cache.sqlite")]
    assert cli.main(argv) == 0
    shutil.copytree(root / "plan", root / "other-plan")
    np.savez(root / "in.npz", x=X)
    files = hostile_inputs(root / "hostile")
    return {"root": root, "plan": root / "plan", "inputs": root / "in.npz", "files": files}


def _snapshot(*places: Path) -> dict[str, bytes]:
    """Every regular file's bytes under `places` (a plan directory, an inputs file)."""
    out = {}
    for place in places:
        for path in [place] if place.is_file() else sorted(place.iterdir()):
            if path.is_file() and not path.is_symlink():
                out[str(path)] = path.read_bytes()
    return out


@contextlib.contextmanager
def _deadline(seconds: int):
    """A case that blocks (a FIFO opened to read waits for a writer forever) fails instead."""

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _refused(case: Case, capsys, *keep: Path):
    """Run the case: one `korch: error:` line, exit 2, and the files in `keep` unchanged."""
    before = _snapshot(*keep)
    with _deadline(60):
        code, out, err = run_main(case.argv, capsys)
    assert problem(case, code, err) is None, problem(case, code, err)
    assert "Traceback" not in err
    assert _snapshot(*keep) == before, f"{case.id} changed a file"
    return err


# ------------------------------------------------------------------------------- --inputs
INPUT_CASES = [
    ("huge-declared-member", "float32[16777216], the plan wants float32[2, 4]"),
    ("huge-declared-no-data", "the plan wants float32[2, 4]"),
    ("unused-huge-member", "unknown ['junk']"),
    ("zip-bomb-after-the-data", "more data than its header says"),
    ("unused-small-member", "unknown ['y']"),
    ("x-and-x.npy", "holds 'x' twice"),
    ("no-arrays", "missing ['x']"),
    ("wrong-dtype-float64", "float64[2, 4], the plan wants float32[2, 4]"),
    ("wrong-dtype-int32", "int32[2, 4]"),
    ("wrong-dtype-bool", "bool[2, 4]"),
    ("wrong-shape", "float32[3, 4]"),
    ("wrong-rank", "float32[8]"),
    ("scalar", "float32[]"),
    ("negative-dimension", "the plan wants"),
    ("object-array", "holds Python objects"),
    ("structured-dtype", "the plan wants float32[2, 4]"),
    ("npy-format-3", "format 3.0"),
    ("member-not-npy", "not an .npy array"),
    ("member-is-a-zip", "not an .npy array"),
    ("header-code", "not an .npy array"),
    ("header-too-large", "not an .npy array"),
    ("member-data-short", "ends before its 32 bytes"),
    ("member-data-long", "more data than its header says"),
    ("bad-crc", "damaged"),
    ("encrypted-member", "damaged"),
    ("unknown-compression", "damaged"),
    ("truncated-zip", "damaged"),
    ("name-with-newline", "unknown ['x\\nevil']"),
    ("thousands-of-members", "and 2995 more"),
    ("empty-file", "not an .npz"),
    ("random-bytes", "not an .npz"),
    ("pk-then-garbage", "damaged"),
    ("single-npy", "a single array"),
    ("directory", "is a directory"),
    ("fifo", "a FIFO"),
    ("dev-zero", "a character device"),
    ("dev-null", "a character device"),
    ("symlink-loop", "symbolic links"),
    ("dangling-symlink", "no such file"),
    ("missing", "no such file"),
]


@pytest.mark.e2e
@pytest.mark.parametrize("name, match", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_a_hostile_inputs_file_is_one_line(name, match, world, capsys):
    path = world["files"][name]
    case = Case("inputs", name, ("run", str(world["plan"]), "--inputs", str(path)), match)
    _refused(case, capsys, world["plan"], *([path] if path.is_file() and path.stat().st_size < BIG else []))


def test_the_error_names_what_the_plan_takes(world, capsys):
    argv = ("run", str(world["plan"]), "--inputs", str(world["files"]["unused-small-member"]))
    assert "it takes x: float32[2, 4]" in _refused(Case("inputs", "names", argv), capsys)


@pytest.mark.parametrize("name", ["huge-declared-member", "unused-huge-member"])
def test_reading_inputs_holds_no_more_than_the_plan_s_inputs(name, world, capsys):
    """numpy.load decompressed every member, used or not, before a name or shape was checked: a
    64 KiB file held 64 MiB (and a 2 MB one 2 GiB). Now nothing is read past a header that does
    not match the plan."""
    argv = ("run", str(world["plan"]), "--inputs", str(world["files"][name]))
    assert world["files"][name].stat().st_size < BIG // 256  # (it is a bomb)
    tracemalloc.start()
    try:
        code, _, err = run_main(argv, capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == 2 and err.startswith("korch: error: "), err
    assert peak < 8 << 20, f"reading {name} allocated {peak >> 20} MiB"


@pytest.mark.parametrize("layout", ["c-order", "fortran-order", "big-endian", "deflated", "x-without-suffix"])
def test_good_inputs_read_as_numpy_reads_them(layout, world, tmp_path, capsys):
    """The checked reader gives what numpy.load gives (the oracle), and the plan computes what ONNX
    Runtime computes from it."""
    layouts = {"fortran-order": np.asfortranarray(X), "big-endian": X.astype(">f4")}
    array = layouts.get(layout, X)
    path = tmp_path / "in.npz"
    if layout == "deflated":
        np.savez_compressed(path, x=array)
    elif layout == "x-without-suffix":
        _zip(path, {"x": _npy(array)})
    else:
        np.savez(path, x=array)
    out = tmp_path / "out.npz"
    code, _, err = run_main(["run", str(world["plan"]), "--inputs", str(path), "--output", str(out)], capsys)
    assert code == 0, err
    with np.load(path) as data:
        given = data[data.files[0]]
    session = ort.InferenceSession(str(world["root"] / "good.onnx"), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": np.ascontiguousarray(given, dtype="float32")})
    np.testing.assert_allclose(np.load(out)["y"], want, rtol=1e-6)


# ------------------------------------------------------------------------------- --output
def _output_targets(world) -> dict[str, tuple[str, str]]:
    """name -> (--output, what the error says); the places are made here."""
    root, plan, inputs = world["root"], world["plan"], world["inputs"]
    out = root / "targets"
    if not out.exists():
        out.mkdir()
        os.link(plan / "weights.npz", out / "weights-hardlink.npz")
        os.link(plan / "model.onnx", out / "model-hardlink.npz")
        os.symlink(plan / "weights.npz", out / "weights-symlink.npz")
        os.symlink(plan / "plan.json", out / "planjson-symlink.npz")
        os.symlink(plan, out / "plan-link")
        os.link(inputs, out / "inputs-hardlink.npz")
        os.symlink(inputs, out / "inputs-symlink.npz")
        (out / "folder.npz").mkdir()
        (out / "a-file").write_text("not a directory")
        os.symlink("loop.npz", out / "loop.npz")
        os.mkfifo(out / "fifo.npz")
    return {
        "inside-the-plan": (plan / "out.npz", "inside the plan directory"),
        "over-weights.npz": (plan / "weights.npz", "inside the plan directory"),
        "over-plan.json-suffix-added": (plan / "plan.json", "inside the plan directory"),
        "plan-through-a-symlinked-dir": (out / "plan-link" / "out.npz", "inside the plan directory"),
        "weights-through-a-symlink": (out / "weights-symlink.npz", "inside the plan directory"),
        "plan.json-through-a-symlink": (out / "planjson-symlink.npz", "inside the plan directory"),
        "weights-hard-link": (out / "weights-hardlink.npz", "the plan's weights.npz"),
        "model-hard-link": (out / "model-hardlink.npz", "the plan's model.onnx"),
        "inside-another-plan": (root / "other-plan" / "out.npz", "inside the plan directory"),
        "over-the-inputs": (inputs, "the --inputs file"),
        "inputs-hard-link": (out / "inputs-hardlink.npz", "the --inputs file"),
        "inputs-symlink": (out / "inputs-symlink.npz", "the --inputs file"),
        "the-plan-directory": (plan, "is a directory"),
        "a-directory-named-npz": (out / "folder.npz", "is a directory"),
        "under-a-file": (out / "a-file" / "o.npz", "no such directory"),
        "missing-directory": (out / "no" / "such" / "o.npz", "no such directory"),
        "symlink-loop": (out / "loop.npz", "symbolic links"),
        "a-fifo": (out / "fifo.npz", "not a regular file"),
        "proc": (Path("/proc/korch-out.npz"), "cannot write in /proc"),
    }


OUTPUT_NAMES = [
    "inside-the-plan",
    "over-weights.npz",
    "over-plan.json-suffix-added",
    "plan-through-a-symlinked-dir",
    "weights-through-a-symlink",
    "plan.json-through-a-symlink",
    "weights-hard-link",
    "model-hard-link",
    "inside-another-plan",
    "over-the-inputs",
    "inputs-hard-link",
    "inputs-symlink",
    "the-plan-directory",
    "a-directory-named-npz",
    "under-a-file",
    "missing-directory",
    "symlink-loop",
    "a-fifo",
    "proc",
]


@pytest.mark.parametrize("name", OUTPUT_NAMES)
def test_a_dangerous_output_is_refused_and_nothing_changes(name, world, capsys):
    target, match = _output_targets(world)[name]
    if name == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    argv = ("run", str(world["plan"]), "--inputs", str(world["inputs"]), "--output", str(target))
    keep = [world["plan"], world["root"] / "other-plan", world["inputs"], world["root"] / "targets"]
    _refused(Case("output", name, argv, match), capsys, *keep)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_refused_before_the_plan_runs(world, tmp_path, capsys):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        argv = ("run", str(world["plan"]), "--output", str(folder / "out.npz"))
        _refused(Case("output", "read-only", argv, "cannot write in"), capsys, world["plan"])
    finally:
        folder.chmod(stat.S_IRWXU)


def test_the_output_is_replaced_atomically(world, tmp_path, monkeypatch, capsys):
    """A write that fails half-way leaves the old file whole and no temporary behind."""
    out = tmp_path / "out.npz"
    np.savez(out, y=np.zeros(3))
    before = out.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(npy, "write_array", fail)
    code, _, err = run_main(["run", str(world["plan"]), "--output", str(out)], capsys)
    assert code == 2 and "No space left on device" in err and len(err.splitlines()) == 1, err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]


def test_a_symlinked_output_keeps_pointing_at_the_new_file(world, tmp_path, capsys):
    (tmp_path / "real.npz").write_bytes(b"old")
    os.symlink("real.npz", tmp_path / "link.npz")
    code, _, err = run_main(["run", str(world["plan"]), "--output", str(tmp_path / "link.npz")], capsys)
    assert code == 0, err
    assert (tmp_path / "link.npz").is_symlink()
    assert np.load(tmp_path / "real.npz")["y"].shape == (2, 4)


@pytest.mark.parametrize("name", ["file", "allow_pickle", "a/b", "ünï"])
def test_outputs_are_written_whatever_their_names(name, tmp_path, capsys):
    """numpy.savez(path, **outputs) took an output named `file` for its own argument."""
    plan = tmp_path / "plan"
    Plan([("x", TensorType((3,), "float32"))], [("x", name)], [], {}).save(plan)
    np.savez(tmp_path / "in.npz", x=np.array([1, 2, 3], "float32"))
    argv = ["run", str(plan), "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz")]
    code, _, err = run_main(argv, capsys)
    assert code == 0, err
    assert np.load(tmp_path / "out.npz")[name].tolist() == [1, 2, 3]


# ------------------------------------------------------------------------------- flags
def _flag_cases(world) -> dict[str, tuple[tuple[str, ...], str | None]]:
    root, plan, cache = world["root"], str(world["plan"]), str(world["root"] / "cache.sqlite")
    good, i32, i64, flag = (str(root / f"{n}.onnx") for n in ("good", "int32", "int64", "bool"))
    opt = ("optimize", good, "-o", str(root / "new-plan"), "--cache", cache)

    def value(model, text):
        return ("fission", model, "--value", f"x={text}")

    def fission_to(path):
        return ("fission", good, "-o", str(path))

    return {
        "run-seed-negative": (("run", plan, "--seed", "-1"), "at least 0"),
        "verify-seed-negative": (("verify", plan, "--seed", "-1"), "at least 0"),
        "fission-check-seed-negative": (("fission", good, "--check", "--seed", "-1"), "at least 0"),
        "value-int32-past-int64": (value(i32, "99999999999999999999"), "int32's range"),
        "value-int32-overflow": (value(i32, "3000000000"), "int32's range"),
        "value-int32-underflow": (value(i32, "-3000000000"), "int32's range"),
        "value-int64-past-int64": (value(i64, "99999999999999999999"), "int64's range"),
        "value-int64-below-int64": (value(i64, "-99999999999999999999"), "int64's range"),
        "value-int64-2**63": (value(i64, "9223372036854775808"), "int64's range"),
        "value-int-nan": (value(i32, "nan"), "nan is not a int32"),
        "value-int-inf": (value(i64, "inf"), "is not a int64"),
        "value-int-1e30": (value(i64, "1e30"), "is not a int64"),
        "value-int-fraction": (value(i32, "0.5"), "is not a int32"),
        "value-bool-nan": (value(flag, "nan"), "is not a bool"),
        "value-float-1e400": (value(good, "1e400"), "out of range"),
        "value-float32-overflow": (value(good, "-1e39"), "float32's range"),
        "value-float32-huge-int": (value(good, "1" + "0" * 50), "float32's range"),
        "value-huge-digits": (value(good, "9" * 5000), "out of range"),
        "external-data-missing": (("fission", str(root / "ext-missing.onnx")), "nowhere.bin"),
        "external-data-escapes": (("fission", str(root / "ext-escape.onnx")), "'../../etc/passwd'"),
        "external-data-absolute": (("fission", str(root / "ext-absolute.onnx")), "'/etc/passwd'"),
        "backends-reference": ((*opt, "--backends", "reference"), "oracle"),
        "backends-reference-among-others": ((*opt, "--backends", "onnxruntime,reference"), "oracle"),
        "run-inputs-the-plan-directory": (("run", plan, "--inputs", plan), "is a directory"),
        "fission-model-empty": (("fission", ""), "empty string"),
        "candidates-model-empty": (("candidates", ""), "empty string"),
        "run-plan-empty": (("run", ""), "empty string"),
        "verify-plan-empty": (("verify", ""), "empty string"),
        "explain-plan-empty": (("explain", ""), "empty string"),
        "bench-target-empty": (("bench", ""), "empty string"),
        "fission-dev-zero": (("fission", "/dev/zero"), "not a regular file"),
        "fission-fifo": (("fission", str(world["files"]["fifo"])), "not a regular file"),
        "fission-output-a-directory": (fission_to(root), "is a directory"),
        "fission-output-under-a-file": (fission_to(world["inputs"] / "g.json"), "not a directory"),
        "fission-output-proc": (fission_to("/proc/korch.json"), "cannot write"),
        "fission-output-the-model": (fission_to(good), "would overwrite the model"),
        "fission-output-npz": (fission_to(root / "g.npz"), "JSON"),
        "fission-output-in-a-plan": (fission_to(world["plan"] / "graph.json"), "inside the plan"),
        "explain-html-in-the-plan": (("explain", plan, "--html", plan + "/plan.json"), "inside the plan"),
        "explain-html-a-directory": (("explain", plan, "--html", str(root)), "cannot write the report"),
        "bench-device-empty": (("bench", good, "--device", "", "--cache", cache), "--device"),
        "value-unicode-unknown": (("fission", good, "--value", "ünï=1"), "not an input"),
        "value-of-an-initializer": (
            ("fission", str(root / "shadowed.onnx"), "--value", "w=1"),
            "not an input",
        ),
    }


FLAG_NAMES = [
    "run-seed-negative",
    "verify-seed-negative",
    "fission-check-seed-negative",
    "value-int32-past-int64",
    "value-int32-overflow",
    "value-int32-underflow",
    "value-int64-past-int64",
    "value-int64-below-int64",
    "value-int64-2**63",
    "value-int-nan",
    "value-int-inf",
    "value-int-1e30",
    "value-int-fraction",
    "value-bool-nan",
    "value-float-1e400",
    "value-float32-overflow",
    "value-float32-huge-int",
    "value-huge-digits",
    "external-data-missing",
    "external-data-escapes",
    "external-data-absolute",
    "backends-reference",
    "backends-reference-among-others",
    "run-inputs-the-plan-directory",
    "fission-model-empty",
    "candidates-model-empty",
    "run-plan-empty",
    "verify-plan-empty",
    "explain-plan-empty",
    "bench-target-empty",
    "fission-dev-zero",
    "fission-fifo",
    "fission-output-a-directory",
    "fission-output-under-a-file",
    "fission-output-proc",
    "fission-output-the-model",
    "fission-output-npz",
    "fission-output-in-a-plan",
    "explain-html-in-the-plan",
    "explain-html-a-directory",
    "bench-device-empty",
    "value-unicode-unknown",
    "value-of-an-initializer",
]


@pytest.mark.parametrize("name", FLAG_NAMES)
def test_an_odd_flag_is_one_line_naming_the_problem(name, world, capsys):
    argv, match = _flag_cases(world)[name]
    if "proc" in name and not Path("/proc/self").is_dir():
        pytest.skip("no /proc here")
    keep = [world["plan"], world["root"] / "good.onnx", world["inputs"]]
    _refused(Case("flags", name, argv, match), capsys, *keep)
    assert not (world["root"] / "new-plan").exists()


def test_the_case_lists_cover_every_builder(world):
    assert set(INPUT_CASES[i][0] for i in range(len(INPUT_CASES))) == set(world["files"])
    assert set(OUTPUT_NAMES) == set(_output_targets(world))
    assert set(FLAG_NAMES) == set(_flag_cases(world))
    assert len(INPUT_CASES) + len(OUTPUT_NAMES) + len(FLAG_NAMES) >= 65


# ------------------------------------------------------------------------------- initializers
def test_an_input_with_an_initializer_is_frozen_with_one_warning(world, capsys):
    """ONNX Runtime takes an initializer listed as an input as that input's default: fed, it
    overrides it; not fed, its value is used. korch compiles the default in and says so on one
    line; its graph computes what ONNX Runtime computes when the input is not fed."""
    model = world["root"] / "shadowed.onnx"
    code, _, err = run_main(["fission", str(model), "--quiet"], capsys)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "'w'" in warnings[0] and "constant" in warnings[0], err
    result = korch.fission(str(model))
    assert [result.onnx_names[v] for v in result.graph.inputs] == ["x"]  # (w is no input of the plan)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {"x": X})
    (got,) = reference.run(result.graph, {result.graph.inputs[0]: X}).values()
    np.testing.assert_allclose(got, want, rtol=1e-6)
