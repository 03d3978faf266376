"""Issue 24, cases 7 and 8 (the input-file part): files are read only when regular and under a
size limit, JSON only under a nesting limit (tfcompile/io/bounded.py); a FIFO, /dev/zero or
JSON nested thousands deep is exit 1 naming the file, never a hang or a RecursionError."""

from __future__ import annotations

import json
import os
import struct

import pytest

from safety_helpers import quantize_to

FMT = ("--format", "fp8-dynamic")
DEEP = "[" * 5000 + "]" * 5000


def _user_error(res, *needles):
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, (res.code, res.err)
    for n in needles:
        assert n in res.err, (n, res.err)


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    return path


def test_recipe_from_dev_zero_refused(tiny_llama, tmp_path, run_cli):
    _user_error(run_cli("quantize", tiny_llama, "-o", tmp_path / "o", "--recipe", "/dev/zero"),
                "/dev/zero", "not a regular file")


def test_report_eval_from_dev_zero_refused(tiny_llama, tmp_path, run_cli):
    art = quantize_to(tiny_llama, tmp_path / "art")
    _user_error(run_cli("report", art, "--eval", "/dev/zero", "-o", tmp_path / "r.html"), "/dev/zero")


def test_public_key_fifo_refused_without_blocking(tiny_llama, tmp_path, run_cli, fifo):
    art = quantize_to(tiny_llama, tmp_path / "art")
    _user_error(run_cli("verify", art, "--public-key", fifo), str(fifo), "not a regular file")


def test_oversized_recipe_refused(tiny_llama, tmp_path, run_cli):
    big = tmp_path / "r.json"
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)  # sparse: nothing is really written
    _user_error(run_cli("quantize", tiny_llama, "-o", tmp_path / "o", "--recipe", big), "limit")


@pytest.mark.parametrize("where", ["config", "index", "recipe", "set", "header", "sig"])
def test_json_nested_thousands_deep_is_a_user_error(where, tiny_llama, tmp_path, run_cli, ed25519_keys):
    args = ["quantize", tiny_llama, "-o", tmp_path / "o", *FMT]
    if where == "config":
        (tiny_llama / "config.json").write_text('{"a": ' + DEEP + "}")
    elif where == "index":
        (tiny_llama / "model.safetensors").rename(tiny_llama / "model-00001-of-00001.safetensors")
        (tiny_llama / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    elif where == "recipe":
        (tmp_path / "r.json").write_text('{"version": 1, "x": ' + DEEP + "}")
        args += ["--recipe", tmp_path / "r.json"]
    elif where == "set":
        args += ["--set", "pack.max_shard_mb=" + DEEP]
    elif where == "header":
        f = tiny_llama / "model.safetensors"
        header = ('{"__metadata__": {"x": ' + DEEP + "}}").encode()
        f.write_bytes(struct.pack("<Q", len(header)) + header)
    else:
        art = quantize_to(tiny_llama, tmp_path / "art", "--sign", ed25519_keys[0])
        (art / "tfcompile/manifest.sig").write_text('{"signature": ' + DEEP + "}")
        res = run_cli("verify", art, "--public-key", ed25519_keys[1], "--json")
        assert res.code == 1 and "Traceback" not in res.err, res.err
        assert "damaged" in json.dumps(json.loads(res.out)["checks"])
        return
    res = run_cli(*args)
    _user_error(res, "nested")
