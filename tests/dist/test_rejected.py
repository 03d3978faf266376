"""A missed --eval gate under torchrun: nothing at OUT, the rejected artifact kept once at
OUT.rejected (rank 0), complete and verifiable, and every rank exits 1 naming it."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

from dist_util import leftovers, run, torchrun

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"


def test_failed_gate_keeps_one_verifiable_rejected_artifact(tmp_path):
    from tfcompile.cli.main import main

    out = tmp_path / "out"
    res = run(torchrun(2, "-m", "tfcompile", "quantize", str(DEMO), "-o", str(out), "-q", "--format", "nvfp4a16",
                       "--set", "pack.max_shard_mb=1",  # several shards: rank 1 writes some of them
                       "--eval", "--eval-max-tokens", "128", "--max-kl", "1e-12"))
    assert res.returncode == 1, res.stderr[-3000:]
    kept = out.with_name("out.rejected")
    assert leftovers(tmp_path, "out") == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out.rejected"]
    for rank in (0, 1):  # each rank's own error: the gate, and the one kept path
        line = next(x for x in res.stderr.splitlines() if x.startswith(f"error: rank {rank} of 2:"))
        assert "quality gate failed" in line and f"kept at {kept}" in line, line
    codes = dict(re.findall(r"rank\s*:\s*(\d) \(local_rank: \d\)\s*\n\s*exitcode\s*:\s*(-?\d+)", res.stderr))
    assert codes == {"0": "1", "1": "1"}, res.stderr[-2000:]  # torchrun's summary: both exited 1
    shards = sorted(p.name for p in kept.glob("model-*.safetensors"))
    assert len(shards) > 1, shards
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["verify", str(kept)]) == 0, err.getvalue()[-2000:]
