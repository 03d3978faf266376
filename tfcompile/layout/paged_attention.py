"""A reference paged attention in plain torch: the KV cache as the descriptor lays it out.

Not a fast kernel: the oracle that the layout transforms are checked against
(tests/layout). It stores K and V the way OUT/tfcompile/kv_cache.json says an
engine does and reads them back through a block table:

- pages: NHD `[num_blocks, block_size, kv_heads, head_dim_padded]` or
  HND `[num_blocks, kv_heads, block_size, head_dim_padded]`, K and V apart
  (vLLM FlashAttention stacks them as (2, num_blocks, block_size, kv_heads, D));
- a block table per sequence: token p lives in page `table[p // block_size]`,
  slot `p % block_size`; pages come from a shuffled free list, so a sequence's
  pages are not contiguous (a wrong index shows up as wrong outputs);
- head_dim padding: zeros past head_dim (q is padded too, so q.k is unchanged);
- dtypes: bf16/fp16/fp32 as is; fp8_e4m3 `e4m3(clamp(x / scale, ±448))` with a
  (1,) or per-KV-head (kv_heads,) dequant multiplier, read back as
  `cache * scale` (what engines do; tfcompile.evaluate.kvcache emulates the same
  in transformers); nvfp4 E2M1 pairs (low nibble first) with one E4M3 scale
  per 16 elements of head_dim computed when the token is written and a global
  multiplier per tensor (tfcompile.kernels.formats.quantize_nvfp4).

Attention is causal over each sequence's cached tokens, GQA by repeating KV
heads (query head h reads KV head h // (H / kv_heads)), softmax in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tfcompile.kernels import formats as F
from tfcompile.schemes import kv_block

_STORE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "fp8_e4m3": torch.float8_e4m3fn}


@dataclass(frozen=True)
class KVFormat:
    layout: str  # "NHD" | "HND"
    block_size: int  # tokens per page
    head_dim: int  # D
    head_dim_padded: int  # Dp >= D, stored
    dtype: str  # bf16 | fp16 | fp32 | fp8_e4m3 | nvfp4


class PagedKV:
    """K or V pages of one layer (one TP shard's KV heads), with per-sequence block tables."""

    def __init__(self, fmt: KVFormat, kv_heads: int, num_blocks: int, *, scale: torch.Tensor | None = None,
                 seed: int = 0):
        if fmt.layout not in ("NHD", "HND"):
            raise ValueError(f"KV layout {fmt.layout!r} is not NHD or HND")
        self.fmt, self.kv_heads = fmt, kv_heads
        bs, dp = fmt.block_size, fmt.head_dim_padded
        page = (bs, kv_heads) if fmt.layout == "NHD" else (kv_heads, bs)
        blk = kv_block(fmt.dtype)  # NVFP4: E2M1 pairs per byte, one E4M3 scale per blk elements
        if blk:
            self.data = torch.zeros((num_blocks,) + page + (dp // 2,), dtype=torch.uint8)
            self.block_scale = torch.zeros((num_blocks,) + page + (dp // blk,), dtype=torch.float8_e4m3fn)
        else:
            self.data = torch.zeros((num_blocks,) + page + (dp,), dtype=_STORE[fmt.dtype])
        self.scale = None if scale is None else scale.float().reshape(-1)  # (1,) or (kv_heads,)
        g = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(num_blocks, generator=g).tolist()  # shuffled: pages not contiguous
        self.tables: dict[int, list[int]] = {}
        self.lens: dict[int, int] = {}

    def _slot(self, seq: int, pos: int) -> tuple[int, int]:
        table = self.tables.setdefault(seq, [])
        while pos // self.fmt.block_size >= len(table):
            if not self.free:
                raise RuntimeError("KV cache out of pages")
            table.append(self.free.pop())
        return table[pos // self.fmt.block_size], pos % self.fmt.block_size

    def append(self, seq: int, x: torch.Tensor) -> None:
        """Write x [T, kv_heads, D] (post-RoPE K, or V) after the sequence's cached tokens."""
        enc = self._encode(x)
        start = self.lens.get(seq, 0)
        for t in range(x.shape[0]):
            blk, off = self._slot(seq, start + t)
            for name, val in enc.items():
                store = getattr(self, name)
                if self.fmt.layout == "NHD":
                    store[blk, off] = val[t]
                else:
                    store[blk, :, off] = val[t]
        self.lens[seq] = start + x.shape[0]

    def read(self, seq: int) -> torch.Tensor:
        """All cached tokens of `seq` as float32 [S, kv_heads, Dp] (dequantized; zero padding kept)."""
        n = self.lens.get(seq, 0)
        pages = torch.tensor(self.tables.get(seq, []), dtype=torch.long)
        parts = {}
        for name in (("data", "block_scale") if kv_block(self.fmt.dtype) else ("data",)):
            p = getattr(self, name)[pages]  # [nb, bs, H, .] or [nb, H, bs, .]
            if self.fmt.layout == "HND":
                p = p.transpose(1, 2)
            parts[name] = p.reshape(-1, *p.shape[2:])[:n]  # [S, H, .]
        return self._decode(parts)

    def _pad(self, x: torch.Tensor) -> torch.Tensor:
        extra = self.fmt.head_dim_padded - x.shape[-1]
        return torch.nn.functional.pad(x, (0, extra)) if extra else x

    def _scale(self) -> torch.Tensor:
        s = self.scale if self.scale is not None else torch.ones(1)
        return s.reshape(-1, 1)  # broadcasts over (kv_heads, Dp)

    def _encode(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self._pad(x.float())
        if self.fmt.dtype == "fp8_e4m3":
            return {"data": F.cast_e4m3(x / self._scale())}
        if kv_block(self.fmt.dtype):
            t, h, dp = x.shape
            g = self._nvfp4_global()
            qs = [F.quantize_nvfp4(x[:, j], global_scale=g[j if g.numel() > 1 else 0].reshape(1))
                  for j in range(h)]  # one global multiplier per KV head slice of the tensor
            return {"data": torch.stack([q.data for q in qs], 1), "block_scale": torch.stack([q.scale for q in qs], 1)}
        return {"data": x.to(_STORE[self.fmt.dtype])}

    def _nvfp4_global(self) -> torch.Tensor:
        """The NVFP4 global multiplier 2688 / amax, with amax = 448 * k_scale (the FP8 scale's amax)."""
        s = self.scale if self.scale is not None else torch.full((1,), 1.0 / 448)
        return F.nvfp4_global_scale(s * F.E4M3_MAX)

    def _decode(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        d = parts["data"]
        if self.fmt.dtype == "fp8_e4m3":
            return d.float() * self._scale()
        if kv_block(self.fmt.dtype):
            s, h = parts["block_scale"], d.shape[1]
            g = self._nvfp4_global()
            cols = []
            for j in range(h):
                q = F.QTensor("nvfp4", d[:, j], s[:, j], g[j if g.numel() > 1 else 0].reshape(1),
                              (d.shape[0], self.fmt.head_dim_padded), "group", None, (16,))
                cols.append(F.dequantize(q, torch.float32))
            return torch.stack(cols, 1)
        return d.float()


def paged_attention(q: torch.Tensor, k_cache: PagedKV, v_cache: PagedKV, seq: int,
                    positions: torch.Tensor, *, window: int | None = None,
                    sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, Hq, D] at absolute `positions` [T] of `seq` -> out [T, Hq, D] (float32; float64 for a float64 q).

    Reads the whole cached sequence (including the tokens just appended) through its
    block table; query t attends to cached positions <= positions[t], and with a sliding
    `window` W only to the last W of them (position > positions[t] - W, as transformers'
    sliding masks). q is zero-padded to the cache's head_dim_padded (so q.k is unchanged),
    the softmax scale is 1/sqrt(D) of the real head dim, and the padded output columns
    (zeros) are dropped. `sinks` [Hq] (GPT-OSS): a learned logit per head that joins each
    softmax and is then dropped, so the probabilities over real keys sum to less than 1."""
    d, dp = q.shape[-1], k_cache.fmt.head_dim_padded
    # float32, or float64 for a float64 q: the exactness checks of tests/layout run in float64 so
    # that summation-order noise cannot move a K/V value across an FP8 rounding boundary
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q = torch.nn.functional.pad(q.to(cdt), (0, dp - d)) if dp > d else q.to(cdt)
    k, v = k_cache.read(seq).to(cdt), v_cache.read(seq).to(cdt)  # [S, Hkv, Dp], read as float32
    hq, hkv = q.shape[1], k.shape[1]
    rep = hq // hkv
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # [S, Hq, D]
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(d)
    pos = torch.arange(k.shape[0])[None, :]
    visible = pos <= positions[:, None]  # [T, S]
    if window:
        visible &= pos > positions[:, None] - window
    scores = scores.masked_fill(~visible[None], float("-inf"))
    if sinks is not None:  # softmax over [scores, sink], the sink column dropped
        sink = sinks.to(scores.dtype).reshape(hq, 1, 1).expand(hq, scores.shape[1], 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hts,shd->thd", probs, v)[..., :d]
