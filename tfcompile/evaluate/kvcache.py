"""KV-cache emulation: attention reads K and V as an FP8 (or NVFP4) cache would return them.

An artifact quantized with `--kv-cache fp8` carries `kv_cache_scheme` in
config.json's quantization_config and, per attention module, `k_scale` and
`v_scale` (dequant multipliers, model dtype; shape (1,) per tensor or
(kv_heads, 1, 1) per KV head). An engine writes `e4m3(K / k_scale)` into its
cache and attends over `cache * k_scale` — for the new tokens too, since
prefill attention reads the cache it has just written. We emulate that in
float: every attention call gets

    K' = e4m3(clamp(K / k_scale, -448, 448)) * k_scale    (and V' likewise)

with K, V the key/value states *after* RoPE and q/k norms, shaped
(batch, kv_heads, seq, head_dim) — what transformers 5 hands an
`AttentionInterface` function. The scale broadcasts over that shape: (1,)
everywhere, (kv_heads, 1, 1) per head. Rounding is
`tfcompile.kernels.formats.cast_e4m3` (torch's float8_e4m3fn cast after the
clamp: round-to-nearest-even, saturating at ±448). The query and the
attention arithmetic stay in the compute dtype.

The attention function is registered once under `KV_EMULATOR` and looks its
scales up by module object, so only the candidate model (selected with
`set_attn_implementation`) is emulated and modules without scales pass
straight to SDPA. Attention is found through `AttentionInterface`, never by a
forward argument's name (see calibration/kv.py for why).

An NVFP4 cache (`--kv-cache nvfp4`; kv_cache_scheme = compressed-tensors' NVFP4 arguments) is
emulated the same way with `fake_quant_nvfp4`: E2M1 elements in blocks of 16 along head_dim,
E4M3 block scales computed as the cache is written, global dequant multiplier k_scale / 6.

MLA layers (DeepSeek-V3, Kimi K2) cache the latent c_kv and the RoPE key k_pe
(tfcompile/families/attention.py): there the emulation wraps the module's
`expand_kv`, which receives exactly that pair, and rounds both through FP8 with the
layer's `k_scale` (one scale for the entry, as vLLM's `concat_and_cache_mla`); K and V
are then expanded from the rounded latent by kv_b_proj, as an engine expands them.
Every other attention call goes to the model's own attention function (SDPA, or the
architecture's eager one: GPT-OSS's sinks), not always SDPA.

compressed-tensors + transformers do not attach k_scale / v_scale on load
(docs/interop.md), so the scales are read from the artifact's safetensors here.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch
from torch import nn

from tfcompile.evaluate.errors import EvalError
from tfcompile.evaluate.kvtext import KV_MODES, STRATEGIES, describe
from tfcompile.families.attention import is_mla, register_wrapper
from tfcompile.kernels.formats import cast_e4m3, dequantize, quantize_nvfp4_act
from tfcompile.schemes import get_kv_format

KV_EMULATOR = "tfcompile_kv_fp8_emulation"
KINDS = ("k_scale", "v_scale")

# attention module -> its emulator entry; weak, so a dropped model releases it
_ACTIVE: "weakref.WeakKeyDictionary[nn.Module, _Entry]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class KVScales:
    """The artifact's KV-cache scales: attention module name -> (k_scale, v_scale), float32,
    (1,) per tensor or (kv_heads, 1, 1) per KV head."""
    strategy: str  # "tensor" | "attn_head"
    scales: Mapping[str, tuple[torch.Tensor, torch.Tensor]]
    fmt: str = "fp8"  # "fp8" (E4M3) | "nvfp4" (E2M1 in blocks of 16 along head_dim, E4M3 block scales)

    @property
    def dtype(self) -> str:
        return get_kv_format(self.fmt).dtype


def fake_quant_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (B, H_kv, S, D) -> e4m3(clamp(x / scale)) * scale, in x's dtype.

    scale: float32, (1,) or (H_kv, 1, 1) (broadcasts over batch, seq and head_dim).
    Division, not multiplication by 1/scale: that is what engines do, and the
    two differ in the last bit."""
    scale = scale.to(x.device)
    return (cast_e4m3(x.float() / scale).float() * scale).to(x.dtype)


def fake_quant_nvfp4(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x (B, H_kv, S, D) through an NVFP4 cache, in x's dtype: blocks of 16 along head_dim, E4M3
    block scales computed as the cache is written, the static global dequant multiplier
    k_scale / 6 (k_scale = amax / 448, as modelopt exports it; the compressed-tensors multiplier
    is its reciprocal 6 / k_scale = 448 * 6 / amax). Per tensor only: scale (1,)."""
    g = (6.0 / scale.float()).reshape(1)
    return dequantize(quantize_nvfp4_act(x.float().contiguous(), g), torch.float32).to(x.dtype)


def _is_nvfp4_kv(scheme: Mapping[str, Any]) -> bool:
    """compressed-tensors' NVFP4 arguments (artifact/configs.py kv_cache_scheme)."""
    return (scheme.get("type") == "float" and scheme.get("num_bits") == 4
            and scheme.get("strategy") == "tensor_group" and scheme.get("group_size") == 16)


def kv_cache_scheme(config: Mapping[str, Any]) -> dict | None:
    """config.json's quantization_config.kv_cache_scheme (None when the KV cache is not quantized)."""
    qc = config.get("quantization_config")
    scheme = qc.get("kv_cache_scheme") if isinstance(qc, Mapping) else None
    return scheme or None


def read_kv_scales(path, ckpt, config: Mapping[str, Any], modules: list[str]) -> KVScales | None:
    """The scales of every attention module in `modules` (the manifest's kv_modules), checked.

    None when config.json has no kv_cache_scheme. `ckpt` is the artifact's
    tfcompile.io Checkpoint (tensors are read from its safetensors directly)."""
    scheme = kv_cache_scheme(config)
    if scheme is None:
        return None
    fmt = "nvfp4" if _is_nvfp4_kv(scheme) else "fp8"
    kvf = get_kv_format(fmt)
    strategy = scheme.get("strategy") if kvf.per_head else "tensor"  # NVFP4: one global scale per tensor
    if kvf.ct_preset is None and (strategy not in STRATEGIES or scheme.get("type") != "float" or scheme.get("num_bits") != 8):
        raise EvalError(f"{path}/config.json: kv_cache_scheme {scheme} is not FP8 E4M3 per tensor "
                        f"or per attention head, nor NVFP4", hint="evaluate with --kv-cache off, or rebuild "
                        "the artifact with `tfcompile quantize --kv-cache fp8` (or nvfp4)")
    if not modules:
        raise EvalError(f"{path}: config.json has a kv_cache_scheme but the manifest lists no "
                        f"attention module with k_scale/v_scale", hint=f"check `tfcompile verify {path}`")
    names = set(ckpt.names())
    out = {}
    for m in modules:
        pair = []
        for kind in KINDS:
            if f"{m}.{kind}" not in names:
                raise EvalError(f"{path}: KV-cache scale {m}.{kind} is missing",
                                hint=f"check the artifact with `tfcompile verify {path}`")
            pair.append(_checked_scale(path, f"{m}.{kind}", ckpt.get(f"{m}.{kind}"), strategy))
        out[m] = (pair[0], pair[1])
    return KVScales(strategy, out, fmt)


def _checked_scale(path, name: str, t: torch.Tensor, strategy: str) -> torch.Tensor:
    s = t.detach().float().clone()
    ok_shape = s.shape == (1,) if strategy == "tensor" else (s.dim() == 3 and s.shape[1:] == (1, 1))
    if not ok_shape:
        want = "(1,)" if strategy == "tensor" else "(kv_heads, 1, 1)"
        raise EvalError(f"{path}: {name} has shape {tuple(s.shape)}, expected {want} for "
                        f"kv_cache_scheme strategy {strategy}", hint=f"check `tfcompile verify {path}`")
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        raise EvalError(f"{path}: {name} holds a non-finite or non-positive scale",
                        hint=f"check `tfcompile verify {path}`")
    return s


@dataclass
class _Entry:
    name: str
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    emulator: "KVEmulator"


@dataclass
class KVEmulator:
    """The emulation installed on one model; `calls` counts attention calls per module."""
    strategy: str
    modules: tuple[str, ...]
    calls: dict[str, int] = field(default_factory=dict)
    fmt: str = "fp8"

    def apply(self, entry: _Entry, key: torch.Tensor, value: torch.Tensor):
        if entry.k_scale.shape[0] not in (1, key.shape[1]):  # per-head scales vs (B, H_kv, S, D)
            raise EvalError(f"{entry.name}: {entry.k_scale.shape[0]} per-head KV scales but the "
                            f"attention has {key.shape[1]} KV heads",
                            hint="the artifact does not match its architecture; rebuild it")
        self.calls[entry.name] = self.calls.get(entry.name, 0) + 1
        fq = fake_quant_nvfp4 if get_kv_format(self.fmt).block else fake_quant_fp8  # block-scaled: NVFP4
        return fq(key, entry.k_scale), fq(value, entry.v_scale)

    def report(self, mode: str) -> dict:
        """The eval report's `kv_cache` entry (docs/ci.md)."""
        return {"mode": mode, "emulated": True, "dtype": get_kv_format(self.fmt).dtype,
                "strategy": self.strategy,
                "modules": len(self.modules), "attention_calls": sum(self.calls.values())}

    def unreached(self) -> list[str]:
        return [m for m in self.modules if not self.calls.get(m)]


def install(model: nn.Module, kv: KVScales) -> KVEmulator:
    """Emulate the FP8 KV cache in `model` (its attention goes through `KV_EMULATOR`)."""
    modules = dict(model.named_modules())
    missing = sorted(m for m in kv.scales if m not in modules)
    if missing:
        raise EvalError(f"the artifact has KV-cache scales for {missing[0]}, which is not a module "
                        f"of the architecture", hint="the artifact does not match config.json; rebuild it")
    emu = KVEmulator(kv.strategy, tuple(sorted(kv.scales)), fmt=kv.fmt)
    for name, (k, v) in kv.scales.items():
        entry = _Entry(name, k, v, emu)
        _ACTIVE[modules[name]] = entry
        if is_mla(modules[name]):
            modules[name].expand_kv = _rounding_expand(entry, modules[name].expand_kv)
    model.set_attn_implementation(register_wrapper(KV_EMULATOR, model, _emulating))
    return emu


def _rounding_expand(entry: _Entry, expand):
    """MLA: the cached latent and RoPE key read back through the cache format (FP8, or NVFP4
    blocks of 16) with the entry's one k_scale."""
    fq = fake_quant_nvfp4 if get_kv_format(entry.emulator.fmt).block else fake_quant_fp8  # block-scaled: NVFP4

    def rounded(kv_nope: torch.Tensor, k_rot: torch.Tensor):
        entry.emulator.calls[entry.name] = entry.emulator.calls.get(entry.name, 0) + 1
        s = entry.k_scale.reshape(-1)[:1]  # one scale per layer: (1,) or per "head" of the single latent head
        return expand(fq(kv_nope, s), fq(k_rot, s))

    return rounded


def _emulating(base):
    """The attention function around `base` (the model's own): K, V through FP8 for modules with scales."""
    def emulating(module, query, key, value, attention_mask, **kwargs):
        entry = _ACTIVE.get(module)
        if entry is not None and not is_mla(module):  # MLA: rounded where it is cached (expand_kv)
            key, value = entry.emulator.apply(entry, key, value)
        return base(module, query, key, value, attention_mask, **kwargs)

    return emulating


def not_emulated(mode: str, kv: KVScales | None) -> dict:
    """The report's kv_cache entry when nothing is emulated (no scheme, a checkpoint, or --kv-cache off)."""
    return {"mode": mode, "emulated": False, "dtype": kv.dtype if kv else None,
            "strategy": kv.strategy if kv else None, "modules": len(kv.scales) if kv else 0,
            "attention_calls": 0}


__all__ = ["KV_EMULATOR", "KV_MODES", "KVScales", "KVEmulator", "fake_quant_fp8", "kv_cache_scheme",
           "read_kv_scales", "install", "not_emulated", "describe"]
