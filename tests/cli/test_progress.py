"""Progress of long steps: one plain line per interval off a TTY, a rich bar with ETA on one,
nothing on stdout (so --json stays one document) and nothing at all with -q."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from tfcompile.cli.output import PlainTask, RichReporter

LINE = re.compile(r"^(?P<what>[^:]+): (?P<done>\d+)/(?P<total>\d+) \(\d+%\) \S+ elapsed, eta \S+")
CALIB = ("--calib-samples", "4", "--calib-seq-len", "16", "--set", "calibrate.batch=2")


def _lines(err: str, what: str) -> list[re.Match]:
    return [m for m in map(LINE.match, err.splitlines()) if m and m["what"].startswith(what)]


def test_plain_lines_are_periodic_with_eta():
    t = PlainTask("calibrate 4 layers x 2 batches", 8, interval=10.0, start=0.0, last=0.0)
    got = [t.advance(1, f"layer {i // 2 + 1}/4", now=3.0 * (i + 1)) for i in range(8)]
    assert [g is not None for g in got] == [False, False, False, True, False, False, False, True]
    assert got[3] == "calibrate 4 layers x 2 batches: 4/8 (50%) 12s elapsed, eta 12s  layer 2/4"
    assert got[7].startswith("calibrate 4 layers x 2 batches: 8/8 (100%) 24s elapsed, eta 0s")
    t = PlainTask("pack", 3, interval=10.0, start=0.0, last=0.0)
    assert [t.advance(1, None, now=s) is not None for s in (11.0, 12.0, 13.0)] == [True, False, True]  # + closing
    quiet = PlainTask("x", 3, interval=10.0, start=0.0, last=0.0)
    assert [quiet.advance(1, None, now=1.0) for _ in range(3)] == [None] * 3  # fast step: silent


def test_quantize_off_a_tty_prints_progress_lines_on_stderr_only(tiny_llama, tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_PROGRESS_INTERVAL", "0")
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "nvfp4", "--algorithm", "gptq",
                  "--json", *CALIB)
    assert res.code == 0, res.err
    assert json.loads(res.out)["ok"]  # stdout: exactly the JSON document
    sample = _lines(res.err, "sample 4 x 16 calibration tokens")
    layers = _lines(res.err, "calibrate 2 layers x 2 batches")
    pack = _lines(res.err, "quantize (gptq) + write")
    assert sample and int(sample[-1]["done"]) == int(sample[-1]["total"]) == 15
    assert [int(m["done"]) for m in layers] == [1, 2, 3, 4] and "layer 2/2" in layers[-1].string
    assert pack and pack[-1]["done"] == pack[-1]["total"]
    assert re.search(r"done pack in [\d.]+s \(GPTQ solves [\d.]+s of it, 2 layers\)", res.err)
    assert all(len(m.string) < 200 for m in layers)  # one line each, not wrapped


def test_quiet_prints_no_progress(tiny_llama, tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_PROGRESS_INTERVAL", "0")
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", "nvfp4", "-q", *CALIB)
    assert res.code == 0 and res.out == "" and not _lines(res.err, "")


def test_eval_off_a_tty_reports_batches(tiny_llama, tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("TFCOMPILE_PROGRESS_INTERVAL", "0")
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "-q").code == 0
    text = tmp_path / "t.txt"
    text.write_text("a b c d e f g h i j k l m n o p " * 64)
    res = run_cli("eval", out, "--reference", tiny_llama, "--text", text, "--max-tokens", "256",
                  "--seq-len", "32", "--batch-size", "2", "--json")
    assert res.code == 0, res.err
    assert json.loads(res.out)["metrics"]["tokens"] > 0
    lines = _lines(res.err, "eval 4 batches x 4 layers")  # progress per decoder layer, inside each batch
    assert [int(m["done"]) for m in lines] == list(range(1, 17)) and lines[-1]["total"] == "16"
    assert "batch 1/4, candidate layer 1/2" in lines[0].string and "batch 4/4, reference layer 2/2" in lines[-1].string


@pytest.mark.parametrize("live", [True, False])
def test_reporter_on_a_terminal_draws_a_bar_with_eta(live, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TFCOMPILE_PROGRESS_INTERVAL", "0")
    buf = io.StringIO()
    rep = RichReporter(Console(file=buf, force_terminal=live, width=120))
    rep.task("calibrate 2 layers x 1 batches", 2)
    rep.advance(1, "layer 1/2")
    rep.advance(1, "layer 2/2")
    rep.pass_finished("calibrate", 1.0, {})
    text = buf.getvalue()
    if live:  # rich's live bar (transient): drawn with the elapsed and remaining-time columns
        assert "\x1b[" in text and "eta" in text and "calibrate 2 layers" in text
    else:
        assert "calibrate 2 layers x 1 batches: 2/2 (100%)" in text and "\x1b[" not in text
