"""Checkpoint names <-> the module names transformers gives the same weights in memory.

Most families keep one name on disk and in memory. Some do not: Qwen2.5-VL's
checkpoints (and what transformers 5 writes) say `model.layers.N...` and `visual...`,
while the model in memory has `model.language_model.layers.N...` and
`model.visual...`. transformers renames on load with the model's `WeightRenaming`
rules (transformers.conversion_mapping); `NameMap` applies exactly those rules (not
the expert-fusing `WeightConverter`s: experts are handled by families/experts.py), so
calibration hooks, eval and the interop tests find the module a checkpoint tensor
belongs to. The artifact keeps the checkpoint's names, as every loader expects.

Per-expert Linears are named by their role in memory (`experts.{e}.gate_proj` / `up_proj` /
`down_proj`, what families/experts.py writes into the fused tensors); checkpoints that store them as
`w1` / `w3` / `w2` (MiniMax-M2, Mixtral) are mapped by the model's own expert-fusing
`WeightConverter`s (`experts.*.w1` + `experts.*.w3` -> `gate_up_proj`: w1 is the gate half).
"""

from __future__ import annotations

import re
from typing import Iterable

_EXPERT_LEAF = re.compile(r"(?P<head>.*\.experts\.\d+\.)(?P<leaf>[^.]+)(?P<tail>\.weight|\.bias)?$")
_SOURCE_LEAF = re.compile(r"\.?experts\.\*\.(?P<leaf>[^.]+)\.weight")


class NameMap:
    """Checkpoint -> model names by the model's renaming rules; model -> checkpoint for `ckpt_names`.

    `to_model` renames any tensor or module name (a module name is renamed as its `.weight`);
    `to_ckpt` inverts that over the checkpoint names given (transformers' reverse rules are
    meant for saving whole state dicts, not single names). Unknown names map to themselves."""

    def __init__(self, model, ckpt_names: Iterable[str] = ()):
        self._renamings = _renamings(model)
        self._leaves = expert_leaves(model)
        self._to_ckpt: dict[str, str] = {}
        for n in ckpt_names:
            m = self.to_model(n)
            if m != n:
                self._to_ckpt[m] = n

    @property
    def identity(self) -> bool:
        return not self._renamings and not self._leaves

    def to_model(self, name: str) -> str:
        """A checkpoint tensor or module name as the model names it."""
        if self.identity:
            return name
        out = self._leaf(_apply(name, self._renamings))
        if out != name or name.endswith((".weight", ".bias")):
            return out
        as_weight = self._leaf(_apply(name + ".weight", self._renamings))  # a module name: rename its weight
        return as_weight[: -len(".weight")] if as_weight.endswith(".weight") else name

    def _leaf(self, name: str) -> str:
        m = _EXPERT_LEAF.match(name) if self._leaves else None
        if m is None or m["leaf"] not in self._leaves:
            return name
        return m["head"] + self._leaves[m["leaf"]] + (m["tail"] or "")

    def to_ckpt(self, name: str) -> str:
        """A model parameter or module name as the checkpoint names it."""
        if name in self._to_ckpt:
            return self._to_ckpt[name]
        hit = self._to_ckpt.get(name + ".weight")
        return hit[: -len(".weight")] if hit is not None and hit.endswith(".weight") else name


def _renamings(model) -> list:
    try:
        # lazy: transformers (~2 s to import); only when a model is built
        # lazy: transformers (~2 s to import); only when a model is built
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # an older transformers renames nothing we need
        return []
    if not isinstance(model, PreTrainedModel):  # a plain torch module: its names are the checkpoint's
        return []
    return [c for c in get_model_conversion_mapping(model) if isinstance(c, WeightRenaming)]


def expert_leaves(model) -> dict[str, str]:
    """Per-expert checkpoint leaf -> its role (gate_proj, up_proj, down_proj) where they differ, read
    from the model's expert-fusing WeightConverters (sources `.experts.*.LEAF.weight`)."""
    try:
        # lazy: transformers (~2 s to import); only when a model is built
        from transformers import PreTrainedModel
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter
    except ImportError:
        return {}
    if not isinstance(model, PreTrainedModel):
        return {}
    out: dict[str, str] = {}
    for c in get_model_conversion_mapping(model):
        if not isinstance(c, WeightConverter) or len(c.target_patterns) != 1:
            continue
        leaves = [m["leaf"] if (m := _SOURCE_LEAF.fullmatch(s)) else None for s in c.source_patterns]
        target = c.target_patterns[0]
        if None in leaves:
            continue
        if target.endswith("experts.gate_up_proj") and len(leaves) == 2:
            out.update({leaves[0]: "gate_proj", leaves[1]: "up_proj"})
        elif target.endswith("experts.down_proj") and len(leaves) == 1:
            out[leaves[0]] = "down_proj"
    return {k: v for k, v in out.items() if k != v}


def _apply(name: str, renamings: list) -> str:
    for r in renamings:
        name, _ = r.rename_source_key(name)
    return name


class RenamedView:
    """A checkpoint seen under the model's names (`names()`, `get`, `release`), for code that binds
    model parameters to checkpoint tensors by name (calibration/sequential.py)."""

    def __init__(self, ckpt, model):
        self._ckpt = ckpt
        self._map = NameMap(model, ckpt.names())
        self._names = [self._map.to_model(n) for n in ckpt.names()]

    def names(self) -> list[str]:
        return self._names

    def get(self, name: str):
        return self._ckpt.get(self._map.to_ckpt(name))

    def release(self) -> None:
        self._ckpt.release()


def per_decoder_layer(seconds: dict[str, float]) -> dict[str, float]:
    """Per-module seconds (pack's solves, calibrate's Hessians) summed by decoder layer index ("model.layers.3.mlp.up_proj" -> "3"; others -> "other")."""
    out: dict[str, float] = {}
    for name, s in seconds.items():
        m = re.search(r"\.layers\.(\d+)\.", name)
        key = m.group(1) if m else "other"
        out[key] = out.get(key, 0.0) + s
    order = sorted(out.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0))
    return {k: round(v, 4) for k, v in order}
