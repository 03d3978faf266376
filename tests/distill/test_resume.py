"""Resume is exact: a run interrupted at step k (Ctrl-C, or killed between checkpoints) and
resumed writes the same artifact, byte for byte, as an uninterrupted run with the same seed."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from tfcompile.distill import train


def digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def args(tiny_llama_src, fast):
    return ["distill", tiny_llama_src, "--format", "nvfp4a16", *fast, "--steps", "6",
            "--set", "distill.checkpoint_every=2", "--set", "distill.lr=3e-4"]


@pytest.fixture(scope="module")
def uninterrupted(args, tmp_path_factory):
    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("plain") / "out"
    assert main([str(a) for a in args] + ["-o", str(out), "-q"]) == 0
    return digest(out)


def _interrupt_at(monkeypatch, k: int, how: str):
    def after_step(self, step):
        if step != k:
            return
        if how == "kill":
            raise RuntimeError("killed")  # dies between checkpoints: nothing saved for this step
        if threading.current_thread() is threading.main_thread():
            # the real Ctrl-C / SIGTERM path: handler, checkpoint at the step boundary, stop
            os.kill(os.getpid(), signal.SIGTERM if how == "sigterm" else signal.SIGINT)
        else:
            self._stop = True

    monkeypatch.setattr(train.Loop, "after_step", after_step)


@pytest.mark.parametrize("how,k,saved", [pytest.param("ctrl-c", 3, 3, marks=pytest.mark.slow), ("sigterm", 3, 3),
                                         ("kill", 3, 2)])
def test_resume_is_bit_identical(how, k, saved, args, uninterrupted, tmp_path, run_cli, monkeypatch):
    out, resume = tmp_path / "out", tmp_path / "resume"
    cmd = [*args, "-o", out, "--resume-dir", resume, "--json"]
    _interrupt_at(monkeypatch, k, how)
    res = run_cli(*cmd)
    assert res.code == {"ctrl-c": 130, "sigterm": 143, "kill": 2}[how], res.err
    assert how == "kill" or "Traceback" not in res.err
    assert not out.exists()  # nothing published
    monkeypatch.undo()
    import torch

    assert torch.load(resume / "state.pt", weights_only=True)["step"] == saved
    res = run_cli(*cmd)
    assert res.code == 0, res.err
    assert res.json()["passes"]["distill"]["resumed_at"] == saved
    assert digest(out) == uninterrupted
    steps = [json.loads(x)["step"] for x in (resume / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # lines past the checkpoint were dropped, none repeated
    # a finished run resumes to the end at once and writes the same bytes again
    res = run_cli(*cmd, "--overwrite")
    assert res.code == 0 and res.json()["passes"]["distill"]["resumed_at"] == 6
    assert digest(out) == uninterrupted


def test_resume_dir_of_another_run_is_refused(args, tmp_path, run_cli):
    resume = tmp_path / "resume"
    (resume).mkdir()
    (resume / "run.json").write_text(json.dumps({"recipe": "something else"}))
    res = run_cli(*args, "-o", tmp_path / "out", "--resume-dir", resume)
    assert res.code == 1 and "another run" in res.err and "hint:" in res.err


@pytest.mark.slow
def test_layerwise_resume_is_bit_identical(tiny_llama_src, fast, tmp_path, run_cli, monkeypatch):
    """Block-wise, one model made the student layer by layer: interrupted in layer 1 (step 3 of
    2 x 2), the resumed run rebuilds layer 0 from the checkpoint and the streams from it."""
    cmd = ["distill", tiny_llama_src, "--format", "mxfp4", *fast, "--steps", "2", "--mode", "layerwise",
           "--set", "distill.layer_samples=4", "--set", "distill.heldout_tokens=0", "--set", "distill.lr=1e-3"]
    assert run_cli(*cmd, "-o", tmp_path / "plain").code == 0
    out, resume = tmp_path / "out", tmp_path / "resume"
    _interrupt_at(monkeypatch, 3, "ctrl-c")
    assert run_cli(*cmd, "-o", out, "--resume-dir", resume).code == 130
    monkeypatch.undo()
    res = run_cli(*cmd, "-o", out, "--resume-dir", resume, "--json")
    assert res.code == 0, res.err
    assert res.json()["passes"]["distill"]["resumed_at"] == 3
    assert digest(out) == digest(tmp_path / "plain")
