"""Compile generated CUTLASS sources with nvcc: in parallel, bounded by memory, cached by content.

One job = one source for one arch -> a shared object (.so) whose SASS has been checked
(sass.py). Jobs run on a thread pool (nvcc is a subprocess: threads only wait) of at most
`max_jobs` workers (default: CPU count), and a job starts only when its memory estimate
(toolchain.MEM_GB: 4 GB sm_90a, 5 GB sm_100a) fits in what /proc/meminfo says is available
minus what running jobs hold (one job always runs, even if the estimate exceeds it).

Across processes sharing the cache (pytest-xdist workers, parallel `tfcompile` runs) at most
`slots` builds run at once (default: the CPU count): each build holds one of the flock'ed
files <cache>/slot-<i>.lock while nvcc runs, so two processes never start 2 x 2 builds on a
2-core, 24 GB machine.

Cache: $TFCOMPILE_CACHE/cutlass/<key>.so + <key>.json, key = sha256 of (source, nvcc
version line, flags, CUTLASS version, host C++ compiler, cache schema): everything the object
depends on, so an entry stays valid across runs and machines (a CI cache can carry it). A hit returns the stored bytes and SASS
evidence (the .so is re-hashed against the .json first); a second emit of the same model
compiles nothing. Entries are written to a temporary name and renamed (atomic), and a
per-key file lock makes concurrent processes (pytest-xdist workers, parallel builds)
compile a source once: the second waits, then hits.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tfcompile.errors import TfcompileError
from tfcompile.io.atomic import write_atomic

from . import sass
from .toolchain import MEM_GB, Toolchain, cache_root, mem_available_gb, nvcc_flags

CACHE_SCHEMA = 2  # 2: the host compiler joined the key
HEADROOM_GB = 1.0  # left to everything else on the machine
TIMEOUT_S = 1800  # one nvcc run; sm_100a builds take ~30-70 s on 2 cores


class CutlassBuildError(TfcompileError):
    """nvcc failed on a generated source (a template or toolchain bug; exit 2)."""


@dataclass(frozen=True)
class Job:
    name: str  # for messages, e.g. "sm_100a/cutlass_nvfp4_gemm_sm100_1sm_128x128x256_c1x1"
    source: str
    arch: str  # "90a" | "100a"
    mma: tuple[str, ...]  # SASS opcodes the build must contain


@dataclass(frozen=True)
class Built:
    name: str
    key: str  # cache key (hex)
    so: bytes  # the shared object
    sass: dict  # sass.check's evidence: {"archs", "mma"}
    seconds: float  # nvcc wall time when it was compiled (0.0 if never measured)
    cached: bool  # taken from the cache


def cache_key(job: Job, tc: Toolchain) -> str:
    doc = [CACHE_SCHEMA, hashlib.sha256(job.source.encode()).hexdigest(), tc.version, nvcc_flags(job.arch),
           tc.cutlass, host_compiler()]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def host_compiler() -> str:
    """The C++ compiler nvcc uses for host code (g++ on PATH): its `--version` line."""
    exe = shutil.which("g++") or shutil.which("c++")
    if exe is None:
        return ""
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return exe
    return (out.splitlines() or [exe])[0]


class MemoryGate:
    """Admits jobs while their memory estimates fit the budget (GB); one job always runs."""

    def __init__(self, budget_gb: float):
        self.budget, self.held, self.running = budget_gb, 0.0, 0
        self.cond = threading.Condition()

    @contextmanager
    def hold(self, gb: float):
        with self.cond:
            self.cond.wait_for(lambda: self.running == 0 or self.held + gb <= self.budget)
            self.held, self.running = self.held + gb, self.running + 1
        try:
            yield
        finally:
            with self.cond:
                self.held, self.running = self.held - gb, self.running - 1
                self.cond.notify_all()


def build_all(jobs: list[Job], tc: Toolchain, max_jobs: int = 0, progress=None) -> list[Built]:
    """Compile (or fetch from the cache) every job; results in the order of `jobs`."""
    tc.require()
    slots = max(1, max_jobs or os.cpu_count() or 1)
    workers = min(slots, len(jobs) or 1)
    gate = MemoryGate(max(0.0, mem_available_gb() - HEADROOM_GB))

    def one(job: Job) -> Built:
        built = build_one(job, tc, gate, slots)
        if progress is not None:
            progress(built)
        return built

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="nvcc") as pool:
        return list(pool.map(one, jobs))


def build_one(job: Job, tc: Toolchain, gate: MemoryGate | None = None, slots: int = 1) -> Built:
    key = cache_key(job, tc)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f"{key}.lock"):
        hit = _load(root, key, job)
        if hit is not None:
            return hit
        with gate.hold(MEM_GB.get(job.arch, 5.0)) if gate is not None else _nothing(), _slot(root, slots):
            so, seconds = _nvcc(job, tc, key)
        with tempfile.NamedTemporaryFile(dir=root, suffix=".so", delete=False) as f:
            f.write(so)
        try:
            evidence = sass.check(sass.dump(tc.cuobjdump, f.name), job.mma, job.arch, job.name)
        finally:
            os.unlink(f.name)
        meta = {"name": job.name, "arch": job.arch, "sass": evidence, "seconds": round(seconds, 1),
                "so_sha256": hashlib.sha256(so).hexdigest(), "nvcc": tc.version, "cutlass": tc.cutlass}
        write_atomic(root / f"{key}.so", so, fsync=False)
        write_atomic(root / f"{key}.json", json.dumps(meta, indent=1, sort_keys=True).encode(), fsync=False)
        return Built(job.name, key, so, evidence, seconds, False)


def _load(root: Path, key: str, job: Job) -> Built | None:
    try:
        meta = json.loads((root / f"{key}.json").read_text())
        so = (root / f"{key}.so").read_bytes()
    except (OSError, ValueError):
        return None
    if meta.get("so_sha256") != hashlib.sha256(so).hexdigest():
        return None  # torn or tampered entry: rebuild
    return Built(job.name, key, so, meta["sass"], float(meta.get("seconds", 0.0)), True)


def _nvcc(job: Job, tc: Toolchain, key: str) -> tuple[bytes, float]:
    """Run nvcc on the source in its build directory; (shared object bytes, wall seconds).

    The directory is a fixed function of the key, <tmp>/tfcompile-nvcc-<key[:16]>/kernel.cu:
    nvcc derives the prefix of internal-linkage names (`_INTERNAL_<hash>_9_kernel_cu_...`,
    kept in the library's .rodata) from the source's path, so a random directory would make
    every build differ. Measured: same path + --strip-all -> byte-identical .so."""
    work = Path(tempfile.gettempdir()) / f"tfcompile-nvcc-{key[:16]}"
    with _file_lock(work.with_name(work.name + ".lock")):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            return _run_nvcc(job, tc, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _run_nvcc(job: Job, tc: Toolchain, work: Path) -> tuple[bytes, float]:
    (work / "kernel.cu").write_text(job.source)
    cmd = [tc.nvcc, *nvcc_flags(job.arch), *(f"-I{d}" for d in tc.includes), "-o", "kernel.so", "kernel.cu"]
    t0 = time.perf_counter()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=work)
    except subprocess.TimeoutExpired:
        raise CutlassBuildError(f"nvcc timed out after {TIMEOUT_S} s on {job.name}",
                                hint="check the machine's load and memory (each job needs ~5 GB)") from None
    seconds = time.perf_counter() - t0
    out = work / "kernel.so"
    if res.returncode != 0 or not out.is_file():
        tail = "\n".join((res.stderr or res.stdout).strip().splitlines()[-12:])
        raise CutlassBuildError(f"nvcc failed on {job.name} (exit {res.returncode}):\n{tail}",
                                hint="a template or toolchain bug; emit the sources only with "
                                     "--set emit_cutlass.compile=never and report it")
    return out.read_bytes(), seconds


@contextmanager
def _file_lock(path: Path):
    with open(path, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextmanager
def _slot(root: Path, slots: int, poll_s: float = 0.5):
    """Hold one of `slots` machine-wide build slots (flock'ed files in the cache root)."""
    files = [open(root / f"slot-{i}.lock", "a+") for i in range(slots)]
    try:
        while True:
            for f in files:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                try:
                    yield
                finally:
                    fcntl.flock(f, fcntl.LOCK_UN)
                return
            time.sleep(poll_s)
    finally:
        for f in files:
            f.close()


@contextmanager
def _nothing():
    yield
