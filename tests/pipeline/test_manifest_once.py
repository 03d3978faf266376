"""The manifest is written once, after the last pass, from the facts the passes returned:
passes scheduled after `manifest` (emit_cutlass, verify, eval) add their files and sections
without rewriting it."""

from __future__ import annotations

import json

import pytest

CALIB = ("--calib", "random", "--calib-samples", "2", "--calib-seq-len", "16")


@pytest.mark.slow
def test_one_write_holds_every_pass_s_facts(tiny_llama, tmp_path, run_cli, monkeypatch):
    from tfcompile.passes import manifest as manifest_pass

    writes = []
    real = manifest_pass.write_manifest

    def counting(out_dir, doc):
        writes.append(sorted(doc))
        return real(out_dir, doc)

    monkeypatch.setattr(manifest_pass, "write_manifest", counting)
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8", *CALIB, "--json",
                  "--set", "emit_cutlass.targets=[\"sm_90a\"]", "--set", "emit_cutlass.compile=never",
                  "--eval", "--eval-tokens", "128")
    assert res.code == 0, res.err
    assert [p["name"] for p in res.json()["recipe"]["passes"]][-4:] == ["manifest", "emit_cutlass", "verify", "eval"]
    assert len(writes) == 1 and {"cutlass", "eval"} <= set(writes[0])  # once, with the later passes' facts
    doc = json.loads((out / "tfcompile" / "manifest.json").read_text())
    cutlass_files = [f for f in doc["files"] if "/cutlass/" in f]
    assert cutlass_files and doc["cutlass"]["compiled"] is False and doc["eval"]["metrics"]["tokens"] > 0
    assert res.json()["eval"] == doc["eval"]
    assert run_cli("verify", out).code == 0  # every file the later passes wrote is in the checksums
