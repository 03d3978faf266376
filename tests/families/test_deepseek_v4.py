"""DeepSeek-V4's published format read as it is (tfcompile/io/sources/deepseek_v4.py), and where
tfcompile stands with the model.

The format, from transformers 5.25 (integrations/finegrained_fp8.py `FP8Experts`, `Fp8Dequantize`;
utils/quantization_config.py `FineGrainedFP8Config`: scale_fmt "ue8m0", expert_dtype "fp4"): dense
Linears FP8 E4M3 with one E8M0 scale per 128x128 block, routed experts FP4 (int8 E2M1 pairs, low nibble
first) with one E8M0 scale per 32 along K, scales stored as `X.scale`. The oracle is transformers' own
`Fp8Dequantize._dequantize_one`, not tfcompile's formats reference.
"""

from __future__ import annotations

import json

import pytest
import torch

from families_util import run_cli


@pytest.fixture(scope="module")
def v4(families, published, tmp_path_factory):
    root = tmp_path_factory.mktemp("deepseek-v4")
    src = families.make_tiny_deepseek_v4(root / "bf16")
    return src, published.to_deepseek_v4(src, root / "published")


def _oracle(pub, name: str) -> torch.Tensor:
    from safetensors import safe_open
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize

    with safe_open(str(pub / "model.safetensors"), "pt") as f:
        w, s = f.get_tensor(name), f.get_tensor(name[: -len(".weight")] + ".scale")
    return Fp8Dequantize(None)._dequantize_one(w, s, output_dtype=torch.bfloat16)


def test_deepseek_v4_published_weights_decode_bit_exact_against_transformers(v4):
    from tfcompile.io.sources import open_source, source_format

    src, pub = v4
    raw = json.loads((pub / "config.json").read_text())["quantization_config"]
    assert raw["scale_fmt"] == "ue8m0" and raw["expert_dtype"] == "fp4"
    with open_source(pub) as ckpt:
        fmt = source_format(ckpt)
        decoded = [n for n in ckpt.names() if n.endswith(".weight") and ckpt.info(n).dtype == "BF16"
                   and ckpt.inner.info(n).dtype != "BF16"]
        assert not any(n.endswith(".scale") for n in ckpt.names())
        for name in decoded:
            got = ckpt.get(name)
            assert got.dtype == torch.bfloat16 and torch.equal(got, _oracle(pub, name)), name
        assert ckpt.get("model.layers.0.ffn.gate.tid2eid").dtype == torch.int64  # passes through
    assert fmt["format"] == "deepseek-v4" and fmt["fp4_tensors"] == 4 * 8 * 3 and fmt["fp8_tensors"] > 20
    assert fmt["dequantized_tensors"] == len(decoded) == fmt["fp4_tensors"] + fmt["fp8_tensors"]
    e = "model.layers.3.ffn.experts.5.w2.weight"  # and close to the bf16 model it encodes (FP4: ~1/4 step)
    with open_source(src) as ref, open_source(pub) as ckpt:
        err = (ckpt.get(e).float() - ref.get(e).float()).abs().max() / ref.get(e).float().abs().max()
    assert 0 < err < 0.25


@pytest.mark.parametrize("bad", ["shape", "nan"])
def test_deepseek_v4_scale_that_does_not_fit_its_weight_is_refused(v4, tmp_path, bad):
    import shutil

    from safetensors.torch import load_file, save_file

    from tfcompile.errors import CheckpointError
    from tfcompile.io.sources import open_source

    pub = shutil.copytree(v4[1], tmp_path / "pub")
    t = load_file(str(pub / "model.safetensors"))
    s = "model.layers.2.ffn.experts.1.w1.scale"
    t[s] = t[s][:, :1].contiguous() if bad == "shape" else torch.full_like(t[s].view(torch.uint8), 255).view(t[s].dtype)
    save_file(t, str(pub / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=s):
        with open_source(pub) as ckpt:
            ckpt.get(s[: -len(".scale")] + ".weight")


@pytest.mark.parametrize("which", [0, 1], ids=["bf16", "published"])
def test_deepseek_v4_quantizes_its_experts_and_keeps_the_rest(v4, tmp_path, which):
    """The conservative rules of a model no engine here serves (vLLM 0.32 has no DeepSeek-V4 model;
    docs/models.md): the routed and shared experts' w1/w2/w3 (named as the standard MoE projections,
    under DeepSeek's `ffn`) are quantized, as the published checkpoint puts its experts in FP4; attention,
    compressor, indexer, router and hyper-connection parameters stay in the source dtype; the hash
    router's int64 `tid2eid` (a buffer transformers renames to `mlp.gate.tid2eid`) passes through
    byte for byte. From the bf16 model and from the published FP8/FP4 checkpoint alike."""
    from safetensors import safe_open

    out = tmp_path / "out"
    code, _, err = run_cli("quantize", v4[which], "-o", out, "--format", "nvfp4a16", "-q", "--json")
    assert code == 0, err
    quantized = {k[: -len(".weight_packed")] for k in _keys(out) if k.endswith(".weight_packed")}
    assert quantized and all(".ffn.experts." in q or ".ffn.shared_experts." in q for q in quantized)
    assert {q.rsplit(".", 1)[1] for q in quantized} == {"w1", "w2", "w3"}
    assert not any(".attn." in q or ".gate." in q for q in quantized)
    name = "model.layers.0.ffn.gate.tid2eid"
    with safe_open(str(v4[0] / "model.safetensors"), "pt") as f:
        want = f.get_tensor(name)
    assert want.dtype == torch.int64 and _tensor(out, name).equal(want)
    assert run_cli("verify", out)[0] == 0


def _keys(art) -> set[str]:
    from safetensors import safe_open

    out = set()
    for f in sorted(art.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            out |= set(h.keys())
    return out


def _tensor(art, name: str) -> torch.Tensor:
    from safetensors import safe_open

    for f in sorted(art.glob("*.safetensors")):
        with safe_open(str(f), "pt") as h:
            if name in h.keys():
                return h.get_tensor(name)
    raise KeyError(name)


def test_deepseek_v4_full_size_estimate_says_vllm_has_no_model():
    """examples/configs/deepseek-v4-flash: transformers 5.25's DeepseekV4Config defaults (V4-Flash: 43
    layers, hidden 4096, 256 experts of 2048) with the published quantization_config."""
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[2] / "examples" / "configs" / "deepseek-v4-flash"
    code, out, err = run_cli("plan", "--format", "nvfp4", "--estimate", cfg, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert round(doc["model"]["params"] / 1e9, 1) == 284.3
    vllm = doc["engines"]["vllm"]
    assert vllm["verdict"] == "refuses" and "no model class" in vllm["problems"][0]["message"]
