"""`tfcompile quantize --eval`: the eval pass, its gates, and the manifest's "eval" section."""

from __future__ import annotations

import json

import pytest

EVAL = ("--eval-tokens", "256", "--set", "eval.seq_len=64")
KV = ("--kv-cache", "fp8", "--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32")


def _files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _manifest(out):
    return json.loads((out / "tfcompile" / "manifest.json").read_text())


def test_passing_gates_store_the_figures(run_cli, tiny_llama, eval_text, tmp_path):
    out = tmp_path / "out"
    r = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", *KV, "--eval", "--eval-text",
                eval_text, *EVAL, "--max-kl", "0.05", "--min-top1", "0.5", "--max-ppl-increase", "0.05", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    names = [p["name"] for p in doc["recipe"]["passes"]]
    assert names[-2:] == ["verify", "eval"]
    section = _manifest(out)["eval"]
    assert doc["eval"] == section and section["ok"] is True
    assert set(section) == {"ok", "activations", "dtype", "text", "kv_cache", "metrics", "layer_summary", "gates"}
    assert section["text"] == {"source": f"file:{eval_text}", "tokens": 256, "sequences": 4, "seq_len": 64,
                               "batch_size": 4}
    assert section["kv_cache"]["emulated"] is True and section["kv_cache"]["strategy"] == "tensor"
    assert [g["gate"] for g in section["gates"]] == ["max-kl", "max-ppl-increase", "min-top1"]
    assert all(g["ok"] for g in section["gates"])
    # the same figures as `tfcompile eval` on the published artifact (stored with 6 significant digits)
    ev = run_cli("eval", out, "--reference", tiny_llama, "--text", eval_text, "--max-tokens", "256",
                 "--seq-len", "64", "--json")
    assert ev.code == 0, ev.err
    for key, value in ev.json()["metrics"].items():
        assert section["metrics"][key] == pytest.approx(value, rel=1e-5), key
    assert doc["passes"]["eval"]["kl_mean"] == section["metrics"]["kl_mean"]
    v = run_cli("verify", out, "--json")  # the rewritten manifest keeps every checksum valid
    assert v.code == 0, v.out


def test_rerun_is_byte_identical(run_cli, tiny_llama, eval_text, tmp_path):
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        r = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--eval-text", eval_text, *EVAL, "-q")
        assert r.code == 0, r.err
    a, b = (_files(o) for o in outs)
    assert a == b and "eval" in _manifest(outs[0])  # --eval-text alone schedules the pass


def test_missed_gate_publishes_nothing(run_cli, tiny_llama, eval_text, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = tmp_path / "out"
    r = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--eval", "--eval-text", eval_text,
                *EVAL, "--max-kl", "1e-9", "--min-top1", "0.1", "--json")
    assert r.code == 1
    # no staging left; the rejected artifact is kept beside OUT (tests/tasks/test_release_gate.py)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["out.rejected", "tiny-llama"]
    doc = r.json()
    assert doc["ok"] is False and doc["output"] is None and doc["rejected"] == str(tmp_path / "out.rejected")
    gates = {g["gate"]: g for g in doc["eval"]["gates"]}
    assert gates["max-kl"]["ok"] is False and gates["min-top1"]["ok"] is True
    kl = doc["eval"]["metrics"]["kl_mean"]
    assert gates["max-kl"]["value"] == kl > 0
    err = r.err.splitlines()
    msg = next(line for line in err if line.startswith("error:"))
    assert "pass 'eval'" in msg and "--max-kl" in msg and f"{kl:.6g}" in msg and "1e-09" in msg
    assert doc["error"] in msg and err[-1].startswith("hint:")
    # people's output: the figures on stderr, nothing on stdout
    r = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--eval-text", eval_text, *EVAL,
                "--max-ppl-increase", "-1", "--no-keep-rejected")
    assert r.code == 1 and r.out == "" and not out.exists()
    assert "gate --max-ppl-increase" in r.err and "FAIL" in r.err and "error: pass 'eval' failed" in r.err


def test_plan_and_bad_settings(run_cli, tiny_llama, tmp_path):
    r = run_cli("plan", "--format", "fp8", "--eval", "--max-kl", "0.1")
    assert r.code == 0, r.err
    passes = r.json()["passes"]
    assert [p["name"] for p in passes][-2:] == ["verify", "eval"]
    assert passes[-1]["config"]["max_kl"] == 0.1 and passes[-1]["config"]["text"] == "python-doc"
    assert "eval" not in [p["name"] for p in run_cli("plan", "--format", "fp8").json()["passes"]]
    r = run_cli("quantize", tiny_llama, "-o", tmp_path / "o", "--format", "fp8-dynamic", "--eval",
                "--set", "eval.kv_cache=on")
    assert r.code == 1 and "eval.kv_cache 'on'" in r.err and "hint:" in r.err and not (tmp_path / "o").exists()
    r = run_cli("quantize", tiny_llama, "-o", tmp_path / "o", "--format", "fp8-dynamic", "--eval-text",
                tmp_path / "missing.txt")
    assert r.code == 1 and "missing.txt" in r.err and not (tmp_path / "o").exists()
