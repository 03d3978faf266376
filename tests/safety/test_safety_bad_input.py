"""Issue 16, case 5: inputs that crashed with a traceback (exit 2) are clear errors (exit 1 with
a hint), found before the slow passes run, and leave nothing at OUT."""

from __future__ import annotations

import builtins
import errno
import io
import json
import os
import time

import pytest

from safety_helpers import assert_clean_failure

FMT = ("--format", "nvfp4a16")


def test_binary_recipe_file(tiny_llama, tmp_path, run_cli):
    recipe = tmp_path / "recipe.toml"
    recipe.write_bytes(bytes(range(256)) * 4)
    out = tmp_path / "out"
    assert_clean_failure(run_cli("quantize", tiny_llama, "-o", out, "--recipe", recipe), out, "recipe.toml")


@pytest.mark.parametrize("body,needle", [
    ('version = 1\nformat = "nvfp4a16"\npasses = 5\n', "passes"),
    ('version = 1\nformat = "nvfp4a16"\npasses = [1, 2]\n', "passes"),
    ('version = 1\nformat = "nvfp4a16"\n[passes]\nselect = 3\n', "passes.select"),
    ('version = 1\npipeline = 5\n', "pipeline"),
    ('version = 1\npipeline = ["load", 7]\n', "pipeline"),
    ('version = 1\npipeline = ["load", "frobnicate"]\n', "frobnicate"),
    ('version = 1\nformat = 5\n', "format"),
    ('version = 1\nformat = ["nvfp4"]\n', "format"),
])
def test_recipe_with_wrong_types(body, needle, tiny_llama, tmp_path, run_cli):
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(body)
    out = tmp_path / "out"
    assert_clean_failure(run_cli("quantize", tiny_llama, "-o", out, "--recipe", recipe), out, needle)


@pytest.mark.parametrize("value", ["inf", "Infinity", "NaN", "-inf", "1e400"])
def test_max_shard_mb_not_finite_fails_before_quantizing(value, tiny_llama, tmp_path, run_cli, monkeypatch):
    from tfcompile.passes import pack

    ran = []
    monkeypatch.setattr(pack, "execute", lambda *a, **k: ran.append(1) or (_ for _ in ()).throw(AssertionError))
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, *FMT, "--set", f"pack.max_shard_mb={value}")
    assert_clean_failure(res, out, "max_shard_mb")
    assert ran == []


def test_plan_rejects_non_finite_values(run_cli):
    res = run_cli("plan", "--format", "nvfp4", "--set", "calibrate.percentile=NaN")
    assert res.code == 1 and "percentile" in res.err and "Traceback" not in res.err


def test_set_select_format_contradicting_format(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--set", "select.format=nvfp4")
    assert_clean_failure(res, out, "select.format", "--format")


def test_recipe_format_contradicting_select_format(tiny_llama, tmp_path, run_cli):
    recipe = tmp_path / "r.toml"
    recipe.write_text('version = 1\nformat = "fp8-dynamic"\n[passes.select]\nformat = "nvfp4"\n')
    out = tmp_path / "out"
    assert_clean_failure(run_cli("quantize", tiny_llama, "-o", out, "--recipe", recipe), out, "select.format")


def _disk_full_for(monkeypatch, suffix: str) -> None:
    """Writing any file whose name ends with `suffix` fails with ENOSPC (as a full disk does)."""
    real_open = io.open

    class Full(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def fake_open(file, mode="r", *args, **kwargs):
        named = isinstance(file, (str, os.PathLike)) and os.fspath(file).endswith(suffix)
        if named and any(c in mode for c in "wxa"):
            real_open(file, mode, *args, **kwargs).close()  # the file is created, then the disk is full
            raw = io.BufferedWriter(Full())
            return raw if "b" in mode else io.TextIOWrapper(raw)
        return real_open(file, mode, *args, **kwargs)

    real_fdopen = os.fdopen

    def fake_fdopen(fd, mode="r", *args, **kwargs):
        """Atomic writes (tfcompile/io/atomic.py) write a mkstemp file, `.NAME.tmp-XXXXXXXX`, by fd."""
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if suffix in name and any(c in mode for c in "wxa"):
            os.close(fd)
            return io.BufferedWriter(Full())
        return real_fdopen(fd, mode, *args, **kwargs)

    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(os, "fdopen", fake_fdopen)


@pytest.mark.parametrize("suffix", ["config.json", "manifest.json.tmp"])
def test_disk_full_writing_config_or_manifest(suffix, tiny_llama, tmp_path, run_cli, monkeypatch):
    out = tmp_path / "out"
    _disk_full_for(monkeypatch, suffix)
    res = run_cli("quantize", tiny_llama, "-o", out, *FMT)
    assert_clean_failure(res, out, "No space left", suffix.split(".tmp")[0])
    assert "internal error" not in res.err


def test_calib_seq_len_beyond_max_position_embeddings(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    t0 = time.monotonic()
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4", "--calib-seq-len", "100000")
    assert_clean_failure(res, out, "--calib-seq-len", "max_position_embeddings")
    assert time.monotonic() - t0 < 60


@pytest.mark.parametrize("opt,value", [("--calib-seq-len", "0"), ("--calib-samples", "-3")])
def test_calib_sizes_must_be_positive(opt, value, tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert_clean_failure(run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4", opt, value), out,
                         opt.lstrip("-").replace("calib-", ""))


def test_config_json_not_an_object_in_artifact_for_verify(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, *FMT).code == 0
    (out / "config.json").write_text(json.dumps([1, 2]))
    res = run_cli("verify", out)
    assert res.code == 1 and "Traceback" not in res.err, res.err
