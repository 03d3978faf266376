"""Calibration statistics handed from calibration to quantize passes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class CalibStats:
    input_amax: Mapping[str, float]  # Linear module name -> max |x| of its input, over all tokens
    tokens: int  # calibration tokens seen
    source: str  # where the tokens came from, e.g. "random-tokens(seed=0)"
    fallback: tuple[str, ...] = field(default=())  # modules no token reached (scale from a fallback)
    # attention module -> (max|K|, max|V|), float32 [kv_heads] each, post-RoPE as cached
    kv_amax: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    kv_strategy: str | None = None  # None (no KV quantization) | "tensor" | "attn_head"
    kv_format: str = "fp8"  # the KV cache's format: "fp8" (E4M3) | "nvfp4" (E2M1, E4M3 scales per 16)
    # GPTQ: fusion-group key -> H = X^T X / n over that group's (shared) input, float32 [K, K]
    hessians: Mapping[str, Any] = field(default_factory=dict)
    hessian_seconds: Mapping[str, float] = field(default_factory=dict)  # group key -> seconds computing H
    # AWQ: fusion-group key -> calibration.awq_stats.AWQInput (its norm; mean/max |x| per input
    # channel, float32 [K]; sampled input rows, float32 [n, K]) for groups fed by a norm output
    awq: Mapping[str, Any] = field(default_factory=dict)
    awq_skipped: Mapping[str, str] = field(default_factory=dict)  # group key -> why it has no AWQ stats
    layer_seconds: tuple[float, ...] = ()  # layer-by-layer loop: wall seconds per decoder layer
    # MoE (calibration/moe.py): routed tokens per expert "{experts module}.{e}"; whether every token
    # also went through every expert for the statistics; experts below moe_min_tokens take the
    # layer's max over experts (calibration/moe_policy.py) and lose their Hessian (GPTQ -> RTN)
    expert_tokens: Mapping[str, int] = field(default_factory=dict)
    moe_all_experts: bool = False
    moe_min_tokens: int = 0
