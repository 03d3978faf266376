"""Published source formats, read as they are, give the artifact of the bf16 model they encode, byte for byte.

Each published checkpoint is made from a tiny family model with tfcompile's formats reference
(tests/fixtures/published.py); the bf16 model it encodes is decoded by the format's own reference
(DeepSeek's weight_dequant arithmetic, transformers' GPT-OSS MXFP4 conversion, compressed-tensors'
decompressors). tfcompile must give the same artifact from both: every file equal, the manifest
equal but for `source` (its files and format).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from families_util import manifest, quantize, run_cli


def _files(d: Path) -> dict[str, str]:
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


def _same_artifact(a: Path, b: Path) -> None:
    fa, fb = _files(a), _files(b)
    assert {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)} == {"tfcompile/manifest.json"}
    ma, mb = manifest(a), manifest(b)
    # the source record differs, and so does the manifest's digest of itself (integrity)
    assert {k for k in ma if ma[k] != mb[k]} == {"source", "integrity"}


@pytest.mark.parametrize("family,fmt", [("deepseek_v3", "nvfp4a16"), ("kimi_k2", "nvfp4"), ("deepseek_v3", "fp8")])
def test_fp8_block_checkpoint(family, fmt, family_src, published, tmp_path):
    src = published.to_fp8_block(family_src(family), tmp_path / "fp8")
    bf16 = published.dequantize_fp8_block(src, tmp_path / "bf16")
    a, b = quantize(src, tmp_path / "a", fmt), quantize(bf16, tmp_path / "b", fmt)
    _same_artifact(a, b)
    fmt_rec = manifest(a)["source"]["format"]
    assert fmt_rec["format"] == "fp8-block" and fmt_rec["weight_block_size"] == [128, 128]
    assert fmt_rec["dequantized_tensors"] > 0 and manifest(b)["source"]["format"] == {"format": "safetensors"}


@pytest.mark.parametrize("fmt", ["nvfp4a16", "fp8"])
def test_mxfp4_gpt_oss_checkpoint(fmt, family_src, published, tmp_path):
    src = published.to_mxfp4(family_src("gpt_oss"), tmp_path / "mxfp4")
    bf16 = published.dequantize_mxfp4(src, tmp_path / "bf16")
    a, b = quantize(src, tmp_path / "a", fmt), quantize(bf16, tmp_path / "b", fmt)
    _same_artifact(a, b)
    assert manifest(a)["source"]["format"]["format"] == "mxfp4"


@pytest.mark.parametrize("family,first,then", [("deepseek_v3", "fp8-block", "nvfp4a16"),
                                               ("gpt_oss", "fp8-dynamic", "nvfp4"),
                                               ("qwen2_5_vl", "nvfp4a16", "fp8")])
def test_compressed_tensors_artifact_requantized(family, first, then, family_src, family_artifact,
                                                 published, tmp_path):
    src = family_artifact(family, first)
    bf16 = published.dequantize_compressed(src, tmp_path / "bf16")
    a, b = quantize(src, tmp_path / "a", then), quantize(bf16, tmp_path / "b", then)
    _same_artifact(a, b)
    rec = manifest(a)["source"]["format"]
    assert rec["format"] == "compressed-tensors" and rec["dequantized_tensors"] == len(manifest(src)["layers"])


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8-dynamic"])
def test_int4_pack_quantized_kimi_checkpoint(fmt, family_src, published, tmp_path):
    """Kimi K2-Thinking / K2.5's published INT4 experts (compressed-tensors pack-quantized) read as
    they are: the artifact equals the one of the bf16 model compressed-tensors' own
    PackedQuantizationCompressor decodes from the same files."""
    src = published.to_int4_pack_quantized(family_src("kimi_k2"), tmp_path / "int4")
    bf16 = published.dequantize_compressed(src, tmp_path / "bf16")
    a, b = quantize(src, tmp_path / "a", fmt), quantize(bf16, tmp_path / "b", fmt)
    _same_artifact(a, b)
    rec = manifest(a)["source"]["format"]
    assert rec["compression"] == "pack-quantized" and rec["dequantized_tensors"] == 3 * 8 * 2  # 2 MoE layers


def test_int4_pack_quantized_other_widths_are_refused(family_src, published, tmp_path):
    import json

    src = published.to_int4_pack_quantized(family_src("kimi_k2"), tmp_path / "int4")
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] = 8
    (src / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4a16", "-q")
    assert code == 1 and "8-bit" in err and "hint:" in err


def test_mxfp4_source_decodes_one_expert_at_a_time(family_src, published, tmp_path, monkeypatch):
    """Memory stays bounded: pack never decodes a layer's fused experts whole (each expert once)."""
    from tfcompile.io.sources import mxfp4

    src = published.to_mxfp4(family_src("gpt_oss"), tmp_path / "mxfp4")
    calls, real = [], mxfp4._decoder

    def counting(ckpt, blocks, scales, expert):
        decode = real(ckpt, blocks, scales, expert)
        return lambda: calls.append(expert) or decode()

    monkeypatch.setattr(mxfp4, "_decoder", counting)
    quantize(src, tmp_path / "out", "mxfp4a16")
    assert len(calls) == 4 * 2 * 8 and None not in calls  # 4 layers x 2 fused tensors x 8 experts, one each


def test_unknown_quantized_checkpoint_is_refused_with_a_hint(family_src, tmp_path):
    import json
    import shutil

    from families_util import run_cli

    d = tmp_path / "awq"
    shutil.copytree(family_src("qwen3"), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (d / "config.json").write_text(json.dumps(cfg))
    code, _, err = run_cli("quantize", d, "-o", tmp_path / "out", "--format", "nvfp4a16")
    assert code == 1 and "quant_method 'awq'" in err and "hint:" in err


def test_sampling_calibration_from_a_decoded_source_is_refused(family_src, published, tmp_path):
    """--calib self would hold the whole decoded model in memory: a clear error instead."""
    from families_util import run_cli

    src = published.to_fp8_block(family_src("deepseek_v3"), tmp_path / "fp8")
    code, _, err = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4", "--calib", "self")
    assert code == 1 and "--calib self" in err and "hint:" in err


@pytest.mark.parametrize("python_doc", [True, False], ids=["python-doc", "no-python-doc"])
def test_default_calibration_of_a_decoded_source_never_samples_from_it(family_src, published, tmp_path,
                                                                       monkeypatch, python_doc):
    """The default data (auto) falls back to sampling from the model when no calibration text
    suits its tokenizer; on a decoded published checkpoint that would hold the whole bf16 model,
    so auto means the first installed text there: python-doc, else the stdlib's docstrings."""
    import json

    from families_util import run_cli

    from tfcompile.calibration import corpus, datasets

    def refuse(*a, **k):
        raise AssertionError("sampled from a decoded source")

    monkeypatch.setattr(datasets, "sample_from_model", refuse)
    if not python_doc:
        monkeypatch.setattr(corpus, "PYTHON_DOC_DIR", tmp_path / "no-python3.11-doc")
    src = published.to_fp8_block(family_src("deepseek_v3"), tmp_path / "fp8")
    code, out, err = run_cli("quantize", src, "-o", tmp_path / "out", "--format", "nvfp4", "-q", "--json",
                             "--calib-samples", "2", "--calib-seq-len", "32")
    assert code == 0, err[-2000:]
    want = "python-doc" if python_doc else "stdlib-docstrings"
    assert json.loads(out)["passes"]["calibrate"]["source"] == f"{want}(seed=0)"


def test_per_expert_gpt_oss_checkpoint_checked_for_completeness(family_artifact, tmp_path):
    """GPT-OSS experts stored one Linear per expert (what engines and our artifacts hold) are fused
    through the family's layout for the completeness check, which transformers' loader cannot do:
    the whole checkpoint passes, one expert's projection removed is refused by name."""
    import shutil

    from safetensors.torch import load_file, save_file

    art = family_artifact("gpt_oss", "fp8-dynamic")
    ok = quantize(art, tmp_path / "ok", "nvfp4a16")
    assert manifest(ok)["source"]["format"]["format"] == "compressed-tensors"
    broken = tmp_path / "broken"
    shutil.copytree(art, broken)
    shard = next(broken.glob("*.safetensors"))
    state = load_file(shard)
    gone = sorted(k for k in state if ".experts.3.up_proj." in k)
    assert gone
    save_file({k: v for k, v in state.items() if k not in gone}, shard, metadata={"format": "pt"})
    code, _, err = run_cli("quantize", broken, "-o", tmp_path / "out", "--format", "nvfp4a16")
    assert code == 1 and "does not match" in err and "experts" in err
    assert not (tmp_path / "out").exists()
