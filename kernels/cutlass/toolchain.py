"""The tools a CUTLASS build needs: nvcc (CUDA 12.8+), the CUTLASS headers, cuobjdump.

- nvcc: $TFCOMPILE_NVCC, else `nvcc` on PATH, else /usr/local/cuda/bin/nvcc. CUDA 12.8 is
  the first release with sm_100a (tcgen05); older nvcc cannot build the Blackwell kernels
  and is treated as absent (sources are still emitted).
- CUTLASS: the headers of the `nvidia-cutlass` wheel (`cutlass_library/source/include` and
  `tools/util/include`), found through the installed package's location; nothing of it is
  imported (importing `cutlass_library` pulls cuda-python).
- cuobjdump / nvdisasm: beside nvcc, or inside the triton wheel
  (triton/backends/nvidia/bin), which every tfcompile install has.

Errors: `ToolchainError` (a UserError: what to install, as the hint) when compilation is
required (`emit_cutlass.compile=always`) and impossible.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.settings import settings

MIN_CUDA = (12, 8)  # first nvcc with sm_100a
# Per-job memory estimate of nvcc (cicc + ptxas + host compiler), GB, to bound parallel builds.
# Measured peak RSS (docs/kernels.md): sm_90a FP8 3.8 GB, sm_100a NVFP4 4.0 GB (other runs saw
# ~5 GB for sm_100a: docs/kernels.md "Hardware facts"); rounded up.
MEM_GB = {"90a": 4.0, "100a": 5.0}


class ToolchainError(UserError):
    """nvcc or the CUTLASS headers are missing or too old, and compiling was required."""


@dataclass(frozen=True)
class Toolchain:
    nvcc: str | None  # path
    release: tuple[int, int] | None  # CUDA release of nvcc, e.g. (13, 0)
    version: str  # nvcc's `--version` line "Cuda compilation tools, release 13.0, V13.0.88" ("" if none)
    includes: tuple[str, ...]  # CUTLASS include dirs (empty if not installed)
    cutlass: str | None  # nvidia-cutlass version
    cuobjdump: str | None

    @property
    def why_not(self) -> str | None:
        """None when sources can be compiled here, else the reason (one line)."""
        if self.nvcc is None:
            return "nvcc not found (set TFCOMPILE_NVCC or put CUDA 12.8+ on PATH)"
        if self.release is None or self.release < MIN_CUDA:
            return f"nvcc {self.version or '?'} is older than CUDA {MIN_CUDA[0]}.{MIN_CUDA[1]} (sm_100a needs it)"
        if not self.includes:
            return "CUTLASS headers not found (pip install nvidia-cutlass)"
        if self.cuobjdump is None:
            return "cuobjdump not found (it ships with CUDA and in the triton wheel)"
        return None

    def require(self) -> None:
        why = self.why_not
        if why is not None:
            raise ToolchainError(f"cannot compile CUTLASS kernels: {why}",
                                 hint="install CUDA 12.8+ and `pip install nvidia-cutlass`, or "
                                      "--cutlass auto to emit the sources only")


def find_nvcc() -> str | None:
    env = settings().nvcc
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def nvcc_release(nvcc: str) -> tuple[tuple[int, int] | None, str]:
    """(release, version line) from `nvcc --version`."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None, ""
    line = next((ln.strip() for ln in out.splitlines() if "release" in ln), "")
    m = re.search(r"release (\d+)\.(\d+)", line)
    return ((int(m.group(1)), int(m.group(2))) if m else None), line


def cutlass_includes() -> tuple[tuple[str, ...], str | None]:
    """CUTLASS include dirs of the installed nvidia-cutlass wheel, and its version."""
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return (), None
    root = Path(next(iter(spec.submodule_search_locations))) / "source"
    dirs = (root / "include", root / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        return (), None
    try:
        version = metadata.version("nvidia-cutlass")
    except metadata.PackageNotFoundError:
        version = _header_version(dirs[0])
    return tuple(str(d) for d in dirs), version


def _header_version(include: Path) -> str | None:
    text = (include / "cutlass" / "version.h").read_text(errors="replace")
    parts = [re.search(rf"#define CUTLASS_{p} (\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else None


def find_binutil(name: str, nvcc: str | None) -> str | None:
    """cuobjdump / nvdisasm: beside nvcc, on PATH, or in the triton wheel."""
    if nvcc:
        beside = Path(nvcc).parent / name
        if beside.is_file():
            return str(beside)
    found = shutil.which(name)
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "backends" / "nvidia" / "bin" / name
        if path.is_file():
            return str(path)
    return None


@lru_cache(maxsize=None)
def _detect(nvcc_env: str | None, path_env: str | None) -> Toolchain:
    nvcc = find_nvcc()
    release, version = nvcc_release(nvcc) if nvcc else (None, "")
    includes, cutlass = cutlass_includes()
    return Toolchain(nvcc, release, version, includes, cutlass, find_binutil("cuobjdump", nvcc))


def detect() -> Toolchain:
    """The toolchain of this machine (memoized per TFCOMPILE_NVCC / PATH)."""
    return _detect(settings().nvcc, os.environ.get("PATH"))


def nvcc_flags(arch: str) -> list[str]:
    """Flags of one compile, without paths (they go into the cache key as they are).

    `-gencode arch=compute_<arch>,code=sm_<arch>`: SASS for exactly that target, no PTX
    (nothing to JIT on another GPU). `arch` must carry the `a` suffix (90a / 100a): the
    wgmma / tcgen05 instructions exist only in the arch-specific feature set, and CUTLASS's
    arch guard compiles the kernel body to a trap without it (sass.py catches that).
    A shared object (not a bare cubin) because CUTLASS builds the kernel's parameters --
    TMA descriptors, tile-scheduler state, cluster launch -- in host C++.
    `--strip-all`: the static symbol table holds names of nvcc's temporary files (pid-based);
    with it and a fixed build directory (build.py) two builds are byte-identical."""
    return ["-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC,-fvisibility=hidden",
            "-shared", "-Xlinker=--strip-all", "-gencode", f"arch=compute_{arch},code=sm_{arch}"]


def mem_available_gb() -> float:
    """MemAvailable from /proc/meminfo, GB (0 when unreadable: one job at a time)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 ** 2
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def cache_root() -> Path:
    """$TFCOMPILE_CACHE (default ~/.cache/tfcompile)/cutlass: compiled objects by content hash."""
    return settings().cutlass_dir
