"""Two torchrun "nodes" on one machine (c10d rendezvous over loopback, --node-rank 0 and 1),
one process each, write the one-process artifact byte for byte (calibrated nvfp4)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from dist_util import TIMEOUT_S, free_port, torchrun, tree

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
ARGS = ["--format", "nvfp4", "--calib", "random", "--calib-samples", "3", "--calib-seq-len", "16",
        "--set", "calibrate.batch=1", "--set", "pack.max_shard_mb=1", "-q"]


def test_two_nodes_over_loopback(tmp_path, run_cli):
    assert run_cli("quantize", DEMO, "-o", tmp_path / "one", *ARGS).code == 0
    endpoint = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if k != "TFCOMPILE_FAULT"}
    nodes = [subprocess.Popen(torchrun(1, "-m", "tfcompile", "quantize", str(DEMO), "-o", str(tmp_path / "two"),
                                       *ARGS, nnodes=2, node_rank=r, endpoint=endpoint),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) for r in (0, 1)]
    results = [(p.wait(TIMEOUT_S), p.stderr.read()) for p in nodes]
    assert all(code == 0 for code, _ in results), [err[-2000:] for _, err in results]
    assert tree(tmp_path / "two") == tree(tmp_path / "one")
