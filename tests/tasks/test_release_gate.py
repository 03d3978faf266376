"""`quantize --eval` as a release gate: a missed task gate exits 1, publishes nothing at OUT, writes
the failed case to JUnit, and keeps a complete artifact at OUT.rejected that `verify` accepts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conftest import DEMO  # noqa: E402

EVAL = ("--eval", "--eval-tokens", "256", "--set", "eval.seq_len=128")


def test_missed_task_gate_keeps_a_verifiable_rejected_artifact(run_cli, cloze_yaml, tmp_path):
    out, junit = tmp_path / "demo-nvfp4", tmp_path / "gates.xml"
    # a drop limit below zero: no artifact can meet it (the drop is >= 0 unless the artifact is better)
    r = run_cli("quantize", DEMO, "-o", out, "--format", "nvfp4a16", *EVAL, "--task", cloze_yaml, "--limit", "10",
                "--max-task-drop", "-50", "--max-kl", "1", "--junit", junit, "--json")
    assert r.code == 1, r.err
    rejected = tmp_path / "demo-nvfp4.rejected"
    assert not out.exists() and rejected.is_dir()
    doc = r.json()
    assert doc["ok"] is False and doc["output"] is None and doc["rejected"] == str(rejected)
    [task] = doc["eval"]["tasks"]
    assert (task["task"], task["metric"], task["threshold"], task["passed"]) == ("pydoc_cloze", "acc", -50, False)
    assert task["drop"] == pytest.approx(task["reference"] - task["candidate"], abs=1e-3)
    # the worst layers: five, lowest output SQNR first, as the per-layer rows of `tfcompile eval` give them
    worst = doc["eval"]["worst_layers"]
    assert len(worst) == 5 and [w["sqnr_db"] for w in worst] == sorted(w["sqnr_db"] for w in worst)
    assert f"rejected artifact is kept at {rejected}" in doc["error"]
    # JUnit: one case per gate, the task gate failed with its measured drop and limit
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
    kl, tg = suite.findall("testcase")
    assert kl.find("failure") is None and tg.find("failure").get("message").startswith(
        f"--max-task-drop: pydoc_cloze acc dropped {task['drop']:.4g} points > -50")
    # complete and verifiable; its manifest records the failed gates
    v = run_cli("verify", rejected, "--json")
    assert v.code == 0, v.out
    manifest = json.loads((rejected / "tfcompile" / "manifest.json").read_text())
    assert manifest["eval"]["ok"] is False and manifest["eval"]["tasks"] == doc["eval"]["tasks"]
    # the report shows the task table and the worst layers
    html = tmp_path / "report.html"
    assert run_cli("report", rejected, "-o", html).code == 0
    page = html.read_text()
    assert '<h2 id="tasks">' in page and "<td>pydoc_cloze</td><td>acc</td>" in page and "FAIL" in page
    assert f"<code>{worst[0]['module']}</code>" in page
    ev = run_cli("eval", rejected, "--reference", DEMO, "--max-tokens", "256", "--seq-len", "128", "--json")
    assert ev.code == 0 and ev.json()["metrics"]["kl_mean"] == pytest.approx(doc["eval"]["metrics"]["kl_mean"],
                                                                              rel=1e-5)


def test_no_keep_rejected_leaves_nothing(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = tmp_path / "demo"
    r = run_cli("quantize", DEMO, "-o", out, "--format", "nvfp4a16", *EVAL, "--max-kl", "0", "--no-keep-rejected")
    assert r.code == 1
    assert "--max-kl: kl_mean" in r.err and "hint: the worst layers by output SQNR: model.layers." in r.err
    assert "--ignore 'model.layers." in r.err and "kept at" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
