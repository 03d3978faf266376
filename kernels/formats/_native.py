"""Build, load and call the fused C kernels in `_csrc` (the `impl="fast"` path).

The library is compiled once per (source, compiler, flags, CPU) with the system
C compiler (`cc`/`gcc`, ~1-2 s) into ~/.cache/tfcompile/kernels (or
$TFCOMPILE_CACHE) and loaded with ctypes. ctypes drops the GIL during a call,
so work is split across `torch.get_num_threads()` Python threads, each on a
contiguous slice. If no compiler is present or the build fails, `lib()`
returns None after one warning and callers fall back to the plain-torch
reference. Set TFCOMPILE_NO_NATIVE=1 to force the reference.

Vector path: TFCOMPILE_NATIVE_ISA (read at first use) picks the -march of the
build, hence which 16-lane block of `_csrc` compiles (`ISAS`): `native` (the
default, -march=native: AVX-512 or AVX2 on x86, NEON on AArch64), `avx512`
(x86-64-v4), `avx2` (x86-64-v3, runs on any AVX2 CPU), `neon` (armv8-a) or
`scalar` (the portable loops only). A forced path this CPU cannot run is a
UserError, never a crash; `compiled_isa()` says which path a library took.
Tests and benches switch paths in-process with `use(isa)`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import torch

from tfcompile.errors import UserError
from tfcompile.settings import settings

from ._csrc import C_SOURCE

# No -ffast-math: the kernels must round exactly like torch's fp32 ops.
BASE_CFLAGS = ["-O3", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=off"]
DTYPE_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

# machine -> isa -> (extra compiler flags, /proc/cpuinfo flags the CPU must have,
# the `tfc_isa()` the build must report or None for "whatever native gives").
# x86-64-v3 = AVX2 + FMA + F16C + BMI1/2 + LZCNT (abm) + MOVBE; v4 adds AVX-512 F/BW/CD/DQ/VL.
_V3 = {"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"}
ISAS = {
    "x86_64": {
        "native": (["-march=native"], set(), None),
        "avx512": (["-march=x86-64-v4"], _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}, "avx512"),
        "avx2": (["-march=x86-64-v3"], _V3, "avx2"),
        "scalar": (["-march=native", "-DTFC_SCALAR"], set(), "scalar"),
    },
    "aarch64": {
        "native": (["-mcpu=native"], set(), None),
        "neon": (["-march=armv8-a"], {"asimd"}, "neon"),
        "scalar": (["-mcpu=native", "-DTFC_SCALAR"], set(), "scalar"),
    },
}
_GENERIC = {"native": ([], set(), None), "scalar": (["-DTFC_SCALAR"], set(), "scalar")}

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL | None] = {}  # isa -> loaded library (None: build failed, warned)
_state: dict = {"isa": None}  # the active path: set by use(), else TFCOMPILE_NATIVE_ISA at first use
_pool: dict = {}


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def isas(machine: str | None = None) -> dict:
    """The vector paths of a machine (`platform.machine()` by default)."""
    return ISAS.get(machine or _machine(), _GENERIC)


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_features(info: str | None = None) -> set[str]:
    """CPU feature names: the x86 `flags` line or the Arm `Features` line of /proc/cpuinfo."""
    for line in (_cpuinfo() if info is None else info).splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.partition(":")[2].split())
    return set()


def cpu_tag(info: str | None = None) -> str:
    """What identifies this CPU for the cache: machine, feature line, model (x86) or part (Arm).

    A -march=native build must not move to another CPU, even through a shared cache."""
    keep = ("flags", "Features", "model name", "CPU implementer", "CPU architecture", "CPU part")
    seen: dict[str, str] = {}
    for line in (_cpuinfo() if info is None else info).splitlines():
        k = line.partition(":")[0].strip()
        if k in keep and k not in seen:
            seen[k] = line.strip()
    return "\n".join([_machine(), *seen.values()]) if seen else _machine() + " " + platform.processor()


def _isa_error(isa: str, why: str) -> UserError:
    names = ", ".join(isas())
    return UserError(f"TFCOMPILE_NATIVE_ISA={isa!r}: {why}",
                     hint=f"unset TFCOMPILE_NATIVE_ISA (native), or set one of: {names}")


def cflags(isa: str, machine: str | None = None) -> list[str]:
    """Compiler flags of the library for one vector path (also used by the aarch64 test build)."""
    table = isas(machine)
    if isa not in table:
        raise _isa_error(isa, f"no such vector path on {machine or _machine()}")
    return [*BASE_CFLAGS, *table[isa][0]]


def check_runnable(isa: str) -> None:
    """Raise a UserError if this CPU lacks a feature the path's build needs (it would SIGILL)."""
    cflags(isa)
    missing = sorted(isas()[isa][1] - cpu_features())
    if missing:
        raise _isa_error(isa, f"this CPU lacks {' '.join(missing)} (/proc/cpuinfo)")


def runnable() -> list[str]:
    """The vector paths this CPU can run, `native` first."""
    out = []
    for isa in isas():
        try:
            check_runnable(isa)
            out.append(isa)
        except UserError:
            pass
    return out


def cache_dir() -> Path:
    return settings().native_kernels_dir


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def build_key(isa: str, cc: str, tag: str) -> str:
    """Cache key: source, compiler, flags and CPU; any change gives another file."""
    return hashlib.sha256("\0".join([C_SOURCE, cc, *cflags(isa), tag]).encode()).hexdigest()[:16]


def _build(out: Path, cc: str, flags: list[str]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "formats.c"
        src.write_text(C_SOURCE)
        so = Path(tmp) / out.name
        subprocess.run([cc, *flags, str(src), "-o", str(so)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(so, out)  # atomic: parallel processes never see half a file


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for sfx in DTYPE_SUFFIX.values():
        getattr(lib, f"amax_grid_{sfx}").argtypes = [p, i64, i64, i64, p]
        getattr(lib, f"fp8_quant_{sfx}").argtypes = [p, i64, i64, p, i64, i64, p]
        getattr(lib, f"fp8_tiles_{sfx}").argtypes = [p, i64, i64, i64, i64, p, p]
        getattr(lib, f"nvfp4_quant_{sfx}").argtypes = [p, i64, f32, p, p]
        getattr(lib, f"mx_quant_{sfx}").argtypes = [p, i64, ctypes.c_int, ctypes.c_int, p, p]
        getattr(lib, f"fp4_search_{sfx}").argtypes = [p, i64, i64, ctypes.c_int, ctypes.c_int, f32, ctypes.c_int,
                                                      p, ctypes.c_int, p, p, p, p, p]
    lib.tfc_isa.restype = ctypes.c_char_p


def compiled_isa(handle: ctypes.CDLL) -> str:
    """The vector path a loaded library was compiled with: avx512, avx2, neon or scalar."""
    return handle.tfc_isa().decode()


def _load(isa: str) -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (cc/gcc)")
    path = cache_dir() / f"formats_{isa}_{build_key(isa, cc, cpu_tag())}.so"
    if not path.exists():
        _build(path, cc, cflags(isa))
    handle = ctypes.CDLL(str(path))
    _declare(handle)
    want, got = isas()[isa][2], compiled_isa(handle)
    if want is not None and got != want:
        raise RuntimeError(f"the {isa} build compiled the {got} path ({cc} {' '.join(cflags(isa))})")
    return handle


def load(isa: str) -> ctypes.CDLL | None:
    """The library of one vector path (built on first use), or None after one warning."""
    if isa in _libs:
        return _libs[isa]
    check_runnable(isa)  # a user error, not a fallback: the path was asked for by name
    with _lock:
        if isa not in _libs:
            try:
                _libs[isa] = _load(isa)
            except Exception as exc:  # noqa: BLE001 - any build/load failure means fallback
                _libs[isa] = None
                detail = getattr(exc, "stderr", "") or str(exc)
                warnings.warn(f"tfcompile: fast format kernels unavailable, using the plain-torch "
                              f"reference (slower): {detail.strip()[:300]}", RuntimeWarning, stacklevel=3)
    return _libs[isa]


def lib() -> ctypes.CDLL | None:
    """The loaded library of the active path, or None (fallback to reference)."""
    isa = _state["isa"]
    if isa is None:  # first use: TFCOMPILE_NO_NATIVE ("" = off) or TFCOMPILE_NATIVE_ISA
        s = settings()
        isa = _state["isa"] = "" if s.no_native else s.native_isa
        if isa == "":
            _libs[""] = None
    return _libs[isa] if isa in _libs else load(isa)


@contextmanager
def use(isa: str):
    """Run the kernels of another vector path inside the block (tests, benches); yields its library."""
    old = _state["isa"]
    handle = load(isa)
    _state["isa"] = isa
    try:
        yield handle
    finally:
        _state["isa"] = old


def fn(name: str, dtype: torch.dtype):
    return getattr(lib(), f"{name}_{DTYPE_SUFFIX[dtype]}")


def ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


_limit: dict = {"n": None}


@contextmanager
def kernel_threads(n: int):
    """Cap the kernels' threads inside the block (e.g. to leave a core to a writer thread)."""
    old, _limit["n"] = _limit["n"], max(1, int(n))
    try:
        yield
    finally:
        _limit["n"] = old


def parallel(total: int, call, grain: int = 1, min_per_thread: int = 64) -> bool:
    """Run call(start, stop) over [0, total) split into per-thread slices.

    Slices are multiples of `grain` (rows or blocks), and a thread is started only for
    at least `min_per_thread` grains (rows or blocks of 16-32 elements are small; a band of
    128 weight rows is not). Returns True if any call reported NaN/Inf (nonzero return)."""
    n = max(1, min(_limit["n"] or torch.get_num_threads(), total // max(grain, 1) // min_per_thread or 1))
    if n == 1:
        return bool(call(0, total))
    per = -(-total // n)
    per = -(-per // grain) * grain
    bounds = [(s, min(s + per, total)) for s in range(0, total, per)]
    pool = _pool.get(n) or _pool.setdefault(n, ThreadPoolExecutor(n, thread_name_prefix="tfc-fmt"))
    return any(f.result() for f in [pool.submit(call, a, b) for a, b in bounds])
