"""Row maps of the layout transforms: RoPE order, TP head grouping, and why gathering rows
before quantization gives the same codes and scales as gathering the quantized rows."""

from __future__ import annotations

import pytest
import torch

from tfcompile.errors import RecipeError
from tfcompile.kernels import formats as F
from tfcompile.layout.heads import HeadGeometry, plan_heads, rope_order


def _rope(x, pos, style, theta=10000.0):
    """x [T, D]: rotate pairs (i, i+D/2) ("half") or (2i, 2i+1) ("interleaved")."""
    d = x.shape[-1]
    ang = pos[:, None].float() / theta ** (torch.arange(0, d, 2).float() / d)
    cos, sin = ang.cos(), ang.sin()
    if style == "half":
        a, b = x[:, : d // 2], x[:, d // 2:]
        return torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
    a, b = x[:, 0::2], x[:, 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)


def test_rope_order_is_the_llama_permutation_and_inverts():
    g = HeadGeometry(2, 1, 8, 8)
    order = rope_order(g, "half", "interleaved")
    assert order == (0, 4, 1, 5, 2, 6, 3, 7)  # interleaved row 2i <- i, 2i+1 <- i + D/2
    back = rope_order(g, "interleaved", "half")
    assert [order[i] for i in back] == list(range(8))
    assert rope_order(g, "half", "half") is None
    partial = rope_order(HeadGeometry(2, 1, 8, 4), "half", "interleaved")
    assert partial == (0, 2, 1, 3, 4, 5, 6, 7)  # rows past the rotary dim stay


def test_permuted_rows_under_interleaved_rope_give_the_same_scores():
    """q.k after RoPE is unchanged when q/k rows are permuted and the rope style switched."""
    torch.manual_seed(0)
    d, t = 16, 7
    order = list(rope_order(HeadGeometry(1, 1, d, d), "half", "interleaved"))
    q, k, pos = torch.randn(t, d, dtype=torch.float64), torch.randn(t, d, dtype=torch.float64), torch.arange(t)
    ref = _rope(q, pos, "half") @ _rope(k, pos, "half").T
    got = _rope(q[:, order], pos, "interleaved") @ _rope(k[:, order], pos, "interleaved").T
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(_rope(q[:, order], pos, "interleaved"), _rope(q, pos, "half")[:, order])


@pytest.mark.parametrize("heads,kv,tp,kv_map", [(8, 2, 2, (0, 1)), (8, 2, 4, (0, 0, 1, 1)),
                                                (4, 1, 4, (0, 0, 0, 0)), (8, 8, 2, tuple(range(8)))])
def test_tp_shards_get_their_query_heads_and_kv_heads(heads, kv, tp, kv_map):
    d = 4
    hp = plan_heads(HeadGeometry(heads, kv, d, d), tp, None)
    assert hp.kv_map == kv_map and hp.view_kv_heads == max(kv, tp)
    for r in range(tp):
        q_heads = {i // d for i in hp.rows("q", r)}
        kv_heads = {i // d for i in hp.rows("k", r)}
        assert q_heads == set(range(r * heads // tp, (r + 1) * heads // tp))  # contiguous query heads
        assert {h // (heads // kv) for h in q_heads} == kv_heads  # exactly the KV heads they read
        assert hp.rows("v", r) == hp.rows("k", r)  # no RoPE order: k and v alike


@pytest.mark.parametrize("heads,kv,tp,why", [(4, 2, 3, "query heads"), (12, 4, 6, "KV heads"),
                                             (4, 2, 0, "at least 1")])
def test_incompatible_tp_is_a_user_error_with_a_hint(heads, kv, tp, why):
    with pytest.raises(RecipeError, match=why) as e:
        plan_heads(HeadGeometry(heads, kv, 8, 8), tp, None)
    assert e.value.exit_code == 1 and e.value.hint


def _quant(w, fmt):
    if fmt == "nvfp4":
        return F.quantize_nvfp4(w)
    if fmt == "mxfp4":
        return F.quantize_mxfp4(w)
    if fmt == "mxfp8":
        return F.quantize_mxfp8(w)
    return F.quantize_fp8(w, fmt.split("-")[1])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4", "mxfp8", "fp8-tensor", "fp8-channel"])
def test_row_gather_commutes_with_quantization(fmt):
    """Scales run along K (per row, per 16/32-block of a row, per tensor): gathering rows before
    quantizing equals gathering the quantized rows, bit for bit, replicated rows included."""
    torch.manual_seed(1)
    w = (torch.randn(64, 128) * torch.logspace(-2, 1, 64)[:, None]).to(torch.bfloat16)
    rows = torch.tensor(list(rope_order(HeadGeometry(2, 2, 32, 32), "half", "interleaved"))
                        + [32 + i for i in range(32)] + list(range(32, 64)))  # permuted + replicated
    a, b = _quant(w[rows], fmt), _quant(w, fmt)
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8)[rows])
    if b.scale.numel() > 1:
        assert torch.equal(a.scale.view(torch.uint8) if a.scale.dtype != torch.float32 else a.scale,
                           (b.scale.view(torch.uint8) if b.scale.dtype != torch.float32 else b.scale)[rows])
    else:
        assert torch.equal(a.scale, b.scale)
    if b.global_scale is not None:
        assert torch.equal(a.global_scale, b.global_scale)
