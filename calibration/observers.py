"""Activation observers: from the tensors a module sees, one amax for its static scale.

An observer is fed every calibration batch of one module's input (`update`)
and answers the amax the static scale is derived from (`amax`): FP8
input_scale = amax / 448, NVFP4 input_global_scale = 448 * 6 / amax.

- `max`: the largest |x| seen (no clipping; what every peer calls "max").
"""

from __future__ import annotations

from typing import Callable

import torch

OBSERVERS: dict[str, Callable[..., "Observer"]] = {}


def register_observer(name: str):
    def deco(cls):
        OBSERVERS[name] = cls
        return cls

    return deco


class Observer:
    """Base: `update(x)` per batch, `amax()` at the end (None when nothing was seen)."""

    def update(self, x: torch.Tensor) -> None:
        raise NotImplementedError

    def amax(self) -> float | None:
        raise NotImplementedError


@register_observer("max")
class MaxObserver(Observer):
    def __init__(self) -> None:
        self._m: float | None = None

    def update(self, x: torch.Tensor) -> None:
        if x.numel():
            v = float(x.detach().abs().amax().float())
            self._m = v if self._m is None else max(self._m, v)

    def amax(self) -> float | None:
        return self._m


def make_observer(kind: str, **params) -> Observer:
    """A fresh observer of kind `kind` (a key of OBSERVERS)."""
    try:
        cls = OBSERVERS[kind]
    except KeyError:
        raise ValueError(f"unknown observer {kind!r}; known: {', '.join(sorted(OBSERVERS))}") from None
    return cls(**params)
