"""Build, load and call the fused C kernels in `_csrc` (the `impl="fast"` path).

The library is compiled once per (source, compiler flags, CPU) with the system
C compiler (`cc`/`gcc`, ~1 s) into ~/.cache/tfcompile (or $TFCOMPILE_CACHE)
and loaded with ctypes. ctypes drops the GIL during a call, so work is split
across `torch.get_num_threads()` Python threads, each on a contiguous slice.
If no compiler is present or the build fails, `lib()` returns None after one
warning and callers fall back to the plain-torch reference.
Set TFCOMPILE_NO_NATIVE=1 to force the reference.
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

from tfcompile.settings import settings

from ._csrc import C_SOURCE

# No -ffast-math: the kernels must round exactly like torch's fp32 ops.
CFLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-ffp-contract=off"]
DTYPE_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}

_lock = threading.Lock()
_state: dict = {"lib": None, "tried": False}
_pool: dict = {}


def _cpu_tag() -> str:
    """CPU flags line: a cached -march=native build must not move to another CPU."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_dir() -> Path:
    return settings().native_kernels_dir


def _build(out: Path) -> None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler found (cc/gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "formats.c"
        src.write_text(C_SOURCE)
        so = Path(tmp) / out.name
        subprocess.run([cc, *CFLAGS, str(src), "-o", str(so)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(so, out)  # atomic: parallel processes never see half a file


def _declare(lib: ctypes.CDLL) -> None:
    p, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    for sfx in DTYPE_SUFFIX.values():
        getattr(lib, f"amax_grid_{sfx}").argtypes = [p, i64, i64, i64, p]
        getattr(lib, f"fp8_quant_{sfx}").argtypes = [p, i64, i64, p, i64, i64, p]
        getattr(lib, f"nvfp4_quant_{sfx}").argtypes = [p, i64, f32, p, p]
        getattr(lib, f"mx_quant_{sfx}").argtypes = [p, i64, ctypes.c_int, ctypes.c_int, p, p]


def lib() -> ctypes.CDLL | None:
    """The loaded kernel library, or None (fallback to reference) after one warning."""
    if _state["tried"]:
        return _state["lib"]
    with _lock:
        if _state["tried"]:
            return _state["lib"]
        _state["tried"] = True
        if settings().no_native:
            return None
        key = hashlib.sha256("\0".join([C_SOURCE, *CFLAGS, _cpu_tag()]).encode()).hexdigest()[:16]
        path = cache_dir() / f"formats_{key}.so"
        try:
            if not path.exists():
                _build(path)
            handle = ctypes.CDLL(str(path))
            _declare(handle)
            _state["lib"] = handle
        except Exception as exc:  # noqa: BLE001 - any build/load failure means fallback
            detail = getattr(exc, "stderr", "") or str(exc)
            warnings.warn(f"tfcompile: fast format kernels unavailable, using the plain-torch "
                          f"reference (slower): {detail.strip()[:300]}", RuntimeWarning, stacklevel=3)
        return _state["lib"]


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


def parallel(total: int, call, grain: int = 1) -> bool:
    """Run call(start, stop) over [0, total) split into per-thread slices.

    Slices are multiples of `grain` (rows or blocks). Returns True if any call
    reported NaN/Inf (nonzero return)."""
    n = max(1, min(_limit["n"] or torch.get_num_threads(), total // max(grain, 1) // 64 or 1))
    if n == 1:
        return bool(call(0, total))
    per = -(-total // n)
    per = -(-per // grain) * grain
    bounds = [(s, min(s + per, total)) for s in range(0, total, per)]
    pool = _pool.get(n) or _pool.setdefault(n, ThreadPoolExecutor(n, thread_name_prefix="tfc-fmt"))
    return any(f.result() for f in [pool.submit(call, a, b) for a, b in bounds])
