"""The CPU a run computes on: what float results depend on besides the code and the versions.

Sums of floats (matmuls in the calibration forwards, GPTQ's Hessians, AWQ's searches, eval's
logits, distillation's steps) are rounded in an order that follows the SIMD width of the kernels
torch and its BLAS pick at run time, so their bits differ between, say, an AVX2 and an AVX-512
machine. Integer-exact paths (data-free RTN: block maxima, one division per element, the
format's rounding) give the same bytes on every CPU. `cpu_profile()` names what decides the
float paths: the architecture, the vendor and the core's model (oneDNN/MKL choose their kernels
by them), torch's vector ISA (`torch.backends.cpu.get_cpu_capability()`, ATEN_CPU_CAPABILITY
forces it), whether bf16 arithmetic is native (AVX512-BF16 / AMX-BF16 on x86, the BF16 extension
on Arm) or emulated, which also decides the compute dtype of the CPU forwards, and whether oneDNN
may use AMX tiles (two Xeons alike but for AMX gave other bits for 6 of the byte gate's 11
CPU-dependent CI cases, 2026-12-06).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import platform
import re
from pathlib import Path

# /proc/cpuinfo flags (x86 "flags", Arm "Features") that make bf16 matmuls native
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


# /proc/cpuinfo keys naming the core's model: x86 "cpu family" + "model", Arm "CPU part" (+ implementer)
_MODEL_KEYS = ("cpu family", "model", "CPU part")


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str], str]:
    """(vendor, flags, model) from /proc/cpuinfo's first processor, model as "6.167" (x86 family.model)
    or "0xd4f" (Arm part); ("", {}, "") where there is none."""
    vendor, flags, model = "", frozenset(), {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return vendor, flags, ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("vendor_id", "CPU implementer") and not vendor:
            vendor = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
        elif key in _MODEL_KEYS and key not in model:
            model[key] = value.strip()
    return vendor, flags, ".".join(model[k] for k in _MODEL_KEYS if k in model)


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (x86 "flags", Arm "Features"); empty where /proc/cpuinfo is absent."""
    return _cpuinfo()[1]


def amx() -> bool:
    """oneDNN may run bf16 matmuls on AMX tiles here: the CPU has AMX-BF16 and ONEDNN_MAX_CPU_ISA does
    not cap oneDNN below it. AMX sums in another order than AVX512-BF16's dot products, so its bits
    differ (measured: GPTQ and AWQ artifacts of the byte gate, tests/test_artifact_hashes.py)."""
    cap = onednn_cap()
    return "amx_bf16" in cpu_flags() and (not cap or "AMX" in cap or cap == "ALL")


def native_bf16() -> bool:
    """bf16 matmuls run natively here (else torch emulates them in fp32, several times slower)."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


def cpu_profile() -> dict[str, str | bool]:
    """{"arch", "vendor", "model", "isa", "native_bf16", "amx", "blas"}: what the float paths' bits depend
    on (module doc). `model` is the core's ("6.167": x86 family.model), as MKL and oneDNN tune their
    kernels by it; "" where /proc/cpuinfo has none."""
    import torch  # lazy: torch (~1 s); the CLI's start-up imports this module without computing

    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    vendor, _, model = _cpuinfo()
    return {"arch": platform.machine(), "vendor": vendor or platform.processor() or "unknown", "model": model,
            "isa": torch.backends.cpu.get_cpu_capability(), "native_bf16": native_bf16(), "amx": amx(),
            "blas": blas.group(1) if blas else "unknown"}


def cpu_key(profile: dict | None = None) -> str:
    """One line naming the profile, e.g. "x86_64 GenuineIntel 6.167 AVX512 bf16 amx mkl": equal keys,
    equal float bits. A profile recorded before `model` and `amx` existed keys as before."""
    p = profile or cpu_profile()
    return " ".join([str(p["arch"]), str(p["vendor"])] + ([str(p["model"])] if p.get("model") else [])
                    + [str(p["isa"])] + (["bf16"] if p["native_bf16"] else []) + (["amx"] if p.get("amx") else [])
                    + [str(p.get("blas", "unknown"))])


# calibrate.dtype: what the CPU forwards (calibration, GPTQ/AWQ statistics) compute in
COMPUTE_DTYPES = ("auto", "float32", "bfloat16")
_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}  # safetensors code -> torch dtype name


def compute_dtype(choice: str, model_dtype: str, device_type: str = "cpu") -> tuple[str, str]:
    """(torch dtype name, why) of the forwards: `choice` "float32" / "bfloat16" forced; "auto": the
    checkpoint's dtype (`model_dtype`, a safetensors code: BF16 / F16 / F32), except bf16 on a CPU
    that emulates it, which computes in float32 (9x faster there: 58 vs 6.4 GFLOP/s for F.linear
    2048x2048x5632 on 2 AVX2 cores; docs/performance.md). On a GPU (`device_type` cuda) bf16 is native."""
    if choice not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype {choice!r} is not one of {', '.join(COMPUTE_DTYPES)}")
    if choice != "auto":
        return choice, "forced"
    name = _NAMES.get(model_dtype, "bfloat16")  # tfcompile.ir.torch_dtype's default: bf16
    if name != "bfloat16":
        return name, "the checkpoint's dtype"
    if device_type != "cpu":
        return name, f"the checkpoint's dtype, native on {device_type}"
    if not native_bf16():
        return "float32", "bf16 is emulated on this CPU"
    cap = onednn_cap()
    if cap and not cap.startswith(_ONEDNN_BF16):
        return "float32", f"bf16 is emulated: oneDNN is capped at {cap}"
    return name, "the checkpoint's dtype, native bf16 on this CPU"


# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) from which on it computes bf16 natively; below them
# (AVX2, AVX512_CORE, ...) F.linear in bf16 is emulated: measured here 3-5 vs 10-14 GFLOP/s fp32
_ONEDNN_BF16 = ("AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX10_1_512", "ALL")


def onednn_cap() -> str:
    """ONEDNN_MAX_CPU_ISA (or its old name DNNL_MAX_CPU_ISA), upper-cased; "" when unset."""
    return (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()


MMAP_THRESHOLD = 128 << 10  # the calibration loops' fixed threshold (calibration/binding.py)


def mmap_threshold(nbytes: int) -> None:
    """glibc's M_MMAP_THRESHOLD: allocations of `nbytes` or more get their own mmap, returned to the
    OS on free (and page-faulted in again on the next one). Setting it turns glibc's dynamic
    adjustment off for the process. No-op off glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(-3, nbytes)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


@contextlib.contextmanager
def heap_allocations(nbytes: int = 64 << 20):
    """Inside: allocations under `nbytes` reuse the heap (loops that allocate the same few MB of
    temporaries thousands of times: the output-scale search spent a third of its CPU time in the
    kernel, page-faulting fresh mmaps, measured 0.4-1.0 s of sys per SmolLM2 gate/up group against
    0.05 s); after: the calibration loops' fixed MMAP_THRESHOLD again."""
    mmap_threshold(nbytes)
    try:
        yield
    finally:
        mmap_threshold(MMAP_THRESHOLD)
