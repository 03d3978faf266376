"""The modelopt (TensorRT-LLM) view of the families TensorRT-LLM serves: DeepSeek-V3, GPT-OSS, Qwen3, Qwen3-MoE.

modelopt itself is the oracle: its NVFP4QTensor decodes our modelopt tensors (fp4 * weight_scale *
weight_scale_2) to the same weights as the compressed-tensors view; for dense Qwen3 its own export
of the same model has the same tensor names, dtypes, shapes and exclude list.
"""

from __future__ import annotations

import json

import pytest
import torch

from families_util import manifest, tensors

pytest.importorskip("modelopt.torch.quantization")

TRTLLM = ["deepseek_v3", "gpt_oss", "qwen3", "qwen3_moe"]


def _hf_quant(art):
    return json.loads((art / "modelopt" / "hf_quant_config.json").read_text())["quantization"]


def test_the_families_trtllm_serves_are_marked():
    from tfcompile.families import FAMILIES

    assert sorted(f.name for f in FAMILIES if f.modelopt) == sorted(TRTLLM)


@pytest.mark.parametrize("family", TRTLLM)
def test_modelopt_view_decodes_to_our_weights(family, family_artifact):
    from modelopt.torch.quantization.qtensor import NVFP4QTensor

    from tfcompile.artifact.naming import qtensor_of
    from tfcompile.io.checkpoint import open_checkpoint
    from tfcompile.kernels.formats import dequantize
    from tfcompile.schemes import get_scheme

    art = family_artifact(family, "nvfp4a16", "--export", "modelopt")
    m, mo = manifest(art), tensors(art / "modelopt")
    hq = _hf_quant(art)
    assert hq["quant_algo"] == "W4A16_NVFP4" and hq["group_size"] == 16
    assert set(m["ignore"]) <= set(hq["exclude_modules"])  # routers, kv_b_proj, lm_head ... stay bf16
    with open_checkpoint(art) as ckpt:
        for x in m["layers"]:
            name, (n, k) = x["module"], x["shape"]
            w, s, s2 = mo[f"{name}.weight"], mo[f"{name}.weight_scale"], mo[f"{name}.weight_scale_2"]
            assert (w.dtype, tuple(w.shape), s.dtype, tuple(s.shape), s2.dtype, s2.dim()) == \
                (torch.uint8, (n, k // 2), torch.float8_e4m3fn, (n, k // 16), torch.float32, 0), name
            theirs = NVFP4QTensor(torch.Size((n, k)), torch.float32, w).dequantize(
                torch.float32, scale=s, double_scale=s2, block_sizes={-1: 16})
            ours = dequantize(qtensor_of(ckpt, get_scheme("nvfp4a16"), name, n, k), torch.float32)
            torch.testing.assert_close(theirs, ours, rtol=2e-7, atol=0, msg=name)
    if family == "gpt_oss":  # the per-expert biases travel with their Linears
        assert torch.equal(mo["model.layers.0.mlp.experts.3.up_proj.bias"],
                           tensors(art)["model.layers.0.mlp.experts.3.up_proj.bias"])


def test_dense_qwen3_view_matches_a_modelopt_export(family_src, family_artifact, tmp_path):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint
    from transformers import Qwen3ForCausalLM

    src = family_src("qwen3")
    model = Qwen3ForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16).eval()
    ids = torch.randint(4, 250, (2, 32), generator=torch.Generator().manual_seed(0))
    mtq.quantize(model, mtq.W4A16_NVFP4_CFG, lambda m: m(ids))
    export_hf_checkpoint(model, export_dir=str(tmp_path / "modelopt"))
    art = family_artifact("qwen3", "nvfp4a16", "--export", "modelopt")
    mine, theirs = tensors(art / "modelopt"), tensors(tmp_path / "modelopt")
    assert sorted(mine) == sorted(theirs)
    assert all((mine[k].dtype, mine[k].shape) == (theirs[k].dtype, theirs[k].shape) for k in mine)
    assert _hf_quant(art)["exclude_modules"] == json.loads(
        (tmp_path / "modelopt" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
