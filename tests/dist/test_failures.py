"""A rank that raises, or is killed, fails the whole run: exit 1, the rank and pass named,
nothing at (or beside) the output path. Faults come from the TFCOMPILE_FAULT testing knob
(tfcompile/dist/failure.py), through the real entry point: torchrun -m tfcompile."""

from __future__ import annotations

from pathlib import Path

import pytest

from dist_util import leftovers, run, torchrun

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
CALIB = ["--calib", "random", "--calib-samples", "4", "--calib-seq-len", "16", "--set", "calibrate.batch=1"]


@pytest.mark.parametrize("how, pass_name, fmt", [("raise", "calibrate", ["--format", "nvfp4", *CALIB]),
                                                 ("kill", "pack", ["--format", "nvfp4a16"])])
def test_failed_rank_fails_the_run_and_leaves_nothing(how, pass_name, fmt, tmp_path):
    out = tmp_path / "out"
    res = run(torchrun(2, "-m", "tfcompile", "quantize", str(DEMO), "-o", str(out), "-q", *fmt),
              env={"TFCOMPILE_FAULT": f"1:{pass_name}:{how}"})
    assert res.returncode == 1, res.stderr[-3000:]
    assert leftovers(tmp_path, "out") == []
    survivor = next(line for line in res.stderr.splitlines() if line.startswith("error: rank 0 of 2 stopped"))
    assert f"rank 1" in survivor and f"'{pass_name}'" in survivor, survivor
    if how == "raise":  # the failing rank prints its own error, and the survivor quotes it
        assert f"error: rank 1 of 2: pass '{pass_name}' failed: RuntimeError: fault injected" in res.stderr
        assert "fault injected" in survivor
    else:  # SIGKILL leaves no record: the survivor says the rank stopped responding
        assert "stopped responding" in survivor
