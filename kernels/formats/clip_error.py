"""A static activation scale's clipping error, as the format quantizes: calibration's mse observer
(calibration/observers.py) asks the format's `ActQuantizer.clip` for it and names no format.

The observer searches the amax c = r * max whose modelled squared error over everything the module
saw is smallest. What it keeps of the stream and how that is quantized under c is the format's:

- `TensorE4M3Clip` (FP8 static, scale c/448): |x| values (a histogram's points), cast to E4M3.
- `BlockE2M1Clip` (NVFP4: the static part is the global scale g = 448 * 6 / c; the block scales are
  dynamic): `block`-element blocks of |x|, each with its E4M3 block scale e4m3(amax_b / 6 * g) and
  E2M1 elements, as kernels/formats/nvfp4.py's reference does step by step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tfcompile.kernels.formats.elements import E2M1_MAX, E4M3_MAX, cast_e4m3


@dataclass(frozen=True)
class ClipModel:
    """`block`: 0, the observer keeps |x| values (a histogram); b > 0, it keeps b-element blocks."""
    block: int = 0

    def sse(self, x: torch.Tensor, w: torch.Tensor, cands: torch.Tensor) -> torch.Tensor:
        """Weighted squared error of the kept points x (values [P], or blocks [k, block] of |x|,
        float32) with weights w ([P] or [k]) under each candidate amax in cands [C] -> [C] float64."""
        raise NotImplementedError


@dataclass(frozen=True)
class TensorE4M3Clip(ClipModel):
    def sse(self, x, w, cands):
        s = (cands / E4M3_MAX)[:, None]  # [C, 1]
        q = cast_e4m3(x[None, :] / s).float() * s  # saturates: values above c become c
        return (((x[None, :] - q) ** 2) * w[None, :]).double().sum(1)


# E2M1 magnitudes and the midpoints between them. Rounding |v| to the nearest with
# bucketize sends a tie down where encode_e2m1 (round-half-even) may send it up; both
# neighbours are equally far, so the squared error, all this is used for, is the same.
_E2M1_MAG = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
_E2M1_MID = (_E2M1_MAG[1:] + _E2M1_MAG[:-1]) / 2


@dataclass(frozen=True)
class BlockE2M1Clip(ClipModel):
    block: int = 16
    chunk: int = 8  # candidates evaluated at once ([chunk, k, block] temporaries)

    def sse(self, x, w, cands):
        out = torch.zeros(cands.numel(), dtype=torch.float64)
        if not x.numel():
            return out
        amax_b = x.amax(1)  # [k]
        for i in range(0, cands.numel(), self.chunk):
            g = (E4M3_MAX * E2M1_MAX / cands[i:i + self.chunk].float())[:, None]  # [c, 1]
            s = cast_e4m3(amax_b[None] / E2M1_MAX * g).float()  # [c, k] block scales, saturating at 448
            s = torch.where(s == 0, torch.ones_like(s), s)  # as the kernel: zero scale -> 1.0
            eff = (s / g)[..., None]  # [c, k, 1] dequant multiplier per block
            q = _E2M1_MAG[torch.bucketize(x[None] / eff, _E2M1_MID)] * eff  # > 6 saturates: clips
            out[i:i + self.chunk] = (((x[None] - q) ** 2).sum(2).double() * w[None]).sum(1)
        return out
