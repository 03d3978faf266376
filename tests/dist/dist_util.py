"""Helpers for the torchrun tests: launch commands, compare artifact trees byte for byte."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args: str, nnodes: int = 1, node_rank: int = 0, endpoint: str | None = None,
             env: dict | None = None) -> list[str]:
    """The torchrun command line: one node on a free local port, or node `node_rank` of `nnodes`
    meeting at `endpoint` (c10d rendezvous)."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}"]
    if nnodes == 1:
        run += ["--standalone"]
    else:
        run += [f"--nnodes={nnodes}", f"--node-rank={node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={endpoint}", "--rdzv-id=tfcompile-test"]
    return run + list(args)


def run(cmd: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full.pop("TFCOMPILE_FAULT", None)  # only a test that asks for a fault gets one
    full.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=cwd, timeout=TIMEOUT_S)


def run_matrix(nproc: int, jobs: list[tuple[list[str], Path | None]], tmp: Path) -> subprocess.CompletedProcess:
    """jobs: (argv, file for its stdout or None), run in order under one torchrun launch."""
    spec = tmp / f"jobs-{nproc}.json"
    spec.write_text(json.dumps([{"argv": [str(a) for a in argv], "stdout": str(out) if out else None}
                                for argv, out in jobs]))
    return run(torchrun(nproc, str(HERE / "run_matrix.py"), str(spec)))


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (hidden ones too), relative path -> bytes."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(Path(path).rglob("*")) if p.is_file()}


def leftovers(parent: Path, name: str) -> list[str]:
    """Anything at or beside the output path that a run could have left (OUT, .OUT.tmp-*)."""
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))
