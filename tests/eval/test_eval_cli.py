"""`tfcompile eval`: metrics of artifacts, the reference against itself, gates, bad input."""

from __future__ import annotations

import math

import pytest

SMALL = ("--max-tokens", "256", "--seq-len", "64", "--batch-size", "4")


def _eval(run_cli, model, reference, text, *extra):
    return run_cli("eval", model, "--reference", reference, "--text", text, *SMALL, *extra)


@pytest.mark.parametrize("fmt", ["nvfp4a16", "fp8-dynamic"])
def test_artifact_metrics_finite(run_cli, eval_artifact, tiny_llama, eval_text, fmt):
    r = _eval(run_cli, eval_artifact(fmt), tiny_llama, eval_text, "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ok"] is True and doc["kind"] == "artifact" and doc["format"] == fmt
    assert doc["activations"] == (None if fmt == "nvfp4a16" else "fp8-token")
    m = doc["metrics"]
    for key in ("perplexity", "reference_perplexity", "ppl_increase", "kl_mean", "kl_max", "top1_agreement"):
        assert math.isfinite(m[key]), key
    assert m["tokens"] == 256 and m["predicted_tokens"] == 256 - 4  # 4 rows of 64
    assert 0 < m["kl_mean"] < 0.05 and 0.5 < m["top1_agreement"] < 1.0
    assert doc["text"] == {"source": f"file:{eval_text}", "tokens": 256, "sequences": 4,
                           "seq_len": 64, "batch_size": 4}
    layers = doc["layers"]
    assert len(layers) == 14 == doc["layer_summary"]["count"]  # 2 layers x (q, k, v, o, gate, up, down)
    for la in layers:
        assert 10 < la["sqnr_db"] < 60, la
        assert la["e2e_sqnr_db"] is not None and math.isfinite(la["e2e_sqnr_db"])
    first = {la["module"]: la for la in layers}["model.layers.0.self_attn.q_proj"]
    assert first["shape"] == [128, 128]
    assert first["sqnr_db"] == pytest.approx(first["e2e_sqnr_db"])  # same input: the embeddings


def test_reference_against_itself(run_cli, tiny_llama, eval_text):
    r = _eval(run_cli, tiny_llama, tiny_llama, eval_text, "--json", "--max-kl", "0", "--min-top1", "1")
    assert r.code == 0, r.err
    doc = r.json()
    m = doc["metrics"]
    assert doc["kind"] == "checkpoint" and doc["format"] is None and doc["layers"] == []
    assert m["kl_mean"] < 1e-6 and m["kl_max"] < 1e-6
    assert m["top1_agreement"] == 1.0
    assert m["perplexity"] == m["reference_perplexity"] and m["ppl_increase"] == 0.0
    assert [g["ok"] for g in doc["gates"]] == [True, True]


def test_gates_pass(run_cli, eval_artifact, tiny_llama, eval_text, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    r = _eval(run_cli, eval_artifact("fp8-dynamic"), tiny_llama, eval_text,
              "--max-kl", "0.05", "--max-ppl-increase", "0.05", "--min-top1", "0.8")
    assert r.code == 0, r.err
    assert r.out == ""  # people's output goes to stderr
    assert "\x1b[" not in r.err  # NO_COLOR
    for text in ("perplexity", "KL(ref || model)", "top-1 agreement", "gate --max-kl", "pass",
                 "model.layers.1.mlp.down_proj"):
        assert text in r.err, text


def test_gate_fails(run_cli, eval_artifact, tiny_llama, eval_text):
    r = _eval(run_cli, eval_artifact("nvfp4a16"), tiny_llama, eval_text, "--json",
              "--max-kl", "1e-9", "--min-top1", "0.1")
    assert r.code == 1
    doc = r.json()  # the report is still printed, with the failed gate
    assert doc["ok"] is False
    gates = {g["gate"]: g for g in doc["gates"]}
    assert gates["max-kl"]["ok"] is False and gates["min-top1"]["ok"] is True
    kl = doc["metrics"]["kl_mean"]
    assert gates["max-kl"]["value"] == kl and gates["max-kl"]["threshold"] == 1e-9
    err = r.err.splitlines()
    msg = next(line for line in err if line.startswith("error:"))
    assert "--max-kl" in msg and f"{kl:.6g}" in msg and "1e-09" in msg and "min-top1" not in msg
    assert err[-1].startswith("hint:")


def test_bad_input(run_cli, tiny_llama, eval_text, tmp_path, model_factory):
    def check(args, *words):
        r = run_cli("eval", *args)
        assert r.code == 1, r.err
        assert "error:" in r.err and "hint:" in r.err, r.err
        for w in words:
            assert w in r.err, (w, r.err)

    empty = tmp_path / "empty"
    empty.mkdir()
    check([tmp_path / "missing", "--reference", tiny_llama, "--text", eval_text], "does not exist")
    check([empty, "--reference", tiny_llama, "--text", eval_text], "config.json")
    check([tiny_llama, "--reference", tiny_llama, "--text", tmp_path / "none.txt"], "none.txt")
    (tiny_llama / "model.safetensors").rename(tiny_llama / "pytorch_model.bin")
    check([tiny_llama, "--reference", tiny_llama, "--text", eval_text], "pickle")
    check([tiny_llama, "--reference", tiny_llama, "--text", eval_text, "--batch-size", "0"], "--batch-size")


def test_vocab_mismatch(run_cli, tiny_llama, eval_text, tmp_path, model_factory):
    other = model_factory.make_tiny_llama(tmp_path / "v512", vocab=512, layers=1)
    r = _eval(run_cli, other, tiny_llama, eval_text)
    assert r.code == 1
    assert "vocabulary mismatch" in r.err and "512" in r.err and "256" in r.err and "hint:" in r.err


def test_no_text_without_corpus(run_cli, tiny_llama, monkeypatch, tmp_path):
    import tfcompile.calibration.corpus as corpus

    monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python3.11-doc")
    r = run_cli("eval", tiny_llama, "--reference", tiny_llama)
    assert r.code == 1
    assert "no evaluation text" in r.err and "--text" in r.err


def test_reference_must_be_a_checkpoint(run_cli, eval_artifact, eval_text):
    art = eval_artifact("nvfp4a16")
    r = _eval(run_cli, art, art, eval_text)
    assert r.code == 1 and "is a tfcompile artifact" in r.err
