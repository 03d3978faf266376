"""Shared helpers for the format tests: independent oracles only.

Oracles: ml_dtypes (float4_e2m1fn, float8_e4m3fn, float8_e8m0fnu), torch's
float8 dtypes, compressed-tensors (pack/unpack, NVFP4/MXFP4 compressors).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def ml_e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """ml_dtypes RNE+saturating cast to float4_e2m1fn, returned as uint8 codes."""
    a = x.float().numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    return torch.from_numpy(a.copy())


def ml_e4m3_bytes(x: torch.Tensor) -> torch.Tensor:
    """ml_dtypes cast to float8_e4m3fn of x clamped to ±448 (saturation), as bytes."""
    a = x.float().clamp(-448, 448).numpy().astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return torch.from_numpy(a.copy())


def ml_e8m0_values() -> np.ndarray:
    return np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu).astype(np.float32)


def heavy_tailed(shape, df: int = 3, seed: int = 0) -> torch.Tensor:
    """Student-t(df) samples: z / sqrt(chi2_df / df), chi2 as a sum of df squared normals."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g)
    chi = sum(torch.randn(shape, generator=g) ** 2 for _ in range(int(df)))
    return z / torch.sqrt(chi / df)


def sqnr_db(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    return float(10 * torch.log10((x ** 2).sum() / ((x - y) ** 2).sum()))
