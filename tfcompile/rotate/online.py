"""Online block-Hadamard transforms inside a Linear's K (QuaRot R3/R4, MR-GPTQ), as engines serve them.

Every quantized decoder Linear y = x W^T is stored as W R and run as y = Q_a(x R) Q_w(W R)^T with
R = I_{K/b} (x) H_b / sqrt(b), H_b the Sylvester Hadamard matrix of order b (a power of two that
divides K; MXFP4's 32 mixes only values that share a scale, NVFP4 gains more from 64). R is
orthogonal and symmetric, so x R (W R)^T = x W^T before quantization; the weight side is fused into
the stored tensor at quantize time, the input side runs at inference. GPTQ on W R solves with the
Hessian of the transformed inputs, R^T H R.

On disk this is compressed-tensors' `transform_config` in config.json's `quantization_config`
(compressed_tensors/transform/transform_config.py `TransformConfig`, transform_scheme.py
`TransformScheme`, transform_args.py `TransformArgs`; version 0.20.1), as llm-compressor's QuIP
template writes its "v" transform: one scheme of `type: "hadamard"` (factory/hadamard.py: the
matrix is `deterministic_hadamard_matrix`, Sylvester's, rebuilt from the scheme; `randomize:
false`, so no permutation), `head_dim: b` (the block-diagonal size: utils/matrix.py
`get_transform_size`), applied at `weight_input` with `inverse: true` (offline: W V^T^T = W R, fused
here) and at `input` (online: x R). No transform tensor is written: vLLM's
`HadamardTransform.forward` (vllm/model_executor/layers/quantization/compressed_tensors/transform/
module.py) runs `ops.hadacore_transform` for `type: "hadamard"` on each `head_dim` block without
reading one, and compressed-tensors' factory builds the matrix from the scheme. vLLM applies only
the online arguments (transform/linear.py `get_linear_transform_schemes`: `args.is_online()`),
only to Linear layers (not fused MoE experts), and not under tensor parallelism (module.py:
"Online transforms with tensor parallelism is not supported").
"""

from __future__ import annotations

import functools
import math
import re
from typing import Mapping

import torch

from tfcompile.rotate.hadamard import sylvester

TYPE = "hadamard"  # compressed-tensors' registered factory name (factory/hadamard.py)
SCHEME_NAME = "online_hadamard"  # the transform_config group's key (any string; vLLM names submodules after it)


def valid_order(order: int) -> bool:
    """A Sylvester order hadacore and compressed-tensors' deterministic matrix build: 2^k, k >= 1."""
    return order >= 2 and order & (order - 1) == 0


def matrix(order: int) -> torch.Tensor:
    """H_b / sqrt(b), float64, symmetric and orthogonal."""
    return sylvester(order) / math.sqrt(order)


def _right(m: torch.Tensor, order: int) -> torch.Tensor:
    """m R for R = I (x) H_b / sqrt(b), along m's last dimension, in float64."""
    return (m.double().unflatten(-1, (-1, order)) @ matrix(order)).flatten(-2)


def rotate_weight(w: torch.Tensor, order: int) -> torch.Tensor:
    """W R [N, K] in float32 (the weight the artifact stores, before quantization); w itself for order 0."""
    return w if not order else _right(w, order).float()


def rotate_hessian(h: torch.Tensor, order: int) -> torch.Tensor:
    """R^T H R [K, K] (float32): the Hessian of the transformed inputs x R; h itself for order 0."""
    return h if not order else _right(_right(h, order).mT, order).float()


@functools.lru_cache(maxsize=8)
def _unnormalized(order: int) -> torch.Tensor:
    return sylvester(order).float()


def transform_inputs(x: torch.Tensor, order: int) -> torch.Tensor:
    """x R in x's dtype, computed as compressed-tensors' online `HadamardTransform.forward` computes
    it (factory/hadamard.py: the unnormalized matrix in float32, then / sqrt(b))."""
    h = _unnormalized(order).to(x.device)
    y = (x.float().unflatten(-1, (-1, order)) @ h).flatten(-2) / torch.tensor(order, dtype=torch.float64).sqrt()
    return y.to(x.dtype)


def record(order: int) -> dict:
    """The manifest's `scheme.online_transform`."""
    return {"type": TYPE, "order": order, "location": "input", "fused": "weight_input"}


def transform_config(order: int, ignore: list[str]) -> dict:
    """quantization_config.transform_config: compressed-tensors' `TransformConfig.model_dump()` of one
    Hadamard scheme of head_dim `order` on every Linear but `ignore` (the quantization config's own
    ignore list: the Linears left unquantized are not transformed either)."""
    args = [{"targets": ["Linear"], "location": "weight_input", "inverse": True, "ignore": sorted(ignore)},
            {"targets": ["Linear"], "location": "input", "inverse": False, "ignore": sorted(ignore)}]
    return {"config_groups": {SCHEME_NAME: {"type": TYPE, "apply": args, "randomize": False, "requires_grad": False,
                                           "head_dim": order, "precision": "torch.float32"}}}


class UnsupportedTransform(ValueError):
    """A transform_config this emulation does not reproduce (another type, randomized, no head_dim ...)."""


def input_transforms(quantization_config: Mapping | None) -> list[tuple[int, list[str], list[str]]]:
    """The online input transforms of a quantization_config: [(order, targets, ignore)], [] when none.
    Raises UnsupportedTransform for one that is not a deterministic block Hadamard on Linear inputs."""
    groups = ((quantization_config or {}).get("transform_config") or {}).get("config_groups") or {}
    out = []
    for name, scheme in sorted(groups.items()):
        online = [a for a in scheme.get("apply", []) if a.get("location") not in ("weight_input", "weight_output")]
        if not online:
            continue
        order = scheme.get("head_dim")
        if scheme.get("type") != TYPE or scheme.get("randomize") or not isinstance(order, int) \
                or not valid_order(order) or any(a.get("location") != "input" or a.get("inverse") for a in online):
            raise UnsupportedTransform(f"transform_config group {name!r} ({scheme.get('type')}, randomize "
                                       f"{scheme.get('randomize')}, head_dim {order}, locations "
                                       f"{[a.get('location') for a in online]}) is not a deterministic block "
                                       "Hadamard on Linear inputs")
        out += [(order, list(a.get("targets", [])), list(a.get("ignore", []))) for a in online]
    return out


def _matches(name: str, cls: str, patterns: list[str]) -> bool:
    """compressed-tensors' target matching (utils/match.py): a class name, `re:REGEX`, or the module name."""
    return any(re.match(p[3:], name) if p.startswith("re:") else p in (cls, name) for p in patterns)


def module_order(transforms: list[tuple[int, list[str], list[str]]], name: str, cls: str = "Linear") -> int:
    """The order of the online input transform module `name` (of class `cls`) runs; 0 for none."""
    orders = [o for o, targets, ignore in transforms if _matches(name, cls, targets) and not _matches(name, cls, ignore)]
    if len(orders) > 1:
        raise UnsupportedTransform(f"{name}: {len(orders)} online input transforms apply; vLLM takes one per Linear")
    return orders[0] if orders else 0
