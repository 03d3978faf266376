"""Fused MoE expert tensors: split into per-expert Linears, and written back into fused parameters.

transformers v5 holds a layer's routed experts as 3-D parameters, in one of two layouts
(`rules.ExpertLayout`, read from the experts module's own `is_transposed` /
`is_concatenated` / `has_bias` flags in memory):

- v5 (Qwen3-MoE, DeepSeek-V3, GLM-4.5, Qwen3-Next):  gate_up_proj [E, 2I, H] = per expert
  cat(gate [I, H], up [I, H]); down_proj [E, H, I];
- gpt_oss: gate_up_proj [E, H, 2I] (in, out), gate and up *interleaved* along 2I
  (gate = [..., 0::2], up = [..., 1::2]), gate_up_proj_bias [E, 2I]; down_proj [E, I, H],
  down_proj_bias [E, H].

The artifact stores them as engines load MoE checkpoints: one Linear per expert and
projection, `experts.{e}.gate_proj` / `up_proj` / `down_proj` (vLLM's
`fused_moe_make_expert_params_mapping(ckpt_gate_proj_name="gate_proj", ...)`, SGLang's
`FusedMoE.make_expert_params_mapping`, llm-compressor's linearised experts), weights
[N, K] = (out, in), with GPT-OSS's biases split the same way (`experts.{e}.gate_proj.bias`
...). The engine re-fuses them into its w13/w2 in the order its activation kernel reads.
`fuse_weight` is the exact inverse of `split_slices`, proven by a round trip on every
layout (tests/families/test_moe_experts.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from tfcompile.errors import CheckpointError
from tfcompile.families.family import ExpertLayout

# A quantization group of one routed expert: "{parent}.experts.{e}.{role}" (role: gate_up, down_proj)
EXPERT_GROUP = re.compile(r"^(?P<parent>.*\.experts)\.(?P<e>\d+)\.(?P<role>[^.]+)$")


def is_expert_group(key: str) -> bool:
    return EXPERT_GROUP.match(key) is not None


PROJS = ("gate_proj", "up_proj", "down_proj")
# Per-expert checkpoint leaves -> their role: transformers v5's names, and Mixtral / MiniMax-M2's w1 (gate),
# w3 (up), w2 (down), which vLLM loads with `ckpt_gate_proj_name="w1"` ... (minimax_m2.py, mixtral.py).
EXPERT_ROLES = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down", "w1": "gate", "w3": "up", "w2": "down"}


@dataclass(frozen=True)
class ExpertSlice:
    module: str  # per-expert Linear, e.g. model.layers.0.mlp.experts.3.up_proj
    expert: int  # index along dim 0
    rows: tuple[int, int, int] | None  # (start, stop, step) over the Linear's out rows, after `transposed`
    transposed: bool  # the stored [K, N] slice is the weight's transpose
    shape: tuple[int, int]  # (N, K) of the Linear


def _rows(proj: str, inter: int, interleaved: bool) -> tuple[int, int, int]:
    """Rows of gate_up (as [2I, H]) that belong to `proj`."""
    if interleaved:
        return (0 if proj == "gate_proj" else 1, 2 * inter, 2)
    return (0, inter, 1) if proj == "gate_proj" else (inter, 2 * inter, 1)


def rows_in_gate_up(proj: str, inter: int, layout: ExpertLayout) -> tuple[int, int, int] | None:
    """(start, stop, step) of `proj`'s rows in gate_up_proj read as [2I, H]; None for down_proj."""
    return None if proj == "down_proj" else _rows(proj, inter, layout.interleaved)


def split_slices(name: str, shape: tuple, hidden: int | None, layout: ExpertLayout) -> list[ExpertSlice]:
    """Per-expert Linear slices of the fused tensor `name` ([E, ., .]) in `layout`.

    Raises CheckpointError when the shape is not what the layout says, naming both."""
    prefix = name[: name.index("experts.") + len("experts")]
    n_exp, a, b = shape
    n, k = (b, a) if layout.transposed else (a, b)  # as an [out, in] weight
    gate_up = "gate_up_proj" in name
    if hidden and ((gate_up and (n % 2 or k != hidden)) or (not gate_up and n != hidden)):
        want = {(True, True): "[E, H, 2I]", (True, False): "[E, 2I, H]",
                (False, True): "[E, I, H]", (False, False): "[E, H, I]"}[(gate_up, layout.transposed)]
        raise CheckpointError(f"fused expert tensor {name} has shape {list(shape)}; the {layout.name} layout "
                              f"stores it as {want} with H={hidden}",
                              hint=f"this fused layout is not supported; pass --ignore '{prefix}*'")
    if not gate_up:
        return [ExpertSlice(f"{prefix}.{e}.down_proj", e, None, layout.transposed, (n, k)) for e in range(n_exp)]
    inter = n // 2
    return [ExpertSlice(f"{prefix}.{e}.{p}", e, _rows(p, inter, layout.interleaved), layout.transposed, (inter, k))
            for e in range(n_exp) for p in ("gate_proj", "up_proj")]


def bias_slices(name: str, shape: tuple, layout: ExpertLayout) -> list[tuple[str, int, tuple[int, int, int] | None]]:
    """(per-expert bias name, expert, rows) for a fused `*_bias` tensor [E, N]."""
    prefix = name[: name.index("experts.") + len("experts")]
    n_exp, n = shape
    if name.endswith("down_proj_bias"):
        return [(f"{prefix}.{e}.down_proj.bias", e, None) for e in range(n_exp)]
    return [(f"{prefix}.{e}.{p}.bias", e, _rows(p, n // 2, layout.interleaved))
            for e in range(n_exp) for p in ("gate_proj", "up_proj")]


def take(t: torch.Tensor, expert: int | None, rows: tuple | None, transposed: bool = False) -> torch.Tensor:
    """One expert's [N, K] weight (or [N] bias) out of a fused tensor; contiguous."""
    if expert is not None:
        t = t[expert]
    if transposed:
        t = t.T
    if rows is not None:
        t = t[slice(*rows)]
    return t if t.is_contiguous() else t.contiguous()


def module_layout(mod: torch.nn.Module) -> ExpertLayout:
    """The layout of an in-memory transformers experts module (its decorator's flags)."""
    return ExpertLayout("module", transposed=bool(getattr(mod, "is_transposed", False)),
                        interleaved=not bool(getattr(mod, "is_concatenated", True)),
                        bias=bool(getattr(mod, "has_bias", False)))


@torch.no_grad()
def set_expert(mod: torch.nn.Module, e: int, proj: str, w: torch.Tensor) -> None:
    """Write Linear weight w [N, K] of expert e into the fused parameters of `mod`."""
    lay = module_layout(mod)
    if proj == "down_proj":
        mod.down_proj[e].copy_(w.T if lay.transposed else w)
        return
    sl = slice(*_rows(proj, w.shape[0], lay.interleaved))
    if lay.transposed:
        mod.gate_up_proj[e][:, sl].copy_(w.T)
    else:
        mod.gate_up_proj[e][sl].copy_(w)


@torch.no_grad()
def set_expert_bias(mod: torch.nn.Module, e: int, proj: str, b: torch.Tensor) -> None:
    """Write Linear bias b [N] of expert e into the fused bias parameters of `mod`."""
    if proj == "down_proj":
        mod.down_proj_bias[e].copy_(b)
        return
    mod.gate_up_proj_bias[e][slice(*_rows(proj, b.shape[0], module_layout(mod).interleaved))].copy_(b)


def fuse_weight(parts: dict[str, list[torch.Tensor]], layout: ExpertLayout) -> dict[str, torch.Tensor]:
    """Per-expert [N, K] weights {proj: [expert 0, 1, ...]} -> the fused gate_up_proj and down_proj."""
    gate, up, down = (torch.stack(parts[p]) for p in PROJS)  # [E, I, H], [E, I, H], [E, H, I]
    if layout.interleaved:
        gu = torch.stack((gate, up), dim=2).flatten(1, 2)  # rows g0, u0, g1, u1, ...
    else:
        gu = torch.cat((gate, up), dim=1)
    if layout.transposed:
        gu, down = gu.transpose(1, 2), down.transpose(1, 2)
    return {"gate_up_proj": gu.contiguous(), "down_proj": down.contiguous()}


def fuse_bias(parts: dict[str, list[torch.Tensor]], layout: ExpertLayout) -> dict[str, torch.Tensor]:
    """Per-expert biases {proj: [expert 0, ...]} -> gate_up_proj [E, 2I] and down_proj [E, H] biases."""
    gate, up, down = (torch.stack(parts[p]) for p in PROJS)
    gu = torch.stack((gate, up), dim=2).flatten(1, 2) if layout.interleaved else torch.cat((gate, up), dim=1)
    return {"gate_up_proj": gu.contiguous(), "down_proj": down.contiguous()}


def experts_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """name -> every fused experts module (a `gate_up_proj` 3-D parameter) of a transformers model."""
    return {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "gate_up_proj", None), torch.Tensor) and m.gate_up_proj.dim() == 3}
