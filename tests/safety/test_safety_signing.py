"""Signed manifests (issue 16, build list; case 6's tampering once hashes are rewritten):
`quantize --sign`, `tfcompile sign`, `verify --public-key`, over ed25519 with `cryptography`."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from safety_helpers import assert_clean_failure, leftovers, private_copy, quantize_to

WEIGHTS = "model.safetensors"
MANIFEST = Path("tfcompile") / "manifest.json"
SIG = Path("tfcompile") / "manifest.sig"


@pytest.fixture(scope="module")
def signed_src(tiny_llama_src, ed25519_keys, tmp_path_factory):
    return quantize_to(tiny_llama_src, tmp_path_factory.mktemp("signed") / "out", "--sign", ed25519_keys[0])


@pytest.fixture
def signed(signed_src, tmp_path):
    return private_copy(signed_src, tmp_path / "signed")


def _rehash(art: Path) -> None:
    """What an attacker does after editing files: recompute every checksum and the self-digest."""
    from tfcompile.artifact.manifest import write_manifest

    doc = json.loads((art / MANIFEST).read_text())
    doc["files"] = {rel: hashlib.sha256((art / rel).read_bytes()).hexdigest() for rel in doc["files"]}
    write_manifest(art, doc)


def _edit_tensor(art: Path, name_suffix: str, fn) -> None:
    sd = load_file(art / WEIGHTS)
    name = next(k for k in sorted(sd) if k.endswith(name_suffix))
    sd[name] = fn(sd[name])
    save_file(sd, art / WEIGHTS, metadata={"format": "pt"})


TAMPER = {
    "flipped weight bytes": lambda a: _edit_tensor(a, "weight_packed", lambda t: t ^ 0x11),
    "scaled block scales": lambda a: _edit_tensor(
        a, "weight_scale", lambda t: (t.float() * 2).clamp(max=448).to(t.dtype)),
    "global scale x1000": lambda a: _edit_tensor(a, "weight_global_scale", lambda t: t * 1000),
    "config edit": lambda a: _edit_json(a / "config.json", rms_norm_eps=0.1),
    "tokenizer edit": lambda a: _edit_json(a / "tokenizer.json", truncation={"max_length": 1}),
}


def _edit_json(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    assert any(doc.get(k) != v for k, v in changes.items())
    doc.update(changes)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_rehashed_tampering_fails_the_signature(case, signed, ed25519_keys, run_cli):
    TAMPER[case](signed)
    _rehash(signed)
    assert run_cli("verify", signed, "--json").json()["checks"]  # the rehashed artifact is self-consistent
    res = run_cli("verify", signed, "--public-key", ed25519_keys[1], "--json")
    assert res.code == 1, res.out
    failed = {c["check"]: c["detail"] for c in res.json()["checks"] if not c["ok"]}
    assert "signature" in failed, failed


def test_signed_artifact_verifies(signed, ed25519_keys, run_cli):
    res = run_cli("verify", signed, "--public-key", ed25519_keys[1], "--json")
    assert res.code == 0, res.out
    sig = {c["check"]: c for c in res.json()["checks"]}["signature"]
    assert sig["ok"] and "ed25519" in sig["detail"]


def test_signature_file_is_outside_the_hashed_list(signed):
    doc = json.loads((signed / MANIFEST).read_text())
    assert str(SIG) not in doc["files"] and str(MANIFEST) not in doc["files"]
    assert "config.json" in doc["files"] and "tokenizer.json" in doc["files"]
    sig = json.loads((signed / SIG).read_text())
    assert sig["algorithm"] == "ed25519" and sig["signed_file"] == str(MANIFEST)


def test_wrong_public_key_fails(signed, ed25519_keys, run_cli):
    res = run_cli("verify", signed, "--public-key", ed25519_keys[2], "--json")
    assert res.code == 1
    failed = {c["check"]: c["detail"] for c in res.json()["checks"] if not c["ok"]}
    assert "different key" in failed["signature"]


def test_missing_signature_fails_when_a_key_is_given(signed, ed25519_keys, run_cli):
    (signed / SIG).unlink()
    res = run_cli("verify", signed, "--public-key", ed25519_keys[1])
    assert res.code == 1 and "signature" in res.err and "Traceback" not in res.err


def test_unsigned_verify_mentions_an_unchecked_signature(signed, run_cli):
    res = run_cli("verify", signed, "--json")
    assert res.code == 0
    sig = {c["check"]: c for c in res.json()["checks"]}["signature"]
    assert sig["ok"] and "not checked" in sig["detail"]


def test_sign_command_signs_an_existing_artifact(tiny_llama_src, tmp_path, ed25519_keys, run_cli, signed_src):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16").code == 0
    assert run_cli("verify", out, "--public-key", ed25519_keys[1]).code == 1  # not signed yet
    res = run_cli("sign", out, "--key", ed25519_keys[0], "--json")
    assert res.code == 0, res.err
    assert res.json()["ok"] and res.json()["signature"] == str(SIG)
    assert run_cli("verify", out, "--public-key", ed25519_keys[1]).code == 0
    # ed25519 is deterministic: quantize --sign and sign give the same bytes
    assert (out / SIG).read_bytes() == (signed_src / SIG).read_bytes()


def test_sign_refuses_a_tampered_artifact(tiny_llama_src, tmp_path, ed25519_keys, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16").code == 0
    (out / "evil.py").write_text("import os\n")
    res = run_cli("sign", out, "--key", ed25519_keys[0])
    assert res.code == 1 and "evil.py" in res.err and "Traceback" not in res.err
    assert not (out / SIG).exists()


def test_keys_never_enter_the_artifact_or_the_logs(signed_src, ed25519_keys, tiny_llama_src, tmp_path, run_cli):
    priv_pem = ed25519_keys[0].read_bytes()
    body = b"".join(priv_pem.splitlines()[1:-1])
    raw = base64.b64decode(body)[-32:]  # the 32-byte seed at the end of the PKCS#8 DER
    res = run_cli("quantize", tiny_llama_src, "-o", tmp_path / "o", "--format", "nvfp4a16", "--sign",
                  ed25519_keys[0], "--json")
    assert res.code == 0
    for blob in (res.out.encode(), res.err.encode()):
        assert body not in blob and raw.hex().encode() not in blob and str(ed25519_keys[0]).encode() not in blob
    for f in (tmp_path / "o").rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert body not in data and raw not in data and raw.hex().encode() not in data, f
            assert str(ed25519_keys[0]).encode() not in data and ed25519_keys[0].name.encode() not in data, f


@pytest.mark.parametrize("how,needle", [
    ("missing", "cannot read"),
    ("not-a-key", "not an ed25519 private key"),
    ("rsa", "not an ed25519"),
    ("public-instead", "not an ed25519 private key"),
    ("encrypted", "passphrase"),
    ("directory", "cannot read"),
])
def test_bad_signing_key_fails_before_any_work(how, needle, tiny_llama, tmp_path, run_cli, ed25519_keys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    key = tmp_path / "key.pem"
    if how == "not-a-key":
        key.write_text("-----BEGIN PRIVATE KEY-----\nAAAA secret-looking-text\n-----END PRIVATE KEY-----\n")
    elif how == "rsa":
        k = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
    elif how == "public-instead":
        shutil.copy(ed25519_keys[1], key)
    elif how == "encrypted":
        k = ed25519.Ed25519PrivateKey.generate()
        key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.BestAvailableEncryption(b"pw")))
    elif how == "directory":
        key.mkdir()
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--sign", key)
    assert_clean_failure(res, out, needle)
    assert "secret-looking-text" not in res.err
    assert "pass 'load'" not in res.err  # refused before the pipeline started


def test_encrypted_key_with_passphrase_from_the_environment(tiny_llama_src, tmp_path, run_cli, monkeypatch):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    k = ed25519.Ed25519PrivateKey.generate()
    key = tmp_path / "key.pem"
    key.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.BestAvailableEncryption(b"pw")))
    pub = tmp_path / "key.pub"
    pub.write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    monkeypatch.setenv("TFCOMPILE_KEY_PASSPHRASE", "pw")
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16", "--sign", key).code == 0
    assert run_cli("verify", out, "--public-key", pub).code == 0  # OpenSSH public key line works too


@pytest.mark.parametrize("how", ["missing", "garbage", "private-instead"])
def test_bad_public_key_is_a_clear_error(how, signed, tmp_path, ed25519_keys, run_cli):
    pub = tmp_path / "pub"
    if how == "garbage":
        pub.write_text("ssh-ed25519 AAAAnotbase64!!\n")
    elif how == "private-instead":
        shutil.copy(ed25519_keys[0], pub)
    res = run_cli("verify", signed, "--public-key", pub)
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, res.err
    assert "public key" in res.err
    if how == "private-instead":
        assert ed25519_keys[0].read_text().splitlines()[1] not in res.err


def test_signing_key_inside_out_is_refused_with_overwrite(tiny_llama, tmp_path, run_cli, ed25519_keys):
    out = tmp_path / "out"
    out.mkdir()
    key = out / "release.pem"
    shutil.copy(ed25519_keys[0], key)
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--overwrite", "--sign", key)
    assert res.code == 1 and "inside" in res.err and "Traceback" not in res.err
    assert key.read_bytes() == ed25519_keys[0].read_bytes()
    assert leftovers(out) == []


def test_tune_on_a_signed_artifact_drops_the_stale_signature(signed, ed25519_keys, run_cli):
    res = run_cli("tune", signed, "--target", "sm_90a", "--buckets", "16", "--no-measure", "-q")
    assert res.code == 0, res.err
    assert "signature" in res.err and "tfcompile sign" in res.err
    assert not (signed / SIG).exists()
    assert run_cli("verify", signed).code == 0


def test_signed_tensor_values_roundtrip(signed):
    """Sanity: the signed artifact is a normal artifact (tensors load)."""
    t = load_file(signed / WEIGHTS)
    assert any(k.endswith("weight_packed") and v.dtype == torch.uint8 for k, v in t.items())
