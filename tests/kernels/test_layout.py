"""Blackwell 128x4 scale swizzle: byte-offset formula, torchao to_blocked, inverse."""

import pytest
import torch

from tfcompile.kernels.formats import from_blackwell_scale_layout, to_blackwell_scale_layout


def formula_offset(m: int, kb: int, kb_total: int) -> int:
    """docs/formats.md "Packing and layout" / CUTLASS SfKMajorAtom byte offset."""
    atom = (m // 128) * (-(-kb_total // 4)) + kb // 4
    return atom * 512 + (m % 32) * 16 + ((m // 32) % 4) * 4 + (kb % 4)


def torchao_to_blocked(x: torch.Tensor) -> torch.Tensor:
    """torchao.prototype.mx_formats.utils.to_blocked semantics, re-derived:
    pad to (128, 4) multiples, view as (rb, 128, cb, 4) blocks, per block
    reshape (4, 32, 4) -> transpose to (32, 4, 4), flatten in block order."""
    r, c = x.shape
    rb, cb = -(-r // 128), -(-c // 4)
    p = torch.zeros(rb * 128, cb * 4, dtype=x.dtype)
    p[:r, :c] = x
    blocks = p.view(rb, 128, cb, 4).permute(0, 2, 1, 3)
    return blocks.reshape(-1, 4, 32, 4).transpose(1, 2).reshape(-1)


@pytest.mark.parametrize("m,kb", [(128, 4), (256, 8), (100, 3), (300, 13), (1, 1)])
def test_formula_torchao_and_inverse(m, kb):
    s = torch.randint(1, 255, (m, kb), dtype=torch.uint8)
    sw = to_blackwell_scale_layout(s)
    assert sw.numel() == -(-m // 128) * 128 * -(-kb // 4) * 4
    for i in range(m):
        for j in range(kb):
            assert sw[formula_offset(i, j, kb)] == s[i, j]
    assert int((sw != 0).sum()) == m * kb  # padding is zeros
    assert torch.equal(sw, torchao_to_blocked(s))
    assert torch.equal(from_blackwell_scale_layout(sw, m, kb), s)


def test_e4m3_dtype_kept():
    s = torch.rand(130, 6).to(torch.float8_e4m3fn)
    sw = to_blackwell_scale_layout(s)
    assert sw.dtype == torch.float8_e4m3fn
    assert torch.equal(from_blackwell_scale_layout(sw, 130, 6).view(torch.uint8), s.view(torch.uint8))
