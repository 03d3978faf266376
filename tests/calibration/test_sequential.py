"""Layer-by-layer calibration gives the whole-model loop's statistics.

Oracle: the whole-model loop (transformers' `from_pretrained` + one forward
per sequence), an independent path through the model: weights loaded by
transformers rather than bound from our mmap views, and the model's own
forward over every layer rather than layer calls fed by captured inputs.
"""

from __future__ import annotations

import pytest
import torch

from tfcompile.calibration.forward import observe_input_amax
from tfcompile.calibration.hessian import NAME as HESSIAN
from tfcompile.calibration.hessian import hessians
from tfcompile.calibration.sequential import Unsupported, find_layers, observe_sequential
from tfcompile.io.checkpoint import open_checkpoint


def _targets(ckpt) -> set[str]:
    return {n[: -len(".weight")] for n in ckpt.names()
            if n.endswith("proj.weight") and ".layers." in n}


def _groups(modules: set[str]) -> dict[str, str]:
    """One Hessian per input: q_proj stands for q/k/v, gate_proj for gate/up."""
    out = {}
    for m in sorted(modules):
        leaf = m.rsplit(".", 1)[1]
        if leaf in ("q_proj", "o_proj", "gate_proj", "down_proj"):
            out[m] = m
    return out


def _both(model_dir, data="random", **kw):
    with open_checkpoint(model_dir) as ckpt:
        modules = _targets(ckpt)
        common = dict(data=data, samples=6, seq_len=24, seed=3, dtype=torch.bfloat16, **kw)
        whole = observe_input_amax(model_dir, modules, **common)
        seen = []
        seq = observe_sequential(model_dir, ckpt, modules, batch=4,
                                 on_layer=lambda i, n, s: seen.append((i, n)), **common)
    return modules, whole, seq, seen


def test_llama_amax_hessians_kv_match_whole_model(tiny_llama):
    with open_checkpoint(tiny_llama) as ckpt:
        groups = _groups(_targets(ckpt))
    modules, whole, seq, seen = _both(tiny_llama, kv=True, statistics={HESSIAN: {}}, groups=groups)
    assert seen == [(0, 2), (1, 2)]  # every layer once, in order
    assert set(seq.input_amax) == modules and not seq.fallback and seq.tokens == whole.tokens
    for m in modules:  # measured: equal; batching 4 sequences could reorder bf16 sums
        assert seq.input_amax[m] == pytest.approx(whole.input_amax[m], rel=1e-3), m
    assert set(hessians(seq)) == set(hessians(whole)) == set(groups.values())
    for k in groups.values():
        a, b = hessians(seq)[k], hessians(whole)[k]
        assert a.shape == b.shape and a.dtype == torch.float32
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), k  # measured <= 4e-7
    assert set(seq.kv_amax) == set(whole.kv_amax)
    for n, (k, v) in whole.kv_amax.items():
        assert torch.allclose(seq.kv_amax[n][0], k, rtol=1e-3) and torch.allclose(seq.kv_amax[n][1], v, rtol=1e-3)


def test_self_sampled_tokens_match(tiny_llama):
    """`self` samples tokens with the whole model bound to the mapped checkpoint."""
    modules, whole, seq, _ = _both(tiny_llama, data="self")
    assert seq.source == whole.source
    for m in modules:
        assert seq.input_amax[m] == pytest.approx(whole.input_amax[m], rel=1e-3), m


def test_moe_experts_fused_from_per_expert_tensors(model_factory, tmp_path):
    src = model_factory.make_tiny_qwen3_moe(tmp_path / "moe")
    modules, whole, seq, _ = _both(src)
    assert set(seq.input_amax) == modules
    assert seq.fallback == whole.fallback  # experts no token reached: the same in both loops
    for m in modules:
        assert seq.input_amax[m] == pytest.approx(whole.input_amax[m], rel=1e-3), m


def test_layers_found_by_structure(tiny_llama):
    from tfcompile.calibration.binding import skeleton

    model = skeleton(tiny_llama)
    assert all(p.device.type == "meta" for p in model.parameters())  # no weight memory
    path, layers = find_layers(model)
    assert path == "model.layers" and len(layers) == 2


def test_checkpoint_without_a_layer_tensor_is_unsupported(tiny_llama):
    from safetensors.torch import load_file, save_file

    f = tiny_llama / "model.safetensors"
    tensors = load_file(f)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, f, metadata={"format": "pt"})
    with open_checkpoint(tiny_llama) as ckpt, pytest.raises(Unsupported, match="up_proj"):
        observe_sequential(tiny_llama, ckpt, set(), data="random", samples=2, seq_len=8, seed=0,
                           dtype=torch.bfloat16)
