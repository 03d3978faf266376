"""Quantization schemes: what a `--format` name means, in one table.

A scheme ties together the weight encoding (kernels/formats; `Scheme.weights` is
its quantizer), the activation treatment (`Scheme.acts`), the compressed-tensors preset that vLLM/SGLang read, and the
modelopt `quant_algo` (and `group_size`, `config_groups` bits) that TensorRT-LLM reads. Consumers
ask the scheme (`bits_per_weight`, `k_multiple`, ...), never a table keyed by its name
(tests/test_format_literals.py). Names follow llm-compressor's
presets (`NVFP4` is W4A4, `NVFP4A16` weight-only, ...) so users recognise them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tfcompile.errors import RecipeError

if TYPE_CHECKING:  # the table itself is read at CLI start-up and by the manifest check, without torch
    from tfcompile.kernels.formats.quantizer import ActQuantizer, WeightQuantizer


@dataclass(frozen=True)
class Scheme:
    name: str  # CLI name, e.g. "nvfp4a16"
    weight: str  # kernels/formats format: "nvfp4" | "mxfp4" | "mxfp8" | "fp8"
    granularity: str  # fp8: "tensor" | "channel" | "block"; block formats: "group"
    block: tuple[int, ...]  # elements per scale along (N, K) or K
    act: str | None  # None = weight-only; else how activations are quantized
    act_static: bool  # True: a calibrated input scale is stored in the artifact
    ct_preset: str  # compressed_tensors.quantization.quant_scheme.PRESET_SCHEMES key
    ct_format: str  # compressed-tensors CompressionFormat value
    modelopt_algo: str | None  # hf_quant_config.json quant_algo, spelled as modelopt 0.47 writes it
    summary: str
    modelopt_group_size: int | None = None  # hf_quant_config.json quantization.group_size (None: omitted)
    modelopt_group_bits: int | None = None  # config_groups' num_bits (None: modelopt writes no config_groups)

    @property
    def weights(self) -> WeightQuantizer:
        """The weight format's quantizer (tfcompile.kernels.formats.quantizer)."""
        from tfcompile.kernels.formats.quantizer import weight_quantizer  # lazy: kernels.formats imports torch

        return weight_quantizer(self.weight, self.granularity, self.block)

    @property
    def acts(self) -> ActQuantizer | None:
        """The activation quantizer; None for weight-only schemes."""
        from tfcompile.kernels.formats.quantizer import act_quantizer  # lazy: kernels.formats imports torch

        return act_quantizer(self.act)

    @property
    def packed(self) -> bool:
        """4-bit formats store two codes per byte as `weight_packed`."""
        return self.weights.packed

    @property
    def bits_per_weight(self) -> float:
        """Stored bits per weight, scales included (the weight format's; mixed precision's cost)."""
        return self.weights.bits_per_weight

    @property
    def k_multiple(self) -> int:
        """K (in_features) must be a multiple of this (packing and scale blocks)."""
        return self.weights.k_multiple

    @property
    def shares_global_scale(self) -> bool:
        """NVFP4 engines need q/k/v and gate/up to share one global scale."""
        return self.weights.shares_global_scale


_SCHEMES = (
    Scheme("nvfp4", "nvfp4", "group", (16,), "nvfp4", True, "NVFP4",
           "nvfp4-pack-quantized", "NVFP4",
           "NVFP4 weights and activations (W4A4); Blackwell FP4 tensor cores",
           modelopt_group_size=16, modelopt_group_bits=4),
    Scheme("nvfp4a16", "nvfp4", "group", (16,), None, False, "NVFP4A16",
           "nvfp4-pack-quantized", "W4A16_NVFP4",
           "NVFP4 weights, bf16 activations (W4A16); runs on Hopper too",
           modelopt_group_size=16, modelopt_group_bits=4),
    Scheme("mxfp4", "mxfp4", "group", (32,), "mxfp4", False, "MXFP4",
           "mxfp4-pack-quantized", "mxfp4",
           "MXFP4 weights and dynamic MXFP4 activations (W4A4)"),
    Scheme("mxfp4a16", "mxfp4", "group", (32,), None, False, "MXFP4A16",
           "mxfp4-pack-quantized", "mxfp4",
           "MXFP4 weights, bf16 activations (W4A16, GPT-OSS style)"),
    Scheme("mxfp8", "mxfp8", "group", (32,), "mxfp8", False, "MXFP8",
           "mxfp8-quantized", "MXFP8",
           "MXFP8 weights and dynamic MXFP8 activations", modelopt_group_size=32),
    Scheme("fp8", "fp8", "tensor", (), "fp8-static", True, "FP8",
           "float-quantized", "FP8",
           "FP8 E4M3 weights and static per-tensor activation scales", modelopt_group_bits=8),
    Scheme("fp8-dynamic", "fp8", "channel", (), "fp8-token", False, "FP8_DYNAMIC",
           "float-quantized", "FP8_PER_CHANNEL_PER_TOKEN",
           "FP8 per-channel weights, dynamic per-token activations"),
    Scheme("fp8-block", "fp8", "block", (128, 128), "fp8-group128", False, "FP8_BLOCK",
           "float-quantized", "fp8_pb_wo",
           "FP8 128x128-block weights, dynamic 1x128 activations (DeepSeek style)"),
)

SCHEMES: dict[str, Scheme] = {s.name: s for s in _SCHEMES}


def format_name(name):
    """A --format as given (any case, stray spaces) -> the scheme name (lower case); others as they are."""
    return name.strip().lower() if isinstance(name, str) else name


def get_scheme(name: str) -> Scheme:
    try:
        return SCHEMES[format_name(name)]
    except KeyError:
        raise RecipeError(
            f"unknown format {name!r}",
            hint="choose one of: " + ", ".join(SCHEMES),
        ) from None


@dataclass(frozen=True)
class KVFormat:
    """A KV-cache format (`--kv-cache`, calibrate.kv_cache, Program.kv_format): what the engine
    views and the configs call it. Both calibrate k_scale / v_scale (amax / 448)."""

    name: str  # "fp8" | "nvfp4"
    dtype: str  # the engines' KV dtype: layout kv_dtype, manifest scheme.kv_cache.dtype, eval report
    modelopt_algo: str  # hf_quant_config.json kv_cache_quant_algo
    # compressed-tensors preset whose input_activations describe the cache (NVFP4: E2M1, E4M3 scales
    # per 16, computed at run time); None: FP8's own kv_cache_scheme per strategy
    ct_preset: str | None
    per_head: bool  # k_scale / v_scale may be per KV head (FP8); NVFP4: one global scale per tensor
    # elements of head_dim per block scale, computed when a token is written (NVFP4: 16 E2M1
    # elements, two per byte, one E4M3 scale); 0: the calibrated scale alone (FP8)
    block: int = 0
    # how the engine encodes a token as it writes it: the KV-cache descriptor's `KV_ENCODING_FIELD`
    # section (tfcompile/layout/descriptor.py), (field, value) pairs; () when the scales say it all
    encoding: tuple[tuple[str, Any], ...] = ()


KV_FORMATS: dict[str, KVFormat] = {k.name: k for k in (
    KVFormat("fp8", "fp8_e4m3", "FP8", None, per_head=True),
    KVFormat("nvfp4", "nvfp4", "NVFP4", "NVFP4", per_head=False, block=16, encoding=(
        ("block", 16), ("block_scale", "e4m3, per 16 elements of head_dim, computed when a token is written"),
        ("global_scale", "6 / k_scale (multiplier; amax / 2688 as a divisor)"),
        ("element", "e2m1, two per byte, low nibble first"))),
)}
KV_BY_DTYPE: dict[str, KVFormat] = {k.dtype: k for k in KV_FORMATS.values()}  # by the engines' KV dtype
# kv_cache.json's field for the encoding section (schema 1 named it after the one format that has
# one; null for every other KV dtype)
KV_ENCODING_FIELD = "nvfp4"


def kv_encoding(dtype: str) -> dict | None:
    """The KV-cache descriptor's encoding section for engine KV dtype `dtype` (None: none)."""
    fmt = KV_BY_DTYPE.get(dtype)
    return dict(fmt.encoding) if fmt is not None and fmt.encoding else None


def kv_block(dtype: str) -> int:
    """Elements per block scale of engine KV dtype `dtype` (0: not block-scaled, or not quantized)."""
    fmt = KV_BY_DTYPE.get(dtype)
    return fmt.block if fmt is not None else 0


def get_kv_format(name: str) -> KVFormat:
    try:
        return KV_FORMATS[name]
    except KeyError:
        raise RecipeError(f"unknown KV-cache format {name!r}", hint="choose one of: " + ", ".join(KV_FORMATS)) from None


# Named recipes (`--preset NAME`, a release pipeline's one word for "the most accurate we know"):
# per format, the pass settings (in --set syntax) of the method with the lowest held-out KL measured on
# SmolLM2-135M-Instruct (KL, not perplexity: on its 8192 held-out tokens perplexity differences of a
# point or two are inside the spread of equally valid solutions; docs/accuracy.md "SmolLM2-135M-Instruct:
# the `best` preset" gives each row and its figures). A format without an entry keeps its own defaults.
# They are the lowest layer of the recipe: --recipe, the options and --set override them.
_GPTQ_FOS_128 = ("quantize.algorithm=gptq", "quantize.nvfp4_scales=four_over_six", "calibrate.samples=128",
                 "calibrate.seq_len=512")
_ROTATE_GPTQ = ("quantize.algorithm=gptq", "rotate.kind=hadamard", "calibrate.seq_len=512")
PRESETS: dict[str, dict[str, tuple[str, ...]]] = {"best": {
    "nvfp4a16": _GPTQ_FOS_128,
    "nvfp4": _GPTQ_FOS_128,
    "mxfp4a16": _ROTATE_GPTQ,
    "mxfp4": _ROTATE_GPTQ,
}}


# `tfcompile distill --preset best` (a run with the distill pass): per format, the distillation measured best on
# SmolLM2-135M-Instruct (docs/accuracy.md "SmolLM2: quantization-aware distillation" and "... on other text"):
# 120 AdamW steps of 4 x 256 tokens at lr 1e-4, KL, from the checkpoint's own weights (RTN's start: a lower
# perplexity than from GPTQ's start on every text and format measured; on W4A4 a lower KL too). NVFP4 trains with
# four over six in the student and 16 x 512 calibration tokens for the activations' scales. Other formats keep
# the distill defaults. A GPTQ start stays one option away (distill.init=gptq: tfcompile/cli/distill_start.py).
DISTILL_STARTS = ("gptq",)  # distill.init values that name an algorithm whose artifact the run builds first
_DISTILL = ("distill.steps=120", "distill.batch=4", "distill.seq_len=256", "distill.lr=1e-4")
DISTILL_PRESETS: dict[str, dict[str, tuple[str, ...]]] = {"best": {
    "nvfp4a16": _DISTILL,
    "nvfp4": ("calibrate.seq_len=512", *_DISTILL, "quantize.nvfp4_scales=four_over_six"),  # 4/6 in the student
    "mxfp4a16": _DISTILL,
    "mxfp4": _DISTILL,
}}


def preset_sets(preset: str, fmt: str, distill: bool = False) -> tuple[str, ...]:
    """The `--set` edits of `--preset preset` for `fmt` (empty: the format's defaults are its best);
    `distill`: for a run that distills (DISTILL_PRESETS), else for post-training quantization."""
    if preset not in PRESETS:
        raise RecipeError(f"unknown preset {preset!r}", hint="choose one of: " + ", ".join(PRESETS))
    return (DISTILL_PRESETS if distill else PRESETS)[preset].get(format_name(fmt), ())
