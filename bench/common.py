"""Helpers shared by the bench scripts: timed subprocesses, machine facts, docs sections.

Nothing here imports tfcompile, so a bench can measure the installed CLI as a
user runs it (a fresh process per run).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "performance.md"
GNU_TIME = "/usr/bin/time"
# Held-out tokens every docs/accuracy.md section is scored on (the demo LM's held-out perplexity
# set, docs/accuracy.md "Demo LM"). 16,384 tokens (the first two documents of the split) were
# too few: there round-to-nearest W4A4 nvfp4 scored a perplexity 0.4% *below* bf16's, on 65,536
# tokens 0.5% above it.
EVAL_TOKENS = 65536


@dataclass(frozen=True)
class Timed:
    """One run of a command under GNU time -v."""

    argv: tuple[str, ...]
    wall_s: float  # measured here (perf_counter around the process); time -v agrees to ~10 ms
    max_rss_kib: int  # "Maximum resident set size (kbytes)"
    user_s: float
    sys_s: float
    major_faults: int
    minor_faults: int
    rc: int
    stderr_tail: str  # the command's own stderr, time -v's report removed

    @property
    def max_rss_bytes(self) -> int:
        return self.max_rss_kib * 1024


_TIME_FIELDS = {
    "max_rss_kib": r"Maximum resident set size \(kbytes\): (\d+)",
    "user_s": r"User time \(seconds\): ([\d.]+)",
    "sys_s": r"System time \(seconds\): ([\d.]+)",
    "major_faults": r"Major \(requiring I/O\) page faults: (\d+)",
    "minor_faults": r"Minor \(reclaiming a frame\) page faults: (\d+)",
}


def require_gnu_time() -> None:
    """GNU time (Debian package `time`) gives peak RSS; bash's builtin `time` does not."""
    if not os.access(GNU_TIME, os.X_OK):
        sys.exit(f"error: {GNU_TIME} not found\nhint: apt-get update && apt-get install -y time")


def run_timed(argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None,
              stdout: Path | None = None) -> Timed:
    """Run argv under `/usr/bin/time -v`; wall time is measured around the whole process.
    The command's stdout goes to `stdout` (a file) or is discarded."""
    with open(stdout or os.devnull, "wb") as sink:
        t0 = time.perf_counter()
        p = subprocess.run([GNU_TIME, "-v", *argv], stdout=sink, stderr=subprocess.PIPE, env=env, cwd=cwd)
        wall = time.perf_counter() - t0
    err = p.stderr.decode(errors="replace")
    cut = err.rfind("\tCommand being timed:")
    report, own = (err[cut:], err[:cut]) if cut >= 0 else ("", err)
    vals = {}
    for key, rx in _TIME_FIELDS.items():
        m = re.search(rx, report)
        vals[key] = (float if key.endswith("_s") else int)(m.group(1)) if m else 0
    return Timed(tuple(argv), wall, vals["max_rss_kib"], vals["user_s"], vals["sys_s"], vals["major_faults"],
                 vals["minor_faults"], p.returncode, own[-4000:])


def cpu_busy(interval: float = 1.0) -> float:
    """Cores busy over `interval` seconds, machine-wide (other users' load when we are idle)."""

    def sample():
        f = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = f[3] + (f[4] if len(f) > 4 else 0)  # idle + iowait
        return sum(f[:8]) - idle, sum(f[:8])

    b0, t0 = sample()
    time.sleep(interval)
    b1, t1 = sample()
    return (b1 - b0) / max(t1 - t0, 1) * (os.cpu_count() or 1)


def wait_idle(max_wait_s: float, threshold: float = 0.2) -> float:
    """Wait (up to max_wait_s) until other processes use < `threshold` cores; returns the last reading.

    On a shared machine, other jobs (test suites, other benches) inflate wall
    times several fold; a run started on a busy machine is flagged, not hidden.
    """
    deadline = time.monotonic() + max_wait_s
    busy = cpu_busy()
    while busy >= threshold and time.monotonic() < deadline:
        time.sleep(2.0)
        busy = cpu_busy()
    return busy


def _spin(n: int) -> None:
    x = 0
    for i in range(n):
        x += i


def cpu_scaling(n: int = 10_000_000) -> float:
    """Throughput of 2 concurrent CPU-bound processes relative to 1 (2.0 = two real cores).

    Small VMs often expose 2 vCPUs that deliver ~1 core of throughput; then
    nothing gains from threads, and wall time ~= total CPU time.
    """
    import multiprocessing as mp

    t0 = time.perf_counter()
    _spin(n)
    one = time.perf_counter() - t0
    ps = [mp.get_context("fork").Process(target=_spin, args=(n,)) for _ in range(2)]
    t0 = time.perf_counter()
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    two = time.perf_counter() - t0
    return 2 * one / two


def git_revision() -> str:
    """HEAD, plus "-dirty" when tracked files other than docs/performance.md (which benches write) differ."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                  ":!docs/performance.md"], cwd=REPO, capture_output=True, text=True,
                                 check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if changed else "")


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def fmt_bytes(n: float) -> str:
    """Decimal units (GB = 1e9), as in the acceptance criteria."""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def machine_description() -> dict[str, str]:
    """CPU model, cores, RAM, OS, Python, torch version and today's date."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    except OSError:
        pass
    try:
        import torch

        torch_v, capability = torch.__version__, torch.backends.cpu.get_cpu_capability()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        torch_v, capability = "not installed", "?"
    return {
        "cpu": cpu,
        "nproc": str(os.cpu_count()),
        "ram": ram,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch_v,
        "capability": capability,  # torch.backends.cpu.get_cpu_capability(): AVX2, AVX512, ...
        "date": _dt.date.today().isoformat(),
    }


def machine_line(m: dict[str, str] | None = None) -> str:
    m = m or machine_description()
    cap = f", get_cpu_capability() {m['capability']}" if m.get("capability") else ""  # older saved results lack it
    return (f"{m['cpu']}, {m['nproc']} cores (nproc){cap}, {m['ram']} RAM, {m['os']}, "
            f"Python {m['python']}, torch {m['torch']}, {m['date']}")


def disk_free(path: Path) -> int:
    return shutil.disk_usage(path).free


def replace_doc_section(heading: str, body: str, path: Path = DOCS) -> Path:
    """Put `heading` + `body` into `path`, replacing only that `## ` section.

    Other sections (written by other benches) are left byte for byte. A
    missing file is created with the `# Performance` title; a missing section
    is appended at the end.
    """
    section = f"{heading}\n\n{body.strip()}\n"
    text = path.read_text() if path.exists() else "# Performance\n"
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.rstrip() == heading), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section
    else:
        end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
        tail = "".join(lines[end:])
        new = "".join(lines[:start]) + section + ("\n" + tail if tail else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)
    return path
