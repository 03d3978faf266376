"""Calibration statistics handed from calibration to quantize passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class CalibStats:
    input_amax: Mapping[str, float]  # Linear module name -> max |x| of its input, over all tokens
    tokens: int  # calibration tokens seen
    source: str  # where the tokens came from, e.g. "random-tokens(seed=0)"
    fallback: tuple[str, ...] = field(default=())  # modules no token reached (scale from a fallback)
