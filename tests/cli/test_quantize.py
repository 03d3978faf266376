"""`tfcompile quantize / inspect / verify / plan` end to end on tiny real checkpoints."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from tests_helpers import tensors

FORMATS = ["nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"]
CT_FORMAT = {"nvfp4": "nvfp4-pack-quantized", "nvfp4a16": "nvfp4-pack-quantized",
             "mxfp4": "mxfp4-pack-quantized", "mxfp4a16": "mxfp4-pack-quantized",
             "mxfp8": "mxfp8-quantized", "fp8": "float-quantized",
             "fp8-dynamic": "float-quantized", "fp8-block": "float-quantized"}


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_each_format(fmt, tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    calib = ["--set", "calibrate.samples=2", "--set", "calibrate.seq_len=16"] if fmt in ("nvfp4", "fp8") else []
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", fmt, "--json", *calib)
    assert res.code == 0, res.err
    doc = res.json()  # stdout is exactly one JSON document
    assert doc["ok"] and doc["summary"]["quantized_linears"] == 14  # 2 layers x 7 Linears
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["quant_method"] == "compressed-tensors" and cfg["format"] == CT_FORMAT[fmt]
    assert cfg["quantization_status"] == "compressed" and "lm_head" in cfg["ignore"]
    t = tensors(out)
    q = "model.layers.0.self_attn.q_proj"
    if fmt.startswith(("nvfp4", "mxfp4")):
        assert t[f"{q}.weight_packed"].dtype == torch.uint8 and t[f"{q}.weight_packed"].shape == (128, 64)
        assert f"{q}.weight" not in t
    else:
        assert t[f"{q}.weight"].dtype == torch.float8_e4m3fn
    if fmt == "nvfp4":
        assert t[f"{q}.input_global_scale"].shape == (1,)
    if fmt == "fp8":
        assert t[f"{q}.input_scale"].shape == (1,)
    assert t["model.embed_tokens.weight"].dtype == torch.bfloat16  # untouched
    assert (out / "tokenizer.json").is_file() and (out / "tfcompile" / "manifest.json").is_file()
    assert run_cli("verify", out).code == 0


def test_manifest_contents(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    m = json.loads((out / "tfcompile" / "manifest.json").read_text())
    assert m["schema_version"] == 1 and m["tool"]["name"] == "tfcompile"
    assert m["dependencies"]["torch"].startswith("2.")
    assert m["recipe"]["format"] == "nvfp4a16"
    assert set(m["source"]["files"]) == {"model.safetensors"}
    src_sha = hashlib.sha256((tiny_llama / "model.safetensors").read_bytes()).hexdigest()
    assert m["source"]["files"]["model.safetensors"] == src_sha
    for rel, digest in m["files"].items():
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    assert "config.json" in m["files"] and "model.safetensors" in m["files"]
    layer = next(x for x in m["layers"] if x["module"] == "model.layers.0.mlp.down_proj")
    assert layer["shape"] == [128, 256] and layer["format"] == "nvfp4a16"
    # NVFP4 RTN on Gaussian-like weights sits near 20 dB; far below means broken numerics.
    assert 15 < layer["sqnr_db"] < 30
    assert m["summary"]["compression_ratio"] > 1.5


def test_byte_identical_reruns(tiny_llama, tmp_path, run_cli):
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4",
                       "--export", "modelopt", "--set", "calibrate.samples=2",
                       "--set", "calibrate.seq_len=16").code == 0
    assert tree_digest(a) == tree_digest(b)


def test_nvfp4_fused_groups_share_global_scale(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    t = tensors(out)
    for layer in range(2):
        p = f"model.layers.{layer}"
        qkv = {t[f"{p}.self_attn.{x}_proj.weight_global_scale"].item() for x in "qkv"}
        gu = {t[f"{p}.mlp.{x}_proj.weight_global_scale"].item() for x in ("gate", "up")}
        assert len(qkv) == 1 and len(gu) == 1
        # the shared scale is the group's max amax: 448*6/max(|Wq|,|Wk|,|Wv|)
        src = tensors(tiny_llama)
        amax = max(src[f"{p}.self_attn.{x}_proj.weight"].float().abs().max().item() for x in "qkv")
        assert qkv.pop() == pytest.approx(448 * 6 / amax, rel=1e-6)


def test_modelopt_view_written(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--export", "modelopt").code == 0
    hf = json.loads((out / "modelopt" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] and hf["quantization"]["group_size"] == 16
    ct, mo = tensors(out), tensors(out / "modelopt")
    q = "model.layers.0.self_attn.q_proj"
    assert torch.equal(mo[f"{q}.weight"], ct[f"{q}.weight_packed"])
    # modelopt's weight_scale_2 is the divisor: the reciprocal of compressed-tensors' multiplier
    assert mo[f"{q}.weight_scale_2"].item() == pytest.approx(1 / ct[f"{q}.weight_global_scale"].item(), rel=1e-7)


def test_sharded_source_and_output(model_factory, tmp_path, run_cli):
    src = model_factory.make_tiny_llama(tmp_path / "sharded", shards=3)
    assert (src / "model.safetensors.index.json").exists()
    out = tmp_path / "out"
    assert run_cli("quantize", src, "-o", out, "--format", "fp8-dynamic",
                   "--set", "pack.max_shard_mb=0.1").code == 0
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert run_cli("verify", out).code == 0


def test_ignore_globs_and_regexes(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4a16", "--json",
                  "--ignore", "*.down_proj", "--ignore", r"re:model\.layers\.1\.self_attn\..*")
    assert res.code == 0, res.err
    assert res.json()["summary"]["quantized_linears"] == 14 - 2 - 4
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.0.mlp.down_proj" in ignore and "model.layers.1.self_attn.o_proj" in ignore
    assert tensors(out)["model.layers.0.mlp.down_proj.weight"].dtype == torch.bfloat16


def test_verify_catches_tampering(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    cfg = out / "config.json"
    cfg.write_text(cfg.read_text().replace('"hidden_act"', '"hidden_act" ', 1))
    res = run_cli("verify", out, "--json")
    assert res.code == 1
    failed = [c["check"] for c in res.json()["checks"] if not c["ok"]]
    assert failed == ["checksums"]


def _tamper(out: Path, edit) -> None:
    """Edit the artifact's tensors, then re-record the checksum so only `edit` is wrong."""
    from safetensors.torch import load_file, save_file

    f = out / "model.safetensors"
    sd = load_file(f)
    edit(sd)
    save_file(sd, f, metadata={"format": "pt"})
    from tfcompile.artifact.manifest import write_manifest

    m = json.loads((out / "tfcompile" / "manifest.json").read_text())
    m["files"]["model.safetensors"] = hashlib.sha256(f.read_bytes()).hexdigest()
    write_manifest(out, m)  # re-sealed too (verify's `manifest integrity`)


def test_verify_catches_unshared_global_scale(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16").code == 0
    _tamper(out, lambda sd: sd["model.layers.0.self_attn.k_proj.weight_global_scale"].mul_(2))
    res = run_cli("verify", out, "--json")
    assert res.code == 1
    failed = {c["check"] for c in res.json()["checks"] if not c["ok"]}
    assert failed == {"fused groups share global scale"}


def test_verify_catches_zero_scale_and_missing_layer(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic").code == 0
    def edit(sd):
        sd["model.layers.1.mlp.up_proj.weight_scale"][3] = 0
        del sd["model.layers.0.mlp.down_proj.weight"]

    _tamper(out, edit)
    res = run_cli("verify", out, "--json")
    failed = {c["check"]: c["detail"] for c in res.json()["checks"] if not c["ok"]}
    assert res.code == 1
    assert "model.layers.0.mlp.down_proj.weight: missing" in failed["layers present"]
    assert "model.layers.1.mlp.up_proj.weight_scale" in failed["scales finite and non-zero"]


def test_inspect_and_plan(tiny_llama, tmp_path, run_cli, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp8")
    assert res.code == 0 and "compression" in res.err and "\x1b[" not in res.err
    res = run_cli("inspect", out)
    assert res.code == 0 and "model.layers.1.mlp.down_proj" in res.err and res.out == ""
    res = run_cli("inspect", out, "--json")
    assert res.json()["scheme"]["name"] == "mxfp8"
    res = run_cli("plan", "--format", "fp8-block", "--set", "pack.max_shard_mb=7")
    plan = res.json()
    assert [p["name"] for p in plan["passes"]] == ["load", "select", "quantize", "pack", "manifest", "verify"]
    assert plan["passes"][3]["config"]["max_shard_mb"] == 7


def test_until_writes_nothing(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "nvfp4a16", "--until", "select", "--json")
    assert res.code == 0 and not out.exists()
    assert res.json()["passes"]["select"]["quantized_linears"] == 14


def test_overwrite_replaces_atomically(tiny_llama, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8-dynamic").code == 0
    assert run_cli("quantize", tiny_llama, "-o", out, "--format", "mxfp4", "--overwrite").code == 0
    cfg = json.loads((out / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == "mxfp4-pack-quantized"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny-llama"]
