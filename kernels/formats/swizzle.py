"""Blackwell block-scale layout (CUTLASS Sm1xxBlkScaledConfig / SfKMajorAtom,
torchao `to_blocked`): a deployment transform of row-major [M, Kb] scales.

Atoms of 128 rows x 4 K-blocks = 512 bytes. Inside an atom, scale (m, kb)
is at byte (m % 32) * 16 + ((m // 32) % 4) * 4 + (kb % 4); atoms run K-first:
atom = (m // 128) * ceil(Kb / 4) + kb // 4. Rows pad to 128 and Kb to 4 with
zeros. As a view: [M/128, 128, Kb/4, 4] -> [M/128, Kb/4, 4(m//32), 32(m%32), 4]
-> transpose to [M/128, Kb/4, 32, 4, 4] (Triton's `(M/128, Kb/4, 32, 4, 4)`).
"""

from __future__ import annotations

import torch


def _pad(scales: torch.Tensor) -> torch.Tensor:
    m, kb = scales.shape
    pm, pk = -m % 128, -kb % 4
    if pm or pk:
        out = torch.zeros(m + pm, kb + pk, dtype=scales.dtype, device=scales.device)
        out[:m, :kb] = scales
        return out
    return scales


def to_blackwell_scale_layout(scales: torch.Tensor) -> torch.Tensor:
    """[M, Kb] (uint8 E8M0 or float8_e4m3fn) -> flat [ceil(M/128)*128 * ceil(Kb/4)*4], same dtype."""
    if scales.ndim != 2:
        raise ValueError(f"expected 2-D scales [M, Kb], got shape {tuple(scales.shape)}")
    dtype = scales.dtype
    p = _pad(scales.view(torch.uint8) if dtype.itemsize == 1 else scales)
    mp, kp = p.shape
    t = p.reshape(mp // 128, 4, 32, kp // 4, 4)          # [Mt, m//32 % 4, m%32, Kt, kb%4]
    t = t.permute(0, 3, 2, 1, 4)                         # [Mt, Kt, m%32, m//32 % 4, kb%4]
    return t.reshape(-1).view(dtype)


def from_blackwell_scale_layout(sw: torch.Tensor, m: int, kb: int) -> torch.Tensor:
    """Inverse of `to_blackwell_scale_layout`: flat swizzled -> [m, kb] (padding dropped)."""
    mt, kt = -(-m // 128), -(-kb // 4)
    if sw.numel() != mt * kt * 512:
        raise ValueError(f"swizzled scales have {sw.numel()} elements, expected {mt * kt * 512}")
    dtype = sw.dtype
    t = (sw.view(torch.uint8) if dtype.itemsize == 1 else sw).reshape(mt, kt, 32, 4, 4)
    t = t.permute(0, 3, 2, 1, 4).reshape(mt * 128, kt * 4)
    return t[:m, :kb].contiguous().view(dtype)
