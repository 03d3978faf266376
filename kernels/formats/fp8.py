"""FP8 E4M3 with float32 dequant-multiplier scales (w ≈ data * scale, the
compressed-tensors / vLLM direction): scale = amax / 448, data = e4m3(w / scale).

Weights: per tensor (1,), per output channel [N, 1], per 128x128 block
[ceil(N/128), ceil(K/128)] (DeepSeek-V3 / vLLM: the last row/column blocks
are partial, their amax covers only the real elements). A leading expert
dim [E, N, K] prefixes every scale shape (per tensor: [E, 1]).
Activations: static per tensor (calibrated scale), dynamic per token
[..., T, 1] and per 1x128 group [..., T, K/128].
A zero amax gives scale 1.0 (never 0/NaN); NaN/Inf input is a FormatError.
"""

from __future__ import annotations

import torch

from . import fast
from .checks import check_finite, check_input, who
from .elements import E4M3_MAX, cast_e4m3
from .impl import use_fast
from .qtensor import QTensor, expand_block_scale

GRANULARITIES = ("tensor", "channel", "block")


def scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """amax (float32) -> dequant multiplier amax/448; 0 (or underflow) -> 1.0."""
    s = amax.float() / E4M3_MAX
    return torch.where(s == 0, torch.ones_like(s), s)


def _block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """x float [..., N, K] -> [..., ceil(N/bn), ceil(K/bk)] max|x| over each tile."""
    bn, bk = block
    n, k = x.shape[-2:]
    pn, pk = -n % bn, -k % bk
    xp = torch.nn.functional.pad(x.abs(), (0, pk, 0, pn))  # zero padding leaves maxima unchanged
    t = xp.reshape(*x.shape[:-2], (n + pn) // bn, bn, (k + pk) // bk, bk)
    return t.amax(dim=(-3, -1))


def _weight_amax(w: torch.Tensor, gran: str, block, fastpath: bool, name) -> torch.Tensor:
    """max|w| in the shape of the scale for `gran` (NaN/Inf propagate)."""
    lead, (n, k) = w.shape[:-2], w.shape[-2:]
    if gran == "block" and not fastpath:
        return _block_amax(w.float(), block)
    bk = block[1] if gran == "block" else k
    if fastpath:  # per (row, column block) maxima [..., N, ceil(K/bk)], one fused pass
        rows = fast.amax_grid(w, bk, name).reshape(*lead, n, -1)
    else:
        rows = w.float().abs().amax(-1, keepdim=True)
    if gran == "channel":
        return rows
    if gran == "tensor":
        return rows.reshape(*lead, -1).amax(-1, keepdim=True) if lead else rows.amax().reshape(1)
    bn = block[0]  # block, fast path: reduce groups of bn rows (zero-padded)
    rows = torch.nn.functional.pad(rows, (0, 0, 0, -n % bn))
    return rows.reshape(*lead, -1, bn, rows.shape[-1]).amax(-2)


def fp8_weight_scale(w: torch.Tensor, granularity: str = "tensor", *,
                     block: tuple[int, int] = (128, 128), name: str | None = None,
                     impl: str = "auto") -> torch.Tensor:
    """The float32 scale `quantize_fp8` would compute (amax/448, shape of the granularity).

    For callers that must round the scale to a storage dtype before quantizing
    with it (one amax pass, no wasted quantization)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    check_input(w, name, 2, "FP8")
    block = tuple(block) if granularity == "block" else ()
    amax = _weight_amax(w, granularity, block, use_fast(impl, w), name)
    check_finite(amax, name)
    return scale_from_amax(amax)


def weight_amax(w: torch.Tensor, *, name: str | None = None, impl: str = "auto") -> torch.Tensor:
    """max|w| over the whole tensor, float32 (1,); NaN/Inf raise FormatError naming `name`.

    One fused pass on the fast path (no |w| temporary), e.g. for the shared
    NVFP4 global scale of a fused q/k/v group."""
    check_input(w, name, 1, "amax")
    if use_fast(impl, w):
        m = fast.amax_grid(w, w.shape[-1], name).amax().reshape(1)
    else:
        m = w.float().abs().amax().reshape(1)
    check_finite(m, name)
    return m


def _check_scale(scale: torch.Tensor, want: tuple[int, ...], name) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32)
    if tuple(s.shape) != want:
        raise ValueError(f"{who(name)}: scale shape {tuple(s.shape)} != expected {want}")
    if not bool(torch.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"{who(name)}: scale must be finite and > 0")
    return s


def _scale_shape(shape, gran, block) -> tuple[int, ...]:
    lead, (n, k) = tuple(shape[:-2]), shape[-2:]
    if gran == "tensor":
        return lead + (1,)
    if gran == "channel":
        return lead + (n, 1)
    return lead + (-(-n // block[0]), -(-k // block[1]))


def quantize_fp8(w: torch.Tensor, granularity: str = "tensor", *, scale: torch.Tensor | None = None,
                 block: tuple[int, int] = (128, 128), name: str | None = None,
                 impl: str = "auto") -> QTensor:
    """Weight [N, K] or [E, N, K] -> FP8 QTensor; `scale` overrides the computed one."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    check_input(w, name, 2, "FP8")
    block = tuple(block) if granularity == "block" else ()
    fastpath = use_fast(impl, w)
    if scale is None and fastpath and _fused_tiles(w.shape, granularity, block):
        data, s = _quantize_tiles(w, granularity, block, name)
        return QTensor("fp8", data, s, None, tuple(w.shape), granularity, None, block)
    if scale is None:
        amax = _weight_amax(w, granularity, block, fastpath, name)
        check_finite(amax, name)
        s = scale_from_amax(amax)
    else:
        s = _check_scale(scale, _scale_shape(w.shape, granularity, block), name)
    data = _apply(w, s, granularity, block, fastpath, name)
    return QTensor("fp8", data, s, None, tuple(w.shape), granularity, None, block)


def _fused_tiles(shape, gran: str, block) -> bool:
    """Whether the one-pass tile kernel computes this granularity's scales: per channel always; 128 x 128
    blocks when no tile spans two experts of a [E, N, K] weight."""
    return gran == "channel" or (gran == "block" and (len(shape) == 2 or shape[-2] % block[0] == 0))


def _quantize_tiles(w, gran, block, name) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scale) in one pass (fast.fp8_tiles), the scale in the granularity's shape."""
    lead, (n, k) = w.shape[:-2], w.shape[-2:]
    bn, bk = (1, k) if gran == "channel" else block
    data, s = fast.fp8_tiles(w, bn, bk, name)
    return data.reshape(w.shape), s.reshape(*lead, -(-n // bn), -(-k // bk))


def _apply(w, s, gran, block, fastpath, name) -> torch.Tensor:
    """data = cast_e4m3(w / scale broadcast to w)."""
    lead, (n, k) = w.shape[:-2], w.shape[-2:]
    if not fastpath:
        x = w.float()
        if not bool(torch.isfinite(x).all()):  # only reached with a caller-given scale
            check_finite(x.abs().amax(), name)
        if gran == "block":
            return cast_e4m3(x / expand_block_scale(s, tuple(w.shape), block))
        full = s.reshape(*lead, 1, 1) if gran == "tensor" else s
        return cast_e4m3(x / full)
    if gran == "block":  # one scale row per weight row: [..., N, ceil(K/bk)]
        rows, bk = s.repeat_interleave(block[0], dim=-2)[..., :n, :], block[1]
    elif gran == "channel":
        rows, bk = s, k
    else:
        rows, bk = s.reshape(*lead, 1, 1).expand(*lead, n, 1), k
    if gran == "tensor" and not lead:
        rows = s.reshape(1, 1)
    return fast.fp8_rows(w, rows.reshape(-1, rows.shape[-1]), bk, name).reshape(w.shape)


ACT_MODES = ("per_token", "per_group", "static")


def quantize_fp8_act(x: torch.Tensor, mode: str = "per_token", *, scale: torch.Tensor | None = None,
                     group: int = 128, name: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Activation [..., T, K] -> (e4m3 data, float32 scale); x ≈ data * scale.

    static: scale (1,) from calibration (required); per_token: [..., T, 1];
    per_group: [..., T, ceil(K/group)] (1x128 groups, DeepSeek-V3 style).
    """
    if mode not in ACT_MODES:
        raise ValueError(f"mode must be one of {ACT_MODES}, got {mode!r}")
    check_input(x, name, 1, "FP8")
    xf = x.float()
    if mode == "static":
        if scale is None:
            raise ValueError("static FP8 activation quantization needs a calibrated scale")
        s = _check_scale(scale, (1,), name)
        check_finite(xf.abs().amax(), name)
        return cast_e4m3(xf / s), s
    if mode == "per_token":
        amax = xf.abs().amax(-1, keepdim=True)
    else:
        k = x.shape[-1]
        pad = torch.nn.functional.pad(xf.abs(), (0, -k % group))
        amax = pad.reshape(*x.shape[:-1], -1, group).amax(-1)
    check_finite(amax, name)
    s = scale_from_amax(amax)
    return cast_e4m3(xf / expand_act_scale(s, x.shape[-1], group)), s


def expand_act_scale(s: torch.Tensor, k: int, group: int) -> torch.Tensor:
    """Per-token [..., T, 1] stays; per-group [..., T, G] -> [..., T, K]."""
    if s.shape[-1] == 1:
        return s
    return s.repeat_interleave(group, dim=-1)[..., :k]


def dequantize_fp8_act(data: torch.Tensor, scale: torch.Tensor, *, group: int = 128,
                       dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Reference decode of `quantize_fp8_act` output: data * scale (broadcast)."""
    s = scale if scale.numel() == 1 else expand_act_scale(scale, data.shape[-1], group)
    return (data.float() * s).to(dtype)
