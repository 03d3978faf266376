"""Issue 31 section 5, the rough edges a new user meets: verify's error/hint, log width off a TTY,
format names in any case, fixture files that follow the umask."""

from __future__ import annotations

import os

from tfcompile.cli.output import LOG_WIDTH, stderr_console


def test_failed_verify_prints_error_and_hint(run_cli, tiny_llama, tmp_path):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "-q").code == 0
    with open(out / "model.safetensors", "r+b") as f:  # one byte of the tensor data changed
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    r = run_cli("verify", out)
    assert r.code == 1
    lines = r.err.splitlines()
    error = next(line for line in lines if line.startswith("error:"))
    assert "verify checks failed" in error and "'checksums'" in error and "model.safetensors" in error
    assert lines[-1].startswith("hint:") and "rebuild it" in lines[-1]
    r = run_cli("verify", out, "--json")  # the report on stdout, the error on stderr
    assert r.code == 1 and r.json()["ok"] is False and "error:" in r.err


def test_log_output_is_not_wrapped_at_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert stderr_console().width == LOG_WIDTH  # pytest's stderr is not a TTY
    monkeypatch.setenv("COLUMNS", "100")
    assert stderr_console().width == 100  # the user's COLUMNS wins


def test_format_names_in_any_case(run_cli, tiny_llama, tmp_path):
    r = run_cli("plan", "--format", "NVFP4", "--algorithm", "RTN", "--kv-cache", "FP8")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["format"] == "nvfp4"
    assert run_cli("plan", "--format", "Fp8-Dynamic").json()["format"] == "fp8-dynamic"


def test_fixture_checkpoints_follow_the_umask(tiny_llama_src):
    mask = os.umask(0)
    os.umask(mask)
    for f in tiny_llama_src.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~mask, f.name


def test_report_title_is_the_model_and_shows_the_signer(run_cli, tiny_llama, tmp_path):
    import json

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    cfg = json.loads((tiny_llama / "config.json").read_text())
    (tiny_llama / "config.json").write_text(json.dumps({**cfg, "_model_name_or_path": "Tiny Llama 2M"}))
    key = tmp_path / "release.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    out, html = tmp_path / "cache-dir-name-1234", tmp_path / "r.html"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "-q", "--sign", key).code == 0
    assert run_cli("report", out, "-o", html).code == 0
    page = html.read_text()
    assert "<h1>Tiny Llama 2M: fp8-dynamic</h1>" in page and "<title>tfcompile report: Tiny Llama 2M</title>" in page
    sig = json.loads((out / "tfcompile" / "manifest.sig").read_text())
    assert f"ed25519, key id <code>{sig['key_id']}</code>" in page and "built by</td><td>tfcompile " in page


def test_smollm2_build_reports_its_steps(tmp_path, monkeypatch, capsys):
    """The SmolLM2 build (5 silent minutes on a loaded machine, issue 31) says each step on stderr;
    the build itself is stubbed (it needs the GGUF file and minutes), its `say` calls are real."""
    from tfcompile.fixtures import smollm2

    def build(out, say):
        for step in ("1/3: reading", "2/3: converting", "3/3: writing"):
            say(step)
        (out / "model.safetensors").write_bytes(b"")

    monkeypatch.setattr(smollm2, "checkpoint_dir", lambda root=None: tmp_path / "models" / "smollm2-test")
    monkeypatch.setattr(smollm2, "_build", build)
    assert smollm2.smollm2_checkpoint() == tmp_path / "models" / "smollm2-test"
    err = capsys.readouterr().err
    assert "building the SmolLM2 checkpoint" in err and "SmolLM2 checkpoint built in" in err
    assert [ln.split(" (")[0] for ln in err.splitlines() if "SmolLM2 build " in ln] == [
        "tfcompile: SmolLM2 build 1/3: reading", "tfcompile: SmolLM2 build 2/3: converting",
        "tfcompile: SmolLM2 build 3/3: writing"]
