"""Per-scheme quantizers: everything that differs between formats, in one object each.

A `WeightQuantizer` (one per weight format, `weight_quantizer(format, granularity, block)`)
and an `ActQuantizer` (one per activation treatment, `act_quantizer(kind)`) are what every
consumer calls: the quantize pass and its algorithms (RTN, MSE, GPTQ, AWQ), distillation's
fake quantization, `tfcompile eval`'s emulation and the runtime's. No caller branches on a
format name; a new format is one class here (and its numerics in its own module).

Weights (`WeightQuantizer`):
- facts every consumer asks instead of a table keyed by format name (docs/design.md "Where a
  format's facts go"): `element`, `element_bits`, `block`, `block_scaled`, `packed`,
  `k_multiple`, `bits_per_weight` (scales included), `shares_global_scale`, `scale_dtype`,
  `scale_shape`; `quantizer_from_stored` recognises a format from a checkpoint's stored layout.
- `quantize(w, global_scale=, rule=, scale_dtype=)` -> QTensor, as the artifact stores it.
  FP8 scales are stored in the model dtype (as compressed-tensors does): the fp32 scale
  amax/448 is rounded *up* to `scale_dtype` (`round_scale_up`) and the weight is quantized
  with that stored value, so data and scale agree bit for bit.
- `group_global_scale(weights)`: NVFP4 gives a fusion group (q/k/v, gate/up, expert w1/w3)
  one global scale, 2688 / the group's max |w| (engines otherwise take the max at load time
  and lose accuracy); per-tensor FP8 gives it one weight scale, the members' largest
  amax/448, so every member is quantized with the scale vLLM serves the fused layer with
  (`requantize_with_max_scale` is then the identity; docs/interop.md); None for the others.
- `multipliers(q)` / `encode(values)`: the fixed-scale view GPTQ works in (each element's
  dequant multiplier, and values already on the element grid back to stored data).
Activations (`ActQuantizer`, keyed by `Scheme.act`):
- `static_scale(amax, dtype)`: the stored input scale of a calibrated amax (NVFP4:
  `input_global_scale` = 2688/amax, float32; FP8: `input_scale` = amax/448 rounded up to the
  model dtype); `fake_quant(x, scale)`: x -> dequantize(quantize(x)) as an engine runs it
  (dynamic MX per 1x32 block, FP8 per token or per 1x128 group), in x's dtype.
Rules and sources: docs/formats.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .clip_error import BlockE2M1Clip, ClipModel, TensorE4M3Clip
from .elements import E4M3_MAX, cast_e4m3, decode_e8m0, encode_e2m1, round_e2m1
from .fp8 import dequantize_fp8_act, fp8_weight_scale, quantize_fp8, quantize_fp8_act, weight_amax
from .mx import DEFAULT_MX_RULE, DEFAULT_MXFP8_RULE, quantize_mx_act, quantize_mxfp4, quantize_mxfp8
from .nvfp4 import nvfp4_global_scale, quantize_nvfp4, quantize_nvfp4_act
from .packing import pack_fp4
from .qtensor import QTensor, dequantize

MIN_FP8_SCALE = 1e-12  # an all-zero input's static FP8 scale (never 0)
ELEMENT_BITS = {"e2m1": 4, "e4m3": 8}  # WeightQuantizer.element -> bits per stored element


def round_scale_up(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The smallest `dtype` values >= the fp32 scales (rounding down would clip the amax)."""
    s = scale.to(dtype)
    low = s.float() < scale
    return torch.where(low, torch.nextafter(s, torch.full_like(s, float("inf"))), s)


@dataclass(frozen=True)
class WeightQuantizer:
    """A weight format: how a Linear's [N, K] weight is quantized and stored."""

    format: str  # QTensor.format: "nvfp4" | "mxfp4" | "mxfp8" | "fp8"
    granularity: str  # "group" (per-block scales along K), or fp8's "tensor" | "channel" | "block"
    block: tuple[int, ...]  # elements per scale along K (group) or (N, K) (fp8 block)
    packed: bool  # two E2M1 codes per byte (`weight_packed`)
    element: str  # element grid: "e2m1" | "e4m3"
    k_multiple: int  # K must be a multiple of this (packing and scale blocks)
    default_rule: str = DEFAULT_MX_RULE  # MX shared-exponent rule unless the recipe names one
    has_rule: bool = False  # the MX formats record their rule in the manifest

    @property
    def element_bits(self) -> int:
        """Bits of one stored element (E2M1: 4, two per byte; E4M3: 8)."""
        return ELEMENT_BITS[self.element]

    @property
    def block_scaled(self) -> bool:
        """One 8-bit scale per `block[0]` elements along K (NVFP4, MX); FP8's scales are per
        tensor, channel or 128x128 tile."""
        return self.granularity == "group"

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales included: the element bits plus one 8-bit scale per block
        (NVFP4 4 + 8/16 = 4.5, MXFP4 4.25, MXFP8 8.25); FP8's scales are < 0.01 bits: 8.0."""
        return self.element_bits + (8 / self.block[0] if self.block_scaled else 0.0)

    @property
    def shares_global_scale(self) -> bool:
        """Fusion groups share one global scale (NVFP4's 2688 / amax)."""
        return False

    def group_global_scale(self, weights: Sequence[torch.Tensor],
                           names: Sequence[str | None] = ()) -> torch.Tensor | None:
        return None

    def quantize(self, w: torch.Tensor, *, global_scale: torch.Tensor | None = None, rule: str = "",
                 scale_dtype: torch.dtype = torch.float32, name: str | None = None,
                 impl: str = "auto") -> QTensor:
        raise NotImplementedError

    def stored_scale(self, q: QTensor, model_dtype: torch.dtype) -> torch.Tensor:
        """`weight_scale` as the artifact stores it (its own dtype; FP8: the model dtype)."""
        return q.scale

    def scale_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        raise NotImplementedError

    def scale_shape(self, n: int, k: int) -> tuple[int, ...]:
        return (n, k // self.block[0])

    def from_stored(self, data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor | None,
                    shape: tuple[int, int]) -> QTensor:
        """The QTensor of a Linear from its stored tensors (`quantize`'s data, `stored_scale`)."""
        return QTensor(self.format, data, scale, None, shape, self.granularity, None, self.block)

    def multipliers(self, q: QTensor) -> torch.Tensor:
        """Each element's dequant multiplier [N, K] (float32) under q's fixed scales."""
        raise NotImplementedError

    def round_to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """Values on the element grid (RNE, saturating), float32."""
        if self.element == "e2m1":
            return round_e2m1(x)  # = decode_e2m1(encode_e2m1(x)), faster (elements.py)
        return cast_e4m3(x).float()

    def encode(self, values: torch.Tensor) -> torch.Tensor:
        """Element values already on the grid -> the stored data tensor."""
        if self.packed:
            return pack_fp4(encode_e2m1(values))
        return cast_e4m3(values)


@dataclass(frozen=True)
class NVFP4Weights(WeightQuantizer):
    @property
    def shares_global_scale(self) -> bool:
        return True

    def group_global_scale(self, weights, names=()):
        names = list(names) or [None] * len(weights)
        amax = torch.cat([weight_amax(w, name=n) for w, n in zip(weights, names)]).amax()
        return nvfp4_global_scale(amax.reshape(1))

    def quantize(self, w, *, global_scale=None, rule="", scale_dtype=torch.float32, name=None, impl="auto"):
        return quantize_nvfp4(w, global_scale=global_scale, name=name, impl=impl)

    def scale_dtype(self, model_dtype):
        return torch.float8_e4m3fn

    def from_stored(self, data, scale, global_scale, shape):
        return QTensor(self.format, data, scale, global_scale.float().reshape(1), shape, "group", None, self.block)

    def multipliers(self, q):
        return (q.scale.float() / q.global_scale.float().reshape(-1, 1)).repeat_interleave(self.block[0], 1)


@dataclass(frozen=True)
class MXWeights(WeightQuantizer):
    def quantize(self, w, *, global_scale=None, rule="", scale_dtype=torch.float32, name=None, impl="auto"):
        fn = quantize_mxfp4 if self.packed else quantize_mxfp8
        return fn(w, rule=rule or self.default_rule, name=name, impl=impl)

    def scale_dtype(self, model_dtype):
        return torch.uint8  # E8M0

    def multipliers(self, q):
        return decode_e8m0(q.scale).repeat_interleave(self.block[0], 1)


@dataclass(frozen=True)
class FP8Weights(WeightQuantizer):
    def group_global_scale(self, weights, names=()):
        """Per-tensor: the fused group's one fp32 scale, the largest member's amax/448 (shape of one
        member's). vLLM fuses q/k/v and gate/up (and an expert's w1/w3) into one Linear with one
        per-tensor scale, requantizing every member to the largest (vllm/model_executor/layers/
        quantization/utils/w8a8_utils.py `requantize_with_max_scale`); written with it, the
        artifact is served as it is. Channel and block scales are concatenated as they are: None."""
        if self.granularity != "tensor":
            return None
        names = list(names) or [None] * len(weights)
        scales = [fp8_weight_scale(w, "tensor", name=n) for w, n in zip(weights, names)]
        return torch.stack([s.reshape(()) for s in scales]).amax().reshape(scales[0].shape)

    def quantize(self, w, *, global_scale=None, rule="", scale_dtype=torch.float32, name=None, impl="auto"):
        block = self.block or (128, 128)
        own = global_scale is None or self.granularity != "tensor"  # else the fused group's (group_global_scale)
        scale = fp8_weight_scale(w, self.granularity, block=block, name=name, impl=impl) if own else global_scale
        stored = round_scale_up(scale.float(), scale_dtype)
        return quantize_fp8(w, self.granularity, scale=stored.float(), block=block, name=name, impl=impl)

    def stored_scale(self, q, model_dtype):
        return q.scale.to(model_dtype)

    def scale_dtype(self, model_dtype):
        return model_dtype

    def from_stored(self, data, scale, global_scale, shape):
        s = scale.float()
        s = s.reshape(1) if self.granularity == "tensor" else s
        block = self.block if self.granularity == "block" else ()
        return QTensor(self.format, data, s, None, shape, self.granularity, None, block)

    def scale_shape(self, n, k):
        if self.granularity == "tensor":
            return (1,)
        if self.granularity == "channel":
            return (n, 1)
        bn, bk = self.block
        return (-(-n // bn), -(-k // bk))

    def multipliers(self, q):
        n, k = q.shape
        s = q.scale.float()
        if self.granularity == "tensor":
            return s.reshape(1, 1).expand(n, k)
        if self.granularity == "channel":
            return s.reshape(n, 1).expand(n, k)
        bn, bk = q.block
        return s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]


def _nvfp4(granularity: str, block: tuple[int, ...]) -> WeightQuantizer:
    return NVFP4Weights("nvfp4", "group", (16,), True, "e2m1", 16)


def _mxfp4(granularity: str, block: tuple[int, ...]) -> WeightQuantizer:
    return MXWeights("mxfp4", "group", (32,), True, "e2m1", 32, DEFAULT_MX_RULE, True)


def _mxfp8(granularity: str, block: tuple[int, ...]) -> WeightQuantizer:
    return MXWeights("mxfp8", "group", (32,), False, "e4m3", 32, DEFAULT_MXFP8_RULE, True)


def _fp8(granularity: str, block: tuple[int, ...]) -> WeightQuantizer:
    return FP8Weights("fp8", granularity, tuple(block), False, "e4m3", 1)


# weight format -> factory(granularity, block)
WEIGHT_FORMATS = {"nvfp4": _nvfp4, "mxfp4": _mxfp4, "mxfp8": _mxfp8, "fp8": _fp8}


@functools.lru_cache(maxsize=None)
def weight_quantizer(fmt: str, granularity: str = "group", block: tuple[int, ...] = ()) -> WeightQuantizer:
    """The quantizer of weight format `fmt` (fp8: per `granularity`, with `block` for "block")."""
    try:
        return WEIGHT_FORMATS[fmt](granularity, block)
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; expected one of {sorted(WEIGHT_FORMATS)}") from None


def quantizer_from_stored(packed: bool, scale: torch.Tensor, shape: tuple[int, int]) -> WeightQuantizer:
    """Which weight format wrote a Linear, from how it is stored (a compressed-tensors checkpoint): packed E2M1 pairs with E4M3
    scales (NVFP4) or E8M0 ones (MXFP4); E4M3 elements with E8M0 scales (MXFP8) or float
    scales per tensor, per channel or per block (FP8; the block from the scale grid)."""
    if packed:
        return weight_quantizer("nvfp4" if scale.dtype == torch.float8_e4m3fn else "mxfp4")
    if scale.dtype == torch.uint8:
        return weight_quantizer("mxfp8")
    n, k = shape
    if scale.numel() == 1:
        return weight_quantizer("fp8", "tensor")
    if tuple(scale.shape) == (n, 1):
        return weight_quantizer("fp8", "channel")
    return weight_quantizer("fp8", "block", (-(-n // scale.shape[0]), -(-k // scale.shape[1])))


def quantizer_of(q: QTensor) -> WeightQuantizer:
    """The weight quantizer that made `q` (its format, granularity and block)."""
    return weight_quantizer(q.format, q.granularity, tuple(q.block) if q.granularity == "block" else ())


@dataclass(frozen=True)
class ActQuantizer:
    """How a Linear's input is quantized (a `Scheme.act` kind)."""

    kind: str
    static: bool  # a calibrated scale is stored in the artifact
    scale_name: str | None = None  # that tensor's suffix, e.g. "input_scale"
    clip: ClipModel | None = None  # a static scale's clipping error, for calibration's mse observer

    def static_scale(self, amax: float, dtype: torch.dtype) -> torch.Tensor:
        """The stored static scale of a calibrated input amax (static kinds)."""
        raise ValueError(f"activation kind {self.kind!r} has no static scale")

    def scale_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return model_dtype

    def fake_quant(self, x: torch.Tensor, scale: torch.Tensor | None = None, *, name: str | None = None,
                   impl: str = "auto") -> torch.Tensor:
        """dequantize(quantize(x)) in x's dtype; `scale` is the stored static scale (static kinds)."""
        raise NotImplementedError

    def emulate(self, amax: float | None, dtype: torch.dtype, *, name: str | None = None,
                impl: str = "auto") -> Callable[[torch.Tensor], torch.Tensor]:
        """x -> fake_quant(x) with the static scale the artifact stores for a calibrated `amax`
        (in the model dtype `dtype`); dynamic kinds ignore `amax`."""
        scale = self.static_scale(amax, dtype) if self.static else None
        return lambda x: self.fake_quant(x, scale, name=name, impl=impl)


@dataclass(frozen=True)
class NVFP4Acts(ActQuantizer):
    def static_scale(self, amax, dtype):
        return nvfp4_global_scale(torch.tensor([float(amax)], dtype=torch.float32))

    def scale_dtype(self, model_dtype):
        return torch.float32

    def fake_quant(self, x, scale=None, *, name=None, impl="auto"):
        g = scale.detach().float().reshape(1)
        return dequantize(quantize_nvfp4_act(x, g, name=name, impl=impl)).to(x.dtype)


@dataclass(frozen=True)
class MXActs(ActQuantizer):
    elem: str = "fp4"

    def fake_quant(self, x, scale=None, *, name=None, impl="auto"):
        return dequantize(quantize_mx_act(x, self.elem, name=name, impl=impl)).to(x.dtype)


@dataclass(frozen=True)
class FP8Acts(ActQuantizer):
    mode: str = "per_token"  # formats.fp8 ACT_MODES: "static" | "per_token" | "per_group"
    group: int = 128

    def static_scale(self, amax, dtype):
        s = torch.tensor([float(amax) / E4M3_MAX]).clamp_min(MIN_FP8_SCALE)
        return round_scale_up(s, dtype)

    def fake_quant(self, x, scale=None, *, name=None, impl="auto"):
        s = scale.detach().float().reshape(1) if scale is not None else None
        data, ds = quantize_fp8_act(x, self.mode, scale=s, group=self.group, name=name)
        return dequantize_fp8_act(data, ds, group=self.group, dtype=x.dtype)


# Scheme.act -> its quantizer
ACT_KINDS: dict[str, ActQuantizer] = {
    "nvfp4": NVFP4Acts("nvfp4", True, "input_global_scale", BlockE2M1Clip(16)),
    "mxfp4": MXActs("mxfp4", False, elem="fp4"),
    "mxfp8": MXActs("mxfp8", False, elem="fp8"),
    "fp8-static": FP8Acts("fp8-static", True, "input_scale", TensorE4M3Clip(), mode="static"),
    "fp8-token": FP8Acts("fp8-token", False, mode="per_token"),
    "fp8-group128": FP8Acts("fp8-group128", False, mode="per_group"),
}


def act_quantizer(kind: str | None) -> ActQuantizer | None:
    """The quantizer of activation kind `kind`; None for weight-only schemes (kind None)."""
    if kind is None:
        return None
    try:
        return ACT_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown activation scheme {kind!r}; expected one of {sorted(ACT_KINDS)}") from None
