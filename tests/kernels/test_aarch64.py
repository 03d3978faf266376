"""The AArch64 build of the fused kernels equals the plain-torch reference bit for bit.

The C source is cross-compiled for aarch64 (Debian's gcc-aarch64-linux-gnu, static against
libc6-dev-arm64-cross) with the flags `_native` uses for the NEON path, together with
aarch64_harness.c, and run under qemu-user. Record / replay: each quantizer runs once on the host
with the kernel library replaced by a recorder (the host kernels keep the pipeline going; every
call's inputs are kept), the harness runs all recorded calls under qemu in one process, then the
quantizer runs again with the library replaced by a replayer that checks each call's inputs and
returns the aarch64 outputs. The replayed QTensor (or the FormatError of a NaN/Inf) is compared
with the reference's, so what is proven is aarch64 kernels + host wrappers == reference.
qemu runs the code, it does not time it: no speed figure comes from here.
"""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from tfcompile.errors import FormatError
from tfcompile.kernels.formats import _native, block_search as bs, kernel_threads
from tfcompile.kernels.formats._csrc import C_SOURCE

from test_fast import QUANTIZERS, assert_same, make, midpoint_row

CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", Path("/usr/aarch64-linux-gnu")
PACKAGES = "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user"
KERNEL_ID = {"amax_grid": 0, "fp8_quant": 1, "nvfp4_quant": 2, "mx_quant": 3, "fp8_tiles": 4}
DTYPE = {"f32": (0, 4), "bf16": (1, 2), "f16": (2, 2)}  # suffix -> (harness id, bytes per element)
BUILDS = {"neon": [], "scalar": ["-DTFC_SCALAR"]}  # extra flags on top of cflags("neon", "aarch64")


def _tools_or_fail() -> None:
    missing = [t for t in (CC, QEMU) if shutil.which(t) is None]
    if not (SYSROOT / "lib" / "libc.a").exists():
        missing.append(str(SYSROOT / "lib" / "libc.a"))
    if missing:  # a failure, not a skip: CI installs these (.ci/apt-packages)
        pytest.fail(f"the aarch64 kernel test needs {', '.join(missing)} (Debian packages {PACKAGES}); "
                    f"install them: apt-get install -y --no-install-recommends {PACKAGES}", pytrace=False)


@pytest.fixture(scope="module")
def harnesses(tmp_path_factory) -> dict[str, Path]:
    _tools_or_fail()
    tmp = tmp_path_factory.mktemp("aarch64")
    (tmp / "formats.c").write_text(C_SOURCE)
    flags = [f for f in _native.cflags("neon", "aarch64") if f not in ("-fPIC", "-shared")]
    out = {}
    for name, extra in BUILDS.items():
        exe = tmp / f"harness_{name}"
        subprocess.run([CC, *flags, *extra, "-static", "-Wall", "-Werror", str(tmp / "formats.c"),
                        str(Path(__file__).with_name("aarch64_harness.c")), "-o", str(exe)],
                       check=True, capture_output=True, text=True, timeout=300)
        out[name] = exe
    return out


def qemu(exe: Path, *args: str, stdin: bytes = b"") -> bytes:
    return subprocess.run([QEMU, "-L", str(SYSROOT), str(exe), *args], input=stdin, check=True,
                          capture_output=True, timeout=600).stdout


def encode(name: str, args: tuple) -> tuple[bytes, list[tuple[int, int]]]:
    """One call of an exported kernel -> (its harness record, [(output pointer, bytes)])."""
    kern, _, sfx = name.rpartition("_")
    did, es = DTYPE[sfx]
    g, s, outs = 0.0, b"", []
    if kern == "amax_grid":
        x, rows, k, bk, o = args
        a, n = (rows, k, bk, 0), rows * k
        outs = [(o, rows * -(-k // bk) * 4)]
    elif kern == "fp8_quant":
        x, rows, k, sp, srs, bk, o = args
        a, n = (rows, k, srs, bk), rows * k
        s = ctypes.string_at(sp, (rows * srs if srs else -(-k // bk)) * 4)
        outs = [(o, rows * k)]
    elif kern == "fp8_tiles":  # data first, scales second, as the harness writes them
        x, rows, k, bn, bk, sp, o = args
        a, n = (rows, k, bn, bk), rows * k
        outs = [(o, rows * k), (sp, -(-rows // bn) * -(-k // bk) * 4)]
    elif kern == "nvfp4_quant":
        x, nb, g, p, sc = args
        a, n = (nb, 0, 0, 0), nb * 16
        outs = [(p, nb * 8), (sc, nb)]
    else:
        x, nb, elem, ceil, d, sc = args
        a, n = (nb, elem, ceil, 0), nb * 32
        outs = [(d, nb * (16 if elem == 4 else 32)), (sc, nb)]
    xb = ctypes.string_at(x, n * es)
    rec = struct.pack("<ii4qfi", KERNEL_ID[kern], did, *a, g, 0) + struct.pack("<q", len(xb)) + xb
    return rec + struct.pack("<q", len(s)) + s, outs


class Recorder:
    """Stands in for the ctypes library: keeps each call's record, runs the host kernel."""

    def __init__(self, host):
        self.host, self.records = host, []

    def __getattr__(self, name):
        def call(*args):
            self.records.append(encode(name, args)[0])
            return getattr(self.host, name)(*args)
        return call


class Replayer:
    """Stands in for the ctypes library: checks each call against the record, writes the aarch64 outputs."""

    def __init__(self, records, results):
        self.todo = list(zip(records, results))

    def __getattr__(self, name):
        def call(*args):
            rec, outs = encode(name, args)
            want, (ret, blobs) = self.todo.pop(0)
            assert rec == want, f"{name}: inputs differ from the recorded call (an earlier aarch64 output differed)"
            for (ptr, n), data in zip(outs, blobs):
                assert len(data) == n, name
                ctypes.memmove(ptr, data, n)
            return ret
        return call


def parse(out: bytes, records: list[bytes]) -> list[tuple[int, list[bytes]]]:
    res, pos = [], 0
    for rec in records:
        ret = struct.unpack_from("<i", out, pos)[0]
        pos += 8
        blobs = []
        for _ in range(2 if struct.unpack_from("<i", rec)[0] >= 2 else 1):
            n = struct.unpack_from("<q", out, pos)[0]
            blobs.append(out[pos + 8: pos + 8 + n])
            pos += 8 + n
        res.append((ret, blobs))
    assert pos == len(out), "harness output longer than the records"
    return res


def edge_tensor(dtype: torch.dtype) -> torch.Tensor:
    """17 x 544 (34 blocks of 16, 17 of 32: full tiles and scalar tails) of edge values:
    E2M1 and E4M3 ties at exact scales, subnormals of the dtype (whole blocks of them: the MX
    exponent's clz branch, NVFP4's underflowing scale), -0, zeros, saturation-sized outliers."""
    w = make((17, 544), torch.float32, seed=7, spread=2.0)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 0.5, 1.0, 1.5, 3.0, 4.0, 2.0, 0.0, -0.0])
    w[0, :16] = ties * 64                                   # amax 384 = 6 * 64: eff and MX scale exact
    w[0, 16:32] = -ties * 64
    w[1, :32] = torch.arange(32) * 2.0 ** -9 * 64           # E4M3 subnormal grid and its ties at scale 64
    w[1, 32:64] = (torch.arange(32) + 0.5) * 2.0 ** -9 * 64
    tiny = torch.finfo(torch.float16 if dtype == torch.float16 else torch.float32).smallest_normal
    w[2, :64] = torch.linspace(-4, 4, 64) * tiny / 8        # a block pair of subnormals
    w[3, :] = torch.linspace(-1, 1, 544) * tiny * 4          # a row of near-subnormal normals
    w[4, 100:140] = -0.0
    w[5, 7] = 6e4 if dtype == torch.float16 else 3e38       # outlier
    return w.to(dtype)


def nonfinite(dtype: torch.dtype, value: float, where: int) -> torch.Tensor:
    w = make((9, 544), dtype, seed=where, spread=1.0)
    w.view(-1)[where] = value
    return w


def cases() -> list[tuple[str, int, torch.dtype, torch.Tensor]]:
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        tensors = {"64x512": make((64, 512), dtype, 1, 3.0), "3x40x96": make((3, 40, 96), dtype, 2, 3.0),
                   "5x544": make((5, 544), dtype, 3, 12.0), "1x96": make((1, 96), dtype, 4, 1.0),
                   "edges": edge_tensor(dtype), "nan-tile": nonfinite(dtype, float("nan"), 300),
                   "inf-tail": nonfinite(dtype, float("inf"), 9 * 544 - 3),
                   "-inf": nonfinite(dtype, float("-inf"), 2000)}
        for tname, w in tensors.items():
            for qi, (qname, _, _) in enumerate(QUANTIZERS):
                out.append((f"{qname}-{str(dtype)[6:]}-{tname}", qi, dtype, w))
    for amax in (3.3, 7.77e-3):  # FP8's divide-free path at E4M3 rounding midpoints (test_fast)
        for qi, (qname, _, _) in enumerate(QUANTIZERS):
            if qname.startswith("fp8"):
                out.append((f"{qname}-float32-midpoints-{amax}", qi, torch.float32, midpoint_row(amax)[0]))
    return out


CASES = cases()


def run_quantizer(qi: int, w: torch.Tensor, library, monkeypatch):
    """QUANTIZERS[qi] on w with `library` as the kernel library: QTensor or the FormatError."""
    with monkeypatch.context() as m, kernel_threads(1):
        m.setattr(_native, "lib", lambda: library)
        try:
            return QUANTIZERS[qi][1](w, "fast")
        except FormatError as e:
            return e


@pytest.fixture(scope="module")
def recorded():
    """Host run of every case through the recorder: records per case."""
    host = _native.lib()
    assert host is not None, "host kernels unavailable"
    mp, out = pytest.MonkeyPatch(), []
    try:
        for _, qi, _, w in CASES:
            rec = Recorder(host)
            run_quantizer(qi, w, rec, mp)
            out.append(rec.records)
    finally:
        mp.undo()
    return out


@pytest.fixture(scope="module")
def arm_outputs(harnesses, recorded):
    """build -> per case the aarch64 results of its records (one qemu process per build)."""
    flat = [r for recs in recorded for r in recs]
    res = {}
    for name, exe in harnesses.items():
        parsed = parse(qemu(exe, stdin=b"".join(flat)), flat)
        it = iter(parsed)
        res[name] = [[next(it) for _ in recs] for recs in recorded]
    return res


@pytest.mark.parametrize("build", BUILDS)
def test_harness_compiled_the_path(harnesses, build):
    assert qemu(harnesses[build], "isa").decode().strip() == build


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_aarch64_equals_reference(build, case, recorded, arm_outputs, monkeypatch):
    _, qi, _, w = CASES[case]
    want = QUANTIZERS[qi][1](w, "reference") if torch.isfinite(w.float()).all() else None
    got = run_quantizer(qi, w, Replayer(recorded[case], arm_outputs[build][case]), monkeypatch)
    if want is None:
        assert isinstance(got, FormatError) and "NaN or Inf" in got.message
        with pytest.raises(FormatError):
            QUANTIZERS[qi][1](w, "reference")
    else:
        assert not isinstance(got, Exception), got
        assert_same(got, want)


def _search_cases():
    """(dtype, blk, rule, x, A, g, offsets, fixed): kernels/formats/block_search.py's inputs with
    row tails, zero blocks, outliers and edge values, searched and with given codes."""
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for blk, rule in ((16, None), (32, "floor"), (32, "ceil")):
            for x in (make((37, 256), dtype, 5, 2.0) * 1e-2, edge_tensor(dtype)[:, :512]):
                x = torch.where(torch.isfinite(x), x, 0.0)  # fp16's edge rows overflow (NaN: test_block_search)
                k = x.shape[1]
                gen = torch.Generator().manual_seed(k + blk)
                m = torch.randn(k, k, generator=gen) / k ** 0.5 + torch.eye(k)
                h = m.T @ m
                a = bs.tri(torch.stack([h[i:i + blk, i:i + blk] for i in range(0, k, blk)]))
                g = torch.tensor([2688 / max(float(x.float().abs().max()), 1e-30)]) if blk == 16 else None
                offs = (0, 1, -1, -2) if blk == 16 else (0, 1, -1)
                out.append((dtype, blk, rule, x, a, g, offs, None))
                fixed = bs.search_blocks(x, a, g=g, rule=rule, offsets=offs, impl="reference")[1]
                out.append((dtype, blk, rule, x, a, g, (0,), fixed))
    return out


@pytest.mark.parametrize("build", BUILDS)
def test_aarch64_search_kernel_equals_reference(harnesses, build):
    """fp4_search under qemu: packed codes, scale codes and row errors (fp64) equal the reference's."""
    cases, recs = _search_cases(), []
    for dtype, blk, rule, x, a, g, offs, fixed in cases:
        xb = x.contiguous().view(torch.uint8).numpy().tobytes()
        fb = b"" if fixed is None else fixed.contiguous().numpy().tobytes()
        head = struct.pack("<6i2qfi", DTYPE[_native.DTYPE_SUFFIX[dtype]][0], blk, int(g is None), int(rule == "ceil"),
                           len(offs), int(fixed is not None), x.shape[0], x.shape[1],
                           0.0 if g is None else float(g), 0)
        blobs = [xb, struct.pack(f"<{len(offs)}i", *offs), fb, a.contiguous().numpy().tobytes()]
        recs.append(head + b"".join(struct.pack("<q", len(b)) + b for b in blobs))
    out, pos = qemu(harnesses[build], "search", stdin=b"".join(recs)), 0
    for dtype, blk, rule, x, a, g, offs, fixed in cases:
        ret = struct.unpack_from("<i", out, pos)[0]
        pos += 8
        got = []
        for _ in range(3):
            n = struct.unpack_from("<q", out, pos)[0]
            got.append(out[pos + 8: pos + 8 + n])
            pos += 8 + n
        want = bs.search_blocks(x, a, g=g, rule=rule, offsets=offs, fixed=fixed, impl="reference")
        label = (str(dtype), blk, rule, tuple(x.shape), fixed is not None)
        assert ret == 0, label
        assert got[0] == want[0].numpy().tobytes() and got[1] == want[1].numpy().tobytes(), label
        # bit for bit, but a NaN's sign: an overflowing block's inf - inf is +NaN on Arm, -NaN on x86
        err = torch.frombuffer(bytearray(got[2]), dtype=torch.float64)
        torch.testing.assert_close(err, want[2], rtol=0, atol=0, equal_nan=True, msg=str(label))
    assert pos == len(out)
