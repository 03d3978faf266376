"""A new user's rough edges (issue 14, item 6): a readable artifact, hints on usage errors,
calibration options that cannot apply, eval without its default text, inspect and the KV cache."""

from __future__ import annotations

import contextlib
import json
import os
import stat

import pytest


@contextlib.contextmanager
def _umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize("mask,dirs,files", [(0o022, 0o755, 0o644), (0o027, 0o750, 0o640)])
def test_artifact_modes_follow_the_umask(mask, dirs, files, tiny_llama, tmp_path, run_cli):
    """mkdtemp's 0700 is not published: a server running as another user can read the artifact."""
    out = tmp_path / "out"
    with _umask(mask):
        res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--layout", "trtllm", "-q")
    assert res.code == 0, res.err
    for p in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (dirs if p.is_dir() else files), (p, oct(mode))


@pytest.mark.parametrize("argv,needle", [
    (("quantize", "x", "-o", "y", "--fromat", "nvfp4"), "Did you mean"),  # '--format' (and maybe others)
    (("quantiz",), "Did you mean 'quantize'?"),
    (("eval", "x"), "Missing option '--reference'"),
])
def test_usage_errors_end_with_a_hint(argv, needle, run_cli):
    res = run_cli(*argv)
    assert res.code == 2 and needle in res.err and res.out == ""
    assert "--fromat" not in argv or "'--format'" in res.err
    assert res.err.rstrip().splitlines()[-1].startswith("hint: run `tfcompile")


@pytest.mark.parametrize("fmt,why", [("mxfp8", "computed at run time"), ("nvfp4a16", "weight-only")])
def test_calibration_options_on_a_format_that_needs_none(fmt, why, tiny_llama, tmp_path, run_cli):
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "out", "--format", fmt, "--calib", "random")
    assert res.code == 1 and f"--format {fmt} needs no calibration data" in res.err and why in res.err
    assert "hint: drop the --calib* options" in res.err and "not in this pipeline" not in res.err
    # the same options are fine where something calibrates
    res = run_cli("quantize", tiny_llama, "-o", tmp_path / "kv", "--format", fmt, "--calib", "random",
                  "--calib-samples", "2", "--calib-seq-len", "16", "--kv-cache", "fp8", "-q")
    assert res.code == 0, res.err


def test_eval_without_its_default_text_says_what_to_do(tiny_llama, tmp_path, run_cli, monkeypatch):
    from tfcompile.calibration import corpus

    monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python3.11-doc")
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "-q").code == 0
    res = run_cli("eval", out, "--reference", tiny_llama)
    assert res.code == 1 and "no evaluation text" in res.err and "python3.11-doc" in res.err
    assert "hint: pass --text FILE" in res.err and "apt-get install python3.11-doc" in res.err


def test_quantize_eval_options_name_like_eval(tiny_llama, tmp_path, run_cli):
    """eval --text / --max-tokens are quantize --eval-text / --eval-max-tokens (old --eval-tokens kept)."""
    text = tmp_path / "t.txt"
    text.write_text("one two three four five six seven eight nine ten " * 30)
    for flag in ("--eval-max-tokens", "--eval-tokens"):
        out = tmp_path / flag
        res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic", "--eval", "--eval-text", text,
                      flag, "64", "--json")
        assert res.code == 0, res.err
        assert res.json()["eval"]["metrics"]["tokens"] == 64


def test_inspect_names_the_kv_cache(tiny_llama, tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "240")  # one table row per line
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--kv-cache", "fp8", "--calib", "random",
                  "--calib-samples", "2", "--calib-seq-len", "16", "--layout", "vllm", "-q")
    assert res.code == 0, res.err
    err = run_cli("inspect", out, "--no-layers").err
    assert "KV cache" in err and "fp8_e4m3, per tensor k_scale/v_scale in 2 attention modules" in err
    assert "vllm layout" in err
    plain = tmp_path / "plain"
    assert run_cli("quantize", tiny_llama, "-o", plain, "--format", "nvfp4a16", "-q").code == 0
    assert "not quantized" in run_cli("inspect", plain, "--no-layers").err
    assert json.loads(run_cli("inspect", out, "--json").out)["scheme"]["kv_cache"]["dtype"] == "fp8_e4m3"
