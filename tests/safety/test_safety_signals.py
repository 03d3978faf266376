"""Issue 16, case 4: SIGINT and SIGTERM end a run cleanly (exit 130 / 143), remove the staging
dir and GPTQ's spilled Hessians, and never print a traceback (the writer thread included)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from safety_helpers import leftovers

CALIB = ("--set", "calibrate.samples=4", "--set", "calibrate.seq_len=16")


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_while_the_writer_thread_is_busy(sig, code, tiny_llama, tmp_path, paused_run):
    """The writer thread is mid-tensor when the main thread unwinds: it must stop quietly."""
    out = tmp_path / "out"
    run = paused_run("tfcompile.io.writer:ShardWriter._emit", "quantize", tiny_llama, "-o", out,
                     "--format", "nvfp4a16", seconds=2)
    run.wait_paused()
    time.sleep(0.3)  # the main thread has queued everything and waits for the writer
    run.signal(sig)
    rc, stdout, err = run.finish()
    assert rc == code, err
    assert "Traceback" not in err and "IndexError" not in err, err
    assert "Exception in thread" not in err, err
    assert not out.exists() and leftovers(out) == []
    assert stdout == ""


@pytest.mark.parametrize("where,sig,code", [
    ("tfcompile.calibration.sequential:_Spill.put", signal.SIGTERM, 143),  # during calibration
    ("tfcompile.calibration.sequential:_Spill.put", signal.SIGINT, 130),
    ("tfcompile.passes.pack:_stream", signal.SIGTERM, 143),  # after it: GPTQ still reads the spill in pack
])
def test_signal_removes_spilled_hessians(where, sig, code, tiny_llama, tmp_path, paused_run):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    out = tmp_path / "out"
    run = paused_run(where, "quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--algorithm", "gptq",
                     *CALIB, env={"TMPDIR": str(tmpdir)})
    run.wait_paused()
    assert [p.name for p in tmpdir.iterdir() if p.name.startswith("tfcompile-hessians-")], "no spill yet"
    run.signal(sig)
    rc, _, err = run.finish()
    assert rc == code, err
    assert "Traceback" not in err, err
    assert list(tmpdir.iterdir()) == [], list(tmpdir.iterdir())
    assert not out.exists() and leftovers(out) == []


def test_sigterm_message(tiny_llama, tmp_path, paused_run):
    out = tmp_path / "out"
    run = paused_run("tfcompile.passes.pack:copy_aux_files", "quantize", tiny_llama, "-o", out,
                     "--format", "fp8-dynamic")
    run.wait_paused()
    run.signal(signal.SIGTERM)
    rc, _, err = run.finish()
    assert rc == 143
    assert "SIGTERM" in err and "nothing was written" in err, err


def test_stale_hessian_spill_of_a_dead_run_is_removed(tiny_llama, tmp_path, monkeypatch, run_cli):
    import tempfile

    from tfcompile.io import locks

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    me = locks.parse_owner(locks.owner_token())
    stale = tmpdir / f"tfcompile-hessians-h{me.host}-b{me.boot}-p{me.pid}-s{me.start + 1}-xyz"
    stale.mkdir()
    (stale / "layer0.safetensors").write_bytes(b"x" * 100)
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "nvfp4a16", "--algorithm", "gptq",
                  *CALIB)
    assert res.code == 0, res.err
    assert not stale.exists()


def test_writer_thread_stopped_mid_write_raises_nothing():
    """The deque race: stop() clears the queue while the worker writes; it used to popleft() an empty deque."""
    from tfcompile.artifact.sink import _Background

    started, release = threading.Event(), threading.Event()
    errors: list = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args.exc_value)

    def slow(name, tensor):
        started.set()
        release.wait(5)

    try:
        import torch

        bg = _Background(slow, 1 << 20)
        bg.submit("a", torch.zeros(4))
        bg.submit("b", torch.zeros(4))
        assert started.wait(5)
        stopper = threading.Thread(target=bg.stop)
        stopper.start()
        time.sleep(0.1)
        release.set()
        stopper.join(5)
        assert not stopper.is_alive()
    finally:
        threading.excepthook = old_hook
    assert errors == []


def test_a_failure_being_unwound_ignores_signals():
    """Under torchrun a failed rank makes torchrun SIGTERM the others while they report it and remove
    the staging directory (tfcompile/dist/failure.py `supervise` calls `unwinding()`): that signal must
    not cut the report short. Without `unwinding()` the same signal raises Terminated."""
    import os

    from tfcompile.io import signals

    with pytest.raises(signals.Terminated):
        with signals.handle_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs between bytecodes
    with signals.handle_signals():
        signals.unwinding()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
