"""``--feed FILE.npz`` is untrusted data: checked from its headers before anything is read.

``ssaexec.data.feed_file`` reads each member's ``.npy`` header (without decompressing the data)
and refuses, with a ``FeedError`` naming the file and the member, anything that is not a
data var's array of a dtype ssaexec has and a shape within ``max_tensor_elements``, or
whose size in the zip directory differs from what its header says; the CLI exits 2 with
one line, never "internal error". A compression bomb is refused with a few kilobytes
read (tracemalloc counts the bytes). Big-endian arrays feed the same values as native
ones (the losses are equal).
"""

import io
import os
import re
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

import ssaexec as se
from ssaexec.core.errors import FeedError
from ssaexec.data.feed_file import read_feed_file
from ssaexec.core.limits import limits
from tests.cli.test_cli import PLACES, assert_clean_error, cli, example  # noqa: F401 - cli: a fixture

UCI = example("uci_housing.json")  # data vars x [-1, 13] float32, y [-1, 1] float32


def _npy(array):
    out = io.BytesIO()
    np.lib.format.write_array(out, array, allow_pickle=False)
    return out.getvalue()


def _header(shape, descr="<f4"):
    """A .npy format 1.0 header alone (magic + length + dict), padded like numpy's."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False,
                                              "shape": tuple(shape)})
    return out.getvalue()


def _npz(path, members, compression=zipfile.ZIP_DEFLATED):
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", compression) as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate names we mean
        for name, data in members:
            zf.writestr(name, data)
    return path


def _xy(n=16, x_dtype="<f4", seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 13)).astype(x_dtype),
            rng.standard_normal((n, 1)).astype("<f4"))


@pytest.fixture(scope="module")
def program():
    return se.load_program(UCI)


def test_a_good_npz_reads_as_np_load_does(tmp_path, program):
    x, y = _xy()
    path = tmp_path / "f.npz"
    np.savez_compressed(path, x=np.asfortranarray(x), y=y)
    got = read_feed_file(path, program)
    assert sorted(got) == ["x", "y"]
    with np.load(path) as ref:
        for name in ("x", "y"):
            assert got[name].dtype == np.float32
            np.testing.assert_array_equal(got[name], ref[name])


def test_big_endian_arrays_are_swapped_to_the_same_values(tmp_path, program):
    x, y = _xy()
    path = _npz(tmp_path / "be.npz", [("x.npy", _npy(x.astype(">f4"))),
                                      ("y.npy", _npy(y.astype(">f4")))])
    got = read_feed_file(path, program)
    assert got["x"].dtype.isnative and got["x"].dtype == np.float32
    np.testing.assert_array_equal(got["x"], x)
    np.testing.assert_array_equal(got["y"], y)


def test_a_compression_bomb_is_refused_before_its_data_is_decompressed(tmp_path, program):
    rows = 1 << 20  # 13 Mi float32 elements: 52 MiB of zeros, about 50 KiB deflated
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x.npy", "w", force_zip64=True) as f:
            f.write(_header((rows, 13)))
            zeros = bytes(1 << 20)
            for _ in range(rows * 13 * 4 // len(zeros)):
                f.write(zeros)
    assert path.stat().st_size < 1 << 20
    tracemalloc.start()
    try:
        with limits(max_tensor_elements=1 << 20), \
                pytest.raises(FeedError, match=r"member 'x.npy': array 'x': shape \[1048576, 13\]"
                                               r" has 13631488 elements, more than"):
            read_feed_file(path, program)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 << 20, peak  # the 52 MiB never existed: the header alone was read


@pytest.mark.parametrize("array, what", [
    (np.array(["a", "b"]), r"dtype '<U1' is a string type"),
    (np.array([b"a", b"b"]), r"dtype '\|S1' is a byte string type"),
    (np.zeros(2, "M8[ns]"), r"dtype '<M8\[ns\]' is a datetime type"),
    (np.zeros(2, "m8[s]"), r"dtype '<m8\[s\]' is a timedelta type"),
    (np.zeros(2, "V8"), r"dtype '\|V8' is a void \(raw or structured\) type"),
    (np.zeros(2, [("a", "<f4"), ("b", "<i4")]), r"is a void \(raw or structured\) type"),
    (np.zeros(2, "c8"), r"dtype '<c8' is a complex type"),
    (np.zeros((2, 13), "<f8"), r"feed 'x' has dtype float64 but the program declares float32"),
    (np.zeros((2, 13), "<u4"), r"feed 'x' has dtype uint32 but the program declares float32"),
    (np.zeros((2, 12), "<f4"), r"shape \[2, 12\] but data var 'x' is declared \[-1, 13\]"),
    (np.zeros(26, "<f4"), r"shape \[26\] but data var 'x' is declared \[-1, 13\]"),
])
def test_unsupported_dtypes_and_shapes_are_refused_naming_file_and_member(tmp_path, program,
                                                                          array, what):
    path = _npz(tmp_path / "bad.npz", [("x.npy", _npy(array))])
    where = re.escape(str(path)) + r": member 'x.npy': "
    with pytest.raises(FeedError, match=f"{where}.*{what}"):
        read_feed_file(path, program)


def test_object_arrays_are_refused_from_their_header(tmp_path, program):
    # np.save of an object array needs pickle; its header alone says "|O"
    path = _npz(tmp_path / "obj.npz", [("x.npy", _header((2,), "|O") + b"\x80\x04junk")])
    with pytest.raises(FeedError, match=r"member 'x.npy': dtype '\|O' is an object type"):
        read_feed_file(path, program)


def test_headers_that_lie_about_the_size_are_refused(tmp_path, program):
    x, _ = _xy(4)
    header = _header((9, 13))  # says 9 rows, holds 4
    cases = {
        "short": [("x.npy", header + x.tobytes())],
        "long": [("x.npy", _header((2, 13)) + x.tobytes())],
        "truncated": [("x.npy", _npy(x)[:-3])],
        "header only": [("x.npy", _header((2, 13))[:20])],
        "no magic": [("x.npy", b"not an npy at all")],
        "negative dim": [("x.npy", _header((2, 13)).replace(b"(2, 13)", b"(-2, 13)"))],
        "huge dims": [("x.npy", _header((1 << 40, 13)))],
    }
    said = {}
    for label, members in cases.items():
        path = _npz(tmp_path / "lie.npz", members)
        with pytest.raises(FeedError) as e:
            read_feed_file(path, program)
        said[label] = str(e.value)
        assert said[label].startswith(f"{path}: member 'x.npy': "), said[label]
    assert "holds 208 bytes of data, but its header says float32[9, 13], 468" in said["short"]
    assert "header says float32[2, 13], 104 bytes" in said["long"]
    assert "truncated, or a header that lies" in said["truncated"]
    assert "cannot read its .npy array header" in said["header only"]
    assert "cannot read its .npy array header" in said["no magic"]
    assert "negative dimension" in said["negative dim"]
    assert "more than one tensor may hold" in said["huge dims"]


def test_a_corrupt_member_fails_its_crc_as_a_feed_error(tmp_path, program):
    x, _ = _xy(1024)  # 53 KiB: the header's read (a 4 KiB chunk) does not reach the end
    path = _npz(tmp_path / "crc.npz", [("x.npy", _npy(x))], zipfile.ZIP_STORED)
    data = bytearray(path.read_bytes())
    at = data.index(x.tobytes()[:16]) + 40000  # a byte of the data, far past the header
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(FeedError, match=r"member 'x.npy': the data cannot be read \(.*CRC"):
        read_feed_file(path, program)


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                                         zipfile.ZIP_LZMA])
def test_damaged_compressed_members_are_feed_errors(tmp_path, program, compression):
    x, _ = _xy(1024)
    good = _npz(tmp_path / "good.npz", [("x.npy", _npy(x))], compression).read_bytes()
    start = good.index(b"x.npy") + 5  # the member's compressed stream follows its name
    for at in (start + 2, start + 150, len(good) // 2):
        damaged = bytearray(good)
        for k in range(at, at + 32):
            damaged[k] ^= 0x5A
        path = tmp_path / f"damaged-{at}.npz"
        path.write_bytes(bytes(damaged))
        with pytest.raises(FeedError, match=re.escape(f"{path}: member 'x.npy': ")):
            read_feed_file(path, program)


def test_files_that_are_not_npz_archives_are_refused(tmp_path, program):
    x, y = _xy()
    good = _npz(tmp_path / "good.npz", [("x.npy", _npy(x)), ("y.npy", _npy(y))])
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "text.npz").write_text("x,y\n1,2\n")
    (tmp_path / "cut.npz").write_bytes(good.read_bytes()[:200])
    (tmp_path / "folder.npz").mkdir()
    os.mkfifo(tmp_path / "fifo.npz")
    _npz(tmp_path / "dup.npz", [("x.npy", _npy(x)), ("x.npy", _npy(x))])
    _npz(tmp_path / "txt.npz", [("notes.txt", b"hello")])
    _npz(tmp_path / "dir.npz", [("sub/x.npy", _npy(x))])
    _npz(tmp_path / "bare.npz", [(".npy", _npy(x))])
    _npz(tmp_path / "other.npz", [("z.npy", _npy(x))])
    _npz(tmp_path / "none.npz", [])
    expect = {
        "empty": "the file is empty, not an .npz feed file",
        "text": "not an .npz feed file (not a zip archive",
        "cut": "not an .npz feed file (not a zip archive",
        "folder": "is a directory, not an .npz feed file",
        "fifo": "is a FIFO (named pipe), not an .npz feed file",
        "dup": "member 'x.npy' appears more than once",
        "txt": "member 'notes.txt' is not an array",
        "dir": "member 'sub/x.npy' is not an array",
        "bare": "member '.npy' is not an array",
        "other": "member 'z.npy': the program has no data var 'z'; its data vars are x, y",
        "none": "the .npz file holds no arrays",
        "missing": "no such feed file",
    }
    for name, message in expect.items():
        path = tmp_path / f"{name}.npz"
        with pytest.raises(FeedError) as e:
            read_feed_file(path, program)
        assert str(e.value) == f"{path}: {message}" or str(e.value).startswith(
            f"{path}: {message}"), (name, str(e.value))


def _losses(out):
    return [float(v) for v in re.findall(r"step +\d+/\d+ +loss ([0-9.]+)", out)]


def test_the_cli_refuses_bad_feed_files_with_exit_2(cli, tmp_path):
    x, y = _xy()
    bad = {
        "bigdecl.npz": ([("x.npy", _header((1 << 31, 13)))], "more than one tensor may hold"),
        "strings.npz": ([("x.npy", _npy(np.array(["a"] * 16)))], "is a string type"),
        "dates.npz": ([("x.npy", _npy(np.zeros(16, "M8[ns]")))], "is a datetime type"),
        "void.npz": ([("x.npy", _npy(np.zeros(16, "V4")))], "is a void (raw or structured)"),
        "dup.npz": ([("x.npy", _npy(x)), ("x.npy", _npy(x))], "appears more than once"),
        "trunc.npz": ([("x.npy", _npy(x)[:-4]), ("y.npy", _npy(y))], "truncated"),
    }
    for name, (members, message) in bad.items():
        path = _npz(tmp_path / name, members)
        res = cli(["run", UCI, "--places", PLACES, "--steps", 1, "--feed", path])
        assert_clean_error(res, f"{path}: member 'x.npy'", message)
        assert "internal error" not in res.err
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "notzip.npz").write_bytes(b"PK\x03\x04 but not really a zip file")
    for name, message in (("empty.npz", "the file is empty"), ("notzip.npz", "not a zip")):
        res = cli(["run", UCI, "--places", PLACES, "--steps", 1, "--feed", tmp_path / name])
        assert_clean_error(res, f"{tmp_path / name}: ", message)
        assert "internal error" not in res.err


def test_the_cli_trains_the_same_on_big_endian_feeds(cli, tmp_path):
    x, y = _xy(32)
    native = _npz(tmp_path / "le.npz", [("x.npy", _npy(x)), ("y.npy", _npy(y))])
    swapped = _npz(tmp_path / "be.npz", [("x.npy", _npy(x.astype(">f4"))),
                                         ("y.npy", _npy(y.astype(">f4")))])
    runs = []
    for path in (native, swapped):
        res = cli(["run", UCI, "--places", PLACES, "--steps", 3, "--batch", 16, "--threads", 1,
                   "--feed", path, "--no-progress"])
        assert res.status == 0, res
        runs.append(_losses(res.out))
    assert len(runs[0]) == 3 and runs[0] == runs[1], runs


def test_damaged_files_are_feed_errors_or_good_arrays(tmp_path, program):
    """Bytes changed, cut out or put in anywhere (a seeded sample of damage to the four
    compressions zipfile has): every outcome is a FeedError or arrays that passed every
    check, never another exception."""
    rng = np.random.default_rng(7)
    x, y = _xy(5)
    seeds = [_npz(tmp_path / f"seed{c}.npz", [("x.npy", _npy(x)),
                                              ("y.npy", _npy(y.astype(">f4")))], c).read_bytes()
             for c in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2,
                       zipfile.ZIP_LZMA)]
    path = tmp_path / "damaged.npz"
    outcomes = {"refused": 0, "read": 0}
    for _ in range(400):
        data = bytearray(seeds[rng.integers(len(seeds))])
        for _ in range(rng.integers(1, 5)):
            k = int(rng.integers(len(data)))
            what = rng.random()
            if what < 0.6:
                data[k] = int(rng.integers(256))
            elif what < 0.8:
                del data[k:k + int(rng.integers(1, 20))]
            else:
                data[k:k] = rng.integers(0, 256, int(rng.integers(1, 8)), np.uint8).tobytes()
        path.write_bytes(bytes(data))
        try:
            got = read_feed_file(path, program)
        except FeedError as e:
            assert str(e).startswith(f"{path}: "), str(e)
            outcomes["refused"] += 1
            continue
        outcomes["read"] += 1
        for name, array in got.items():  # what was read passed the checks it claims
            assert array.dtype == np.float32 and array.dtype.isnative, name
            assert array.shape[1:] == {"x": (13,), "y": (1,)}[name], (name, array.shape)
    assert outcomes["refused"] > 300, outcomes
