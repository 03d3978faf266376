"""Issue 24, case 10 (last part): the working dirs of a run killed by SIGKILL (GPTQ's Hessian
spill in $TMPDIR, rotate's and distill's copies beside OUT) are removed by the next run of any
kind, owner-checked: a live run's dirs and dirs without an owner token are kept."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tfcompile.io.locks import WORK_PREFIXES, owner_token


def _dead_token() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return owner_token(proc.pid)  # that pid has exited: its owner is dead


@pytest.mark.parametrize("kind", ["fp8-dynamic", "until-select"])
def test_a_later_run_of_another_kind_removes_dead_runs_working_dirs(kind, tiny_llama, tmp_path, run_cli,
                                                                      monkeypatch):
    import tempfile

    tmpdir, outs = tmp_path / "tmp", tmp_path / "outs"
    tmpdir.mkdir()
    outs.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)
    dead, alive = _dead_token(), owner_token()
    stale, kept = [], []
    for prefix in WORK_PREFIXES:
        for parent in (tmpdir, outs):
            (parent / f"{prefix}{dead}-x1").mkdir()
            (parent / f"{prefix}{dead}-x1" / "model.safetensors").write_bytes(b"\0" * 1024)
            stale.append(parent / f"{prefix}{dead}-x1")
            for name in (f"{prefix}{alive}-x2", f"{prefix}notatoken"):
                (parent / name).mkdir()
                kept.append(parent / name)
    args = ["quantize", tiny_llama, "-o", outs / "o", "--format", "fp8-dynamic", "-q"]
    if kind == "until-select":
        args += ["--until", "select"]  # no artifact, no OUT: $TMPDIR is still swept
        stale = [p for p in stale if p.parent == tmpdir]
    res = run_cli(*args)
    assert res.code == 0, res.err
    assert [p for p in stale if p.exists()] == []
    assert all(p.exists() for p in kept)
