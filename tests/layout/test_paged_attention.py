"""The reference paged attention against dense attention, for every page layout and KV dtype."""

from __future__ import annotations

import pytest
import torch

from tfcompile.evaluate.kvcache import fake_quant_fp8
from tfcompile.kernels import formats as F
from tfcompile.layout.paged_attention import KVFormat, PagedKV, paged_attention


def _dense(q, k, v):
    """Causal SDPA over [T, H, D] with GQA (KV heads repeated), float64."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1).double(), k.transpose(0, 1).double(), v.transpose(0, 1).double(), is_causal=True)
    return out.transpose(0, 1)


def _run(fmt, q, k, v, chunks, scale=None):
    """Prefill chunks[0] tokens then the rest chunk by chunk, two sequences interleaved."""
    pages = 2 * -(-k.shape[0] // fmt.block_size)  # two sequences
    kc = PagedKV(fmt, k.shape[1], pages, scale=scale)
    vc = PagedKV(fmt, k.shape[1], pages, scale=scale, seed=1)
    outs = {0: [], 1: []}
    at = 0
    for n in chunks:
        pos = torch.arange(at, at + n)
        for seq in (0, 1):  # two sequences share the pages, each through its own block table
            kc.append(seq, k[at:at + n] * (1 + seq)), vc.append(seq, v[at:at + n])
            outs[seq].append(paged_attention(q[at:at + n], kc, vc, seq, pos))
        at += n
    assert kc.tables[0] != list(range(len(kc.tables[0])))  # pages are scattered
    return torch.cat(outs[0]), kc


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("block,pad", [(16, 32), (4, 48), (32, 64)])
def test_paged_matches_dense_attention(layout, block, pad):
    torch.manual_seed(0)
    t, h, kv, d = 37, 4, 2, 32
    q, k, v = torch.randn(t, h, d), torch.randn(t, kv, d), torch.randn(t, kv, d)
    out, cache = _run(KVFormat(layout, block, d, pad, "fp32"), q, k, v, [13, 1, 1, 5, 17])
    torch.testing.assert_close(out.double(), _dense(q, k, v), rtol=1e-5, atol=1e-5)
    store = cache.data  # page shape: NHD [blocks, block, kv, pad], HND [blocks, kv, block, pad]
    assert tuple(store.shape[1:]) == ((block, kv, pad) if layout == "NHD" else (kv, block, pad))
    assert not store[..., d:].any()  # head_dim padding holds zeros


@pytest.mark.parametrize("per_head", [False, True])
def test_fp8_cache_reads_what_engines_read(per_head):
    """Stored e4m3(x / scale), read back * scale: the same as tfcompile eval's emulation."""
    torch.manual_seed(0)
    t, kv, d = 20, 2, 32
    k = torch.randn(t, kv, d) * 3
    scale = torch.tensor([0.01, 0.02]) if per_head else torch.tensor([0.015])
    cache = PagedKV(KVFormat("NHD", 16, d, d, "fp8_e4m3"), kv, 8, scale=scale)
    cache.append(0, k)
    assert cache.data.dtype == torch.float8_e4m3fn
    want = fake_quant_fp8(k.transpose(0, 1)[None], scale.reshape(-1, 1, 1) if per_head else scale)[0].transpose(0, 1)
    torch.testing.assert_close(cache.read(0), want, rtol=0, atol=0)


def test_nvfp4_cache_holds_e2m1_with_block16_e4m3_scales():
    torch.manual_seed(0)
    t, kv, d = 9, 2, 32
    k = torch.randn(t, kv, d)
    scale = k.abs().amax().reshape(1) / F.E4M3_MAX
    cache = PagedKV(KVFormat("HND", 4, d, d, "nvfp4"), kv, 8, scale=scale)
    cache.append(0, k)
    assert cache.data.shape[-1] == d // 2 and cache.block_scale.shape[-1] == d // 16
    g = F.nvfp4_global_scale(scale * F.E4M3_MAX)
    want = torch.stack([F.dequantize(F.quantize_nvfp4(k[:, j], global_scale=g)) for j in range(kv)], 1)
    torch.testing.assert_close(cache.read(0), want, rtol=0, atol=0)
    err = (cache.read(0) - k).norm() / k.norm()
    assert 0 < err < 0.2  # E2M1: ~10% relative error on Gaussian data
