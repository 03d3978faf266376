"""Issue 24, case 10 (first part): an option combination that would do nothing of what was
asked is exit 1, not a silent exit 0."""

from __future__ import annotations


def test_until_a_skipped_pass_is_refused(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "o"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "--until", "pack", "--skip", "pack")
    assert res.code == 1 and "--until pack" in res.err and "hint: " in res.err, (res.code, res.err)
    assert not out.exists()
