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


def _wait_for(path, proc, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_during_start_up(sig, code, tiny_llama, tmp_path):
    """Issue 24 case 8: a signal while `import torch` runs (a second or more) is one line and
    128 + N, never a KeyboardInterrupt traceback from inside the import. The torch found first on
    PYTHONPATH here stands for the real one's slow import: it writes a marker and sleeps."""
    import os
    import subprocess
    import sys

    fake = tmp_path / "slow-imports" / "torch"
    fake.mkdir(parents=True)
    marker = tmp_path / "importing"
    (fake / "__init__.py").write_text(
        "import pathlib, time\n"
        f"pathlib.Path({str(marker)!r}).write_text('x')\n"
        "for _ in range(3000):\n    time.sleep(0.01)\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "tfcompile", "quantize", tiny_llama, "-o", out, "--format",
                             "fp8-dynamic"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _wait_for(marker, proc)
        proc.send_signal(sig)
        stdout, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    # torch loads before the command's handlers (start-up's handler: "... during start-up; nothing
    # was written") or, with the lazy CLI, inside the command (its handler: "...; nothing was written,
    # temporary files were removed"): one line either way
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"interrupted by {signal.Signals(sig).name}"), err
    assert "nothing was written" in lines[0]
    assert stdout == "" and not out.exists() and leftovers(out) == []


@pytest.mark.parametrize("first,code", [(None, 0), (signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signals_while_the_process_exits(first, code, tiny_llama, tmp_path, paused_run):
    """Issue 24 case 8: signals after the command returned (its cleanup done, interpreter shutdown
    running atexit hooks, as torch's finalizers do) leave the command's exit status and print no
    traceback; they used to raise KeyboardInterrupt in an atexit hook or kill the process
    (-15 instead of 143, or instead of 0 after a complete run)."""
    out = tmp_path / "out"
    exiting = tmp_path / "exiting"
    run = paused_run("tfcompile.passes.pack:copy_aux_files", "quantize", tiny_llama, "-o", out,
                     "--format", "fp8-dynamic", "-q", seconds=0 if first is None else 60,
                     env={"PAUSED_RUN_ATEXIT": str(exiting)})
    run.wait_paused()
    if first is not None:
        run.signal(first)
    _wait_for(exiting, run.proc)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        run.signal(sig)
        time.sleep(0.05)
    rc, _, err = run.finish()
    assert rc == code, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if first is None:
        assert (out / "tfcompile" / "manifest.json").is_file()
    else:
        assert err.count("interrupted by") == 1 and signal.Signals(first).name in err, err
        assert not out.exists() and leftovers(out) == []
