"""Task-gate entries, the worst-layers rows and the JUnit document, on hand-computed numbers."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tfcompile.evaluate.gates import gate_error, worst_layers
from tfcompile.evaluate.junit import junit_xml
from tfcompile.tasks.gate import gate_entries


def test_points_drop_and_pass():
    ref = {"a": {"metric": "acc", "value": 0.52, "higher_is_better": True, "samples": 100},
           "p": {"metric": "word_perplexity", "value": 10.0, "higher_is_better": False, "samples": 8}}
    cand = {"a": {"metric": "acc", "value": 0.45, "higher_is_better": True, "samples": 100},
            "p": {"metric": "word_perplexity", "value": 12.5, "higher_is_better": False, "samples": 8}}
    a, p = gate_entries(ref, cand, max_drop=5.0)
    assert (a["reference"], a["candidate"], a["drop"], a["passed"]) == (52.0, 45.0, 7.0, False)  # fractions -> points
    assert (p["reference"], p["candidate"], p["drop"], p["passed"]) == (10.0, 12.5, 2.5, True)  # lower is better
    assert all(e["passed"] for e in gate_entries(ref, cand, max_drop=None))  # no limit: reported, not gated


def test_worst_layers_and_noise_share():
    layers = [{"module": "m.b", "sqnr_db": 20.0, "e2e_sqnr_db": 18.0}, {"module": "m.none", "sqnr_db": None},
              {"module": "m.a", "sqnr_db": 10.0, "e2e_sqnr_db": 9.0}, {"module": "m.c", "sqnr_db": 30.0}]
    rows = worst_layers(layers, n=2)
    assert [r["module"] for r in rows] == ["m.a", "m.b"]  # lowest SQNR first; None (no error) never listed
    # relative noise powers 0.1, 0.01, 0.001 of a total 0.111
    assert [r["noise_share"] for r in rows] == [pytest.approx(0.9009, abs=1e-4), pytest.approx(0.0901, abs=1e-4)]
    err = gate_error([], [{"task": "t", "metric": "acc", "reference": 52.0, "candidate": 45.0, "drop": 7.0,
                           "threshold": 5.0, "passed": False}], layers)
    assert "--max-task-drop: t acc dropped 7 points > 5 (reference 52, candidate 45)" in err.message
    assert "--ignore 'm.a' --ignore 'm.b' --ignore 'm.c'" in err.hint and "m.a (10.0 dB, ~90% of" in err.hint


def test_junit_document():
    gates = [{"gate": "max-kl", "metric": "kl_mean", "threshold": 0.05, "value": 0.12, "ok": False},
             {"gate": "min-top1", "metric": "top1_agreement", "threshold": 0.8, "value": 0.9, "ok": True}]
    tasks = [{"task": "t", "metric": "acc", "reference": 52.0, "candidate": 51.0, "drop": 1.0, "threshold": 5.0,
              "passed": True}]
    root = ET.fromstring(junit_xml(gates, tasks, "demo"))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases] == ["demo"] * 3
    assert cases[0].find("failure").get("message") == "--max-kl: kl_mean 0.12 nats > 0.05 nats"
    assert cases[1].find("failure") is None and cases[2].find("failure") is None
