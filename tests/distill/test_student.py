"""The student model: what trains in each mode, shared NVFP4 global scales, exported weights."""

from __future__ import annotations

import pytest
import torch

from tfcompile.distill.student import build_student


def _prepared(src, fmt):
    from tfcompile.api import run_pipeline
    from tfcompile.recipe.build import build_recipe

    sets = ["calibrate.samples=2", "calibrate.seq_len=16"] if fmt == "nvfp4" else []
    return run_pipeline(src, None, build_recipe(fmt=fmt, sets=sets, until="quantize"))


def _student(src, ctx, train, **kw):
    from tfcompile.calibration.forward import load_hf_model

    return build_student(load_hf_model(src, torch.float32), ctx.plan, ctx.program, train=train, lora_rank=4,
                         lora_alpha=4.0, seed=0, dtype=torch.bfloat16, **kw)


@pytest.fixture(scope="module")
def nvfp4(tiny_llama_src):
    return _prepared(tiny_llama_src, "nvfp4")


@pytest.fixture(scope="module")
def ids():
    return torch.randint(4, 256, (2, 16), generator=torch.Generator().manual_seed(1))


def _logits(student, ids):
    with torch.no_grad():
        out = student.model(input_ids=ids).logits
    student.release()
    return out


def test_modes_start_from_the_same_model(tiny_llama_src, nvfp4, ids):
    """scales (alpha = 1: no clip, the LSQ term adds 0) and LoRA (B = 0) start exactly at RTN;
    the fused C kernels give the reference's values."""
    base = _logits(_student(tiny_llama_src, nvfp4, "weights"), ids)
    for train in ("scales", "lora"):
        assert torch.equal(_logits(_student(tiny_llama_src, nvfp4, train), ids), base), train
    assert torch.equal(_logits(_student(tiny_llama_src, nvfp4, "weights", impl="reference"), ids), base)


@pytest.mark.parametrize("train,names", [("weights", {"weight"}), ("scales", {"alpha"}),
                                         ("lora", {"lora_a", "lora_b"})])
def test_what_trains(train, names, tiny_llama_src, nvfp4, ids):
    st = _student(tiny_llama_src, nvfp4, train)
    params = st.parameters()
    assert {n.rsplit(".", 1)[-1] for n, _ in params} == names
    assert len(params) == 14 * len(names)
    assert sum(p.requires_grad for p in st.model.parameters()) == len(params)  # the rest is frozen
    st.model(input_ids=ids).logits.float().square().mean().backward()
    st.release()
    grads = [p.grad for _, p in params]
    assert all(g is not None for g in grads) and any(bool(g.abs().sum() > 0) for g in grads)


def test_nvfp4_group_shares_global_scale_and_export_is_what_pack_quantizes(tiny_llama_src, nvfp4):
    from tfcompile.distill.fakequant import quant_dequant_weight
    from tfcompile.kernels.formats import nvfp4_global_scale

    st = _student(tiny_llama_src, nvfp4, "weights")
    with torch.no_grad():
        for _, p in st.parameters():
            p.add_(torch.randn_like(p) * 1e-3)  # as if trained
    exported = dict(st.export())
    assert len(exported) == 14 and all(t.dtype == torch.bfloat16 for t in exported.values())
    q = [st.linears[f"model.layers.0.self_attn.{x}_proj"] for x in "qkv"]
    g = q[0].group.global_scale()
    assert all(m.group is q[0].group for m in q)
    amax = max(exported[m.name + ".weight"].float().abs().max() for m in q)
    assert torch.equal(g, nvfp4_global_scale(amax.reshape(1)))
    with torch.no_grad():  # the student's weight is the quantization of the exported tensor
        w = q[1].quantized_weight()
    assert torch.equal(w, quant_dequant_weight(exported[q[1].name + ".weight"].float(), q[1].spec.weights, g,
                                               q[1].spec.rule, torch.bfloat16, "reference"))


def test_scales_mode_clips_blocks(tiny_llama_src, nvfp4):
    st = _student(tiny_llama_src, nvfp4, "scales")
    lin = st.linears["model.layers.0.mlp.down_proj"]
    with torch.no_grad():
        lin.alpha.fill_(0.5)
    w = lin.effective_weight()
    n, k = w.shape
    blocks = w.reshape(n, k // 16, 16).abs().amax(-1)
    bound = (0.5 * lin.block_amax).bfloat16().float()
    assert torch.all(blocks <= bound + 1e-6) and torch.all(blocks >= bound * 0.99)


def test_fused_experts_are_refused(model_factory, tmp_path):
    from tfcompile.errors import UserError

    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    ctx = _prepared(src, "nvfp4a16")
    with pytest.raises(UserError, match="fused experts"):
        _student(src, ctx, "weights")
