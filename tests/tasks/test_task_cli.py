"""`tfcompile eval --task`: task gates in --json, the tasks table, JUnit, and lm-eval as an optional extra."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


from conftest import DEMO  # noqa: E402

EVAL = ("--max-tokens", "256", "--seq-len", "128", "--limit", "12")


def test_without_lm_eval_task_is_a_user_error_naming_the_extra(run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # import lm_eval now raises ImportError
    r = run_cli("eval", DEMO, "--reference", DEMO, "--task", "pydoc-cloze")
    assert r.code == 1, r.err
    assert "error:" in r.err and "lm-evaluation-harness" in r.err
    assert "hint:" in r.err and "pip install 'tfcompile[eval]'" in r.err


def test_task_options_need_task(run_cli):
    r = run_cli("eval", DEMO, "--reference", DEMO, "--max-task-drop", "1")
    assert r.code == 2 and "--max-task-drop and --limit need --task" in r.err


def test_missing_task_yaml_is_a_user_error(run_cli, tmp_path):
    r = run_cli("eval", DEMO, "--reference", DEMO, "--task", tmp_path / "nope.yaml")
    assert r.code == 1 and "no such task YAML" in r.err and "hint:" in r.err


def test_task_gate_json_table_and_junit(run_cli, cloze_yaml, tmp_path):
    """The checkpoint against itself: drop 0 passes --max-task-drop 0; a limit below zero fails
    (exit 1) with the measured drop and the limit in the error and in the JUnit failure."""
    junit = tmp_path / "gates.xml"
    r = run_cli("eval", DEMO, "--reference", DEMO, *EVAL, "--task", cloze_yaml, "--max-task-drop", "0",
                "--max-kl", "0.001", "--junit", junit, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    [t] = doc["tasks"]
    assert set(t) >= {"task", "metric", "reference", "candidate", "drop", "passed"}
    assert (t["task"], t["metric"], t["drop"], t["passed"]) == ("pydoc_cloze", "acc", 0.0, True)
    assert t["reference"] == t["candidate"] and 0 <= t["reference"] <= 100
    assert {"row": "task pydoc_cloze", "value": f"pass acc {t['candidate']:.2f} (reference "
            f"{t['reference']:.2f}, drop 0.00 points)"} in doc["table"]
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0")

    r = run_cli("eval", DEMO, "--reference", DEMO, *EVAL, "--task", cloze_yaml, "--max-task-drop", "-5",
                "--junit", junit)
    assert r.code == 1
    assert "--max-task-drop: pydoc_cloze acc dropped 0 points > -5" in r.err and "hint:" in r.err
    cases = ET.parse(junit).getroot().find("testsuite").findall("testcase")
    [failure] = cases[0].findall("failure")
    assert "dropped 0 points > -5" in failure.get("message")


def test_quantize_usage_errors(run_cli, tmp_path):
    r = run_cli("quantize", DEMO, "-o", tmp_path / "o", "--junit", tmp_path / "j.xml")
    assert r.code == 2 and "--junit needs --eval" in r.err
    r = run_cli("quantize", DEMO, "-o", tmp_path / "o", "--eval", "--limit", "5")
    assert r.code == 2 and "--max-task-drop and --limit need --task" in r.err
    assert not (tmp_path / "o").exists()
