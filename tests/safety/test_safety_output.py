"""Issue 16, cases 1 and 2 (and the last of 5): OUT never destroys the source, the current
directory or anything a concurrent writer made; two runs on one OUT exclude each other;
temp dirs of dead runs and parents made by a failed run do not stay behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path

import pytest

from safety_helpers import assert_clean_failure, leftovers, tree_digest

FMT = ("--format", "fp8-dynamic")


# ---- case 1: --overwrite never deletes the source, an ancestor of it, or the current directory

def test_out_is_model_refused(tiny_llama, run_cli):
    before = tree_digest(tiny_llama)
    res = run_cli("quantize", tiny_llama, "-o", tiny_llama, "--overwrite", *FMT)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "is the model directory" in res.err and "hint: " in res.err
    assert tree_digest(tiny_llama) == before


def test_out_is_model_through_symlink_refused(tiny_llama, tmp_path, run_cli):
    link = tmp_path / "alias"
    link.symlink_to(tiny_llama)
    before = tree_digest(tiny_llama)
    res = run_cli("quantize", tiny_llama, "-o", link, "--overwrite", *FMT)
    assert res.code == 1 and "is the model directory" in res.err, res.err
    assert tree_digest(tiny_llama) == before and link.is_symlink()


def test_out_ancestor_of_model_refused(tiny_llama, tmp_path, run_cli):
    (tmp_path / "precious.txt").write_text("keep me")
    before = tree_digest(tmp_path)
    res = run_cli("quantize", tiny_llama, "-o", tmp_path, "--overwrite", *FMT)
    assert res.code == 1 and "contains the model directory" in res.err, res.err
    assert tree_digest(tmp_path) == before


def test_out_existing_dir_inside_model_refused(tiny_llama, run_cli):
    sub = tiny_llama / "original"
    sub.mkdir()
    (sub / "consolidated.00.pth").write_bytes(b"weights the user keeps")
    before = tree_digest(tiny_llama)
    res = run_cli("quantize", tiny_llama, "-o", sub, "--overwrite", *FMT)
    assert res.code == 1 and "inside the model directory" in res.err, res.err
    assert tree_digest(tiny_llama) == before


def test_out_containing_hf_cache_blobs_refused(tiny_llama, tmp_path, run_cli):
    """A Hugging Face cache snapshot's files are links into <repo>/blobs: OUT=blobs would delete them."""
    repo = tmp_path / "models--org--tiny"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in tiny_llama.iterdir():
        shutil.copy(f, blobs / f.name)
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    before = tree_digest(blobs)
    res = run_cli("quantize", snap, "-o", blobs, "--overwrite", *FMT)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "model" in res.err and "hint: " in res.err
    assert tree_digest(blobs) == before


@pytest.mark.parametrize("out", ["", ".", "./"])
def test_out_current_directory_refused(tiny_llama, tmp_path, run_cli, monkeypatch, out):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("my notes")
    monkeypatch.chdir(work)
    res = run_cli("quantize", tiny_llama, "-o", out, "--overwrite", *FMT)
    assert res.code == 1 and "current directory" in res.err, res.err
    assert (work / "notes.txt").read_text() == "my notes"
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]


def test_out_ancestor_of_current_directory_refused(tiny_llama, tmp_path, run_cli, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    (tmp_path / "a" / "keep.txt").write_text("x")
    monkeypatch.chdir(work)
    res = run_cli("quantize", tiny_llama, "-o", "..", "--overwrite", *FMT)
    assert res.code == 1 and "current directory" in res.err, res.err
    assert (tmp_path / "a" / "keep.txt").exists() and work.is_dir()


# ---- case 2: concurrent runs and an OUT that appears during the run

def test_second_concurrent_run_refused_at_start(tiny_llama, tmp_path, run_cli, paused_run):
    out = tmp_path / "out"
    first = paused_run("tfcompile.passes.pack:copy_aux_files", "quantize", tiny_llama, "-o", out, *FMT)
    first.wait_paused()
    res = run_cli("quantize", tiny_llama, "-o", out, "--overwrite", *FMT)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "another tfcompile run" in res.err and str(first.proc.pid) in res.err
    assert socket.gethostname() in res.err and "hint: " in res.err
    first.signal(signal.SIGTERM)
    code, _, err = first.finish()
    assert code == 143, err
    assert not out.exists() and leftovers(out) == []


def test_runs_on_the_same_out_in_sequence_both_succeed(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, *FMT).code == 0
    res = run_cli("quantize", tiny_llama, "-o", out, "--overwrite", *FMT)
    assert res.code == 0, res.err
    assert leftovers(out) == []  # the lock file is gone too


@pytest.mark.parametrize("what", ["dir-with-file", "empty-dir", "file"])
def test_out_appearing_during_run_is_kept(tiny_llama, tmp_path, run_cli, monkeypatch, what):
    """Without --overwrite, an OUT made by someone else mid-run is left untouched and the run fails."""
    from tfcompile.pipeline import manager

    out = tmp_path / "out"
    real = manager.run

    def run_then_create(*args, **kwargs):
        ctx = real(*args, **kwargs)
        if what == "file":
            out.write_text("someone else's file")
        else:
            out.mkdir()
            if what == "dir-with-file":
                (out / "theirs.txt").write_text("someone else's data")
        return ctx

    monkeypatch.setattr(manager, "run", run_then_create)
    res = run_cli("quantize", tiny_llama, "-o", out, *FMT)
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "appeared" in res.err and "hint: " in res.err
    if what == "file":
        assert out.read_text() == "someone else's file"
    elif what == "dir-with-file":
        assert (out / "theirs.txt").read_text() == "someone else's data"
        assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    else:
        assert out.is_dir() and not any(out.iterdir())
    assert leftovers(out) == []


def test_overwrite_refuses_an_out_replaced_during_run(tiny_llama, tmp_path, run_cli, monkeypatch):
    """--overwrite replaces the OUT that existed at the start, not a different one made meanwhile."""
    from tfcompile.pipeline import manager

    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old artifact")
    real = manager.run

    def run_then_replace(*args, **kwargs):
        ctx = real(*args, **kwargs)
        shutil.rmtree(out)
        out.mkdir()
        (out / "new-owner.txt").write_text("someone else's data")
        return ctx

    monkeypatch.setattr(manager, "run", run_then_replace)
    res = run_cli("quantize", tiny_llama, "-o", out, "--overwrite", *FMT)
    assert res.code == 1 and "appeared" in res.err, res.err
    assert (out / "new-owner.txt").read_text() == "someone else's data"
    assert leftovers(out) == []


def test_overwrite_replaces_atomically(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old artifact")
    res = run_cli("quantize", tiny_llama, "-o", out, "--overwrite", *FMT)
    assert res.code == 0, res.err
    assert not (out / "old.txt").exists() and (out / "tfcompile" / "manifest.json").is_file()
    assert leftovers(out) == []


# ---- case 4 (last sentence) / build list: temp dirs of dead runs are removed by the next run

def test_stale_temp_dir_after_sigkill_is_removed_by_next_run(tiny_llama, tmp_path, run_cli, paused_run):
    out = tmp_path / "out"
    first = paused_run("tfcompile.passes.pack:copy_aux_files", "quantize", tiny_llama, "-o", out, *FMT)
    first.wait_paused()
    first.kill()  # SIGKILL: no cleanup can run
    stale = [n for n in leftovers(out) if ".tmp-" in n]
    assert stale, leftovers(out)
    res = run_cli("quantize", tiny_llama, "-o", out, *FMT)
    assert res.code == 0, res.err
    assert leftovers(out) == []


def test_temp_dir_of_a_live_run_is_not_touched(tmp_path):
    """Liveness is judged by host, boot, pid and the process start time (pid reuse)."""
    from tfcompile.io import locks

    out = tmp_path / "out"
    mine = locks.owner_token()
    live = tmp_path / f".out.tmp-{mine}-abc"
    other_pid = tmp_path / f".out.tmp-{locks.owner_token(pid=os.getppid())}-abc"
    live.mkdir()
    other_pid.mkdir()
    me = locks.parse_owner(mine)
    reused = tmp_path / f".out.tmp-h{me.host}-b{me.boot}-p{os.getpid()}-s{me.start + 1}-abc"  # same pid, other start
    dead = tmp_path / f".out.tmp-h{me.host}-b{me.boot}-p{_dead_pid()}-s1-abc"
    rebooted = tmp_path / f".out.tmp-h{me.host}-b{'0' * 8 if me.boot != '0' * 8 else '1' * 8}-p{os.getpid()}-s{me.start}-abc"
    foreign = tmp_path / f".out.tmp-h{'f' * 8 if me.host != 'f' * 8 else 'e' * 8}-b{me.boot}-p1-s1-abc"
    for d in (reused, dead, rebooted, foreign):
        d.mkdir()
    notes = locks.sweep_stale(out)
    assert live.is_dir() and other_pid.is_dir()  # this process, and its live parent
    assert not reused.exists() and not dead.exists() and not rebooted.exists()
    assert foreign.is_dir()  # another host: liveness unknown, kept and reported
    assert any(foreign.name in n and "another host" in n for n in notes)


def _dead_pid() -> int:
    pid = 2 ** 22 - 7
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_lock_records_host_pid_and_start(tmp_path):
    from tfcompile.errors import UserError
    from tfcompile.io import locks

    out = tmp_path / "out"
    with locks.output_lock(out):
        info = json.loads((tmp_path / ".out.lock").read_text())
        assert info["pid"] == os.getpid() and info["host"] == socket.gethostname() and info["start"]
        with pytest.raises(UserError) as e:
            with locks.output_lock(out):
                pass
        assert f"pid {os.getpid()}" in e.value.message
    assert not (tmp_path / ".out.lock").exists()


# ---- case 5 (last item): a failed run leaves no parent directory behind

def test_failed_run_removes_the_parents_it_created(tiny_llama, tmp_path, run_cli):
    (tiny_llama / "config.json").write_text("{not json")
    out = tmp_path / "a" / "b" / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, *FMT)
    assert_clean_failure(res, out, "config.json")
    assert not (tmp_path / "a").exists()


def test_successful_run_keeps_the_parents_it_created(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "a" / "b" / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, *FMT).code == 0
    assert (out / "tfcompile" / "manifest.json").is_file()
