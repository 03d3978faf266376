"""Every bad input of issue #3 gets exit 1, an error naming the culprit with a
hint, and leaves no output (nor a temp directory) behind."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

WEIGHTS = "model.safetensors"


def _leftovers(out: Path) -> list[str]:
    return [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp")]


def _assert_fails(res, out: Path, *needles: str, code: int = 1):
    assert res.code == code, (res.code, res.err)
    for n in needles:
        assert n in res.err, (n, res.err)
    assert "\nhint: " in res.err or res.err.startswith("hint: ")
    assert not out.exists(), "no output may be left behind"
    assert _leftovers(out) == [], "no temp directory may be left behind"
    assert res.out == ""  # stdout is for data only


def _rewrite(model: Path, fn) -> None:
    sd = load_file(model / WEIGHTS)
    fn(sd)
    save_file(sd, model / WEIGHTS, metadata={"format": "pt"})


def test_missing_config(tiny_llama, tmp_path, run_cli):
    (tiny_llama / "config.json").unlink()
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16"), out, "config.json")


def test_malformed_config(tiny_llama, tmp_path, run_cli):
    (tiny_llama / "config.json").write_text("{not json")
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16"), out, "config.json")


def test_truncated_safetensors(tiny_llama, tmp_path, run_cli):
    f = tiny_llama / WEIGHTS
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic"), out, WEIGHTS)


def test_corrupt_safetensors_header(tiny_llama, tmp_path, run_cli):
    f = tiny_llama / WEIGHTS
    data = bytearray(f.read_bytes())
    data[8:16] = b"\xff\xfe{{{{{{"
    f.write_bytes(bytes(data))
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic"), out, WEIGHTS)


def _shard(model: Path, target: str) -> None:
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": target}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    (model / WEIGHTS).rename(model / "real.safetensors")


def test_index_points_to_missing_file(tiny_llama, tmp_path, run_cli):
    _shard(tiny_llama, "model-00009-of-00009.safetensors")
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4"), out,
                  "model-00009-of-00009.safetensors")


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd"])
def test_index_path_traversal(tiny_llama, tmp_path, run_cli, target):
    (tmp_path / "outside.safetensors").write_bytes((tiny_llama / WEIGHTS).read_bytes())
    _shard(tiny_llama, target)
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4"), out, target)


def test_symlink_out_of_model_dir(tiny_llama, tmp_path, run_cli):
    outside = tmp_path / "elsewhere.safetensors"
    (tiny_llama / WEIGHTS).rename(outside)
    (tiny_llama / WEIGHTS).symlink_to(outside)
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4"), out, WEIGHTS)


def test_pickle_checkpoint_refused(tiny_llama, tmp_path, run_cli):
    (tiny_llama / WEIGHTS).unlink()
    (tiny_llama / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    _assert_fails(res, out, "pytorch_model.bin")
    assert "safetensors" in res.err


def test_block_size_not_dividing_k(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_llama(tmp_path / "odd", hidden=72, intermediate=144, heads=4, kv_heads=2)
    out = tmp_path / "out"
    res = run_cli("quantize", src, "-o", out, "--format", "nvfp4a16")
    _assert_fails(res, out, "not a multiple of 16", "--ignore")


def test_nan_weight_named(tiny_llama, tmp_path, run_cli):
    name = "model.layers.1.mlp.down_proj.weight"
    _rewrite(tiny_llama, lambda sd: sd[name].view(-1).__setitem__(5, float("nan")))
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16"), out, name)


def test_inf_weight_named(tiny_llama, tmp_path, run_cli):
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite(tiny_llama, lambda sd: sd[name].view(-1).__setitem__(0, float("inf")))
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic"), out, name)


def test_unsupported_dtype(tiny_llama, tmp_path, run_cli):
    name = "model.layers.0.mlp.up_proj.weight"
    _rewrite(tiny_llama, lambda sd: sd.__setitem__(name, sd[name].to(torch.float8_e4m3fn)))
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    _assert_fails(res, out, name, "F8_E4M3")


def test_existing_output_refused_without_overwrite(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    assert res.code == 1 and "--overwrite" in res.err
    assert (out / "keep.txt").read_text() == "mine"


def test_unwritable_output_parent(tiny_llama, run_cli):
    out = Path("/proc/tfcompile-test-out")  # not writable, even for root
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    assert res.code == 1, res.err
    assert "/proc" in res.err and "hint:" in res.err
    assert not out.exists()


def test_disk_full_mid_write(tiny_llama, tmp_path, run_cli, monkeypatch):
    from tfcompile.io import writer

    real_emit = writer.ShardWriter._emit
    calls = {"n": 0}

    def emit(self, data):
        calls["n"] += 1
        if calls["n"] == 4:  # header, then a few tensors, then the disk is full
            self.abort()
            raise writer.write_error(self.path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
        return real_emit(self, data)

    monkeypatch.setattr(writer.ShardWriter, "_emit", emit)
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16")
    _assert_fails(res, out, "No space left")


def test_usage_errors_exit_2(run_cli, tmp_path):
    assert run_cli("quantize").code == 2
    assert run_cli("quantize", tmp_path, "-o", tmp_path / "o", "--export", "tensorrt").code == 2
    assert run_cli("frobnicate").code == 2


def test_unknown_format_exit_1(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "int3")
    _assert_fails(res, out, "unknown format 'int3'")


def test_pack_refuses_to_ship_a_zero_scale(tiny_llama, tmp_path, run_cli, monkeypatch):
    """Defence in depth: a bad scale from any algorithm stops the run before publishing."""
    import dataclasses

    from tfcompile.kernels.formats import quantizer

    real = quantizer.quantize_mxfp4  # what the MXFP4 weight quantizer calls

    def broken(w, **kw):
        q = real(w, **kw)
        return dataclasses.replace(q, scale=torch.full_like(q.scale, 255))  # E8M0 NaN

    monkeypatch.setattr(quantizer, "quantize_mxfp4", broken)
    out = tmp_path / "out"
    _assert_fails(run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4a16"), out,
                  "weight_scale: E8M0 NaN")
