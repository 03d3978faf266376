"""What a family rule set is made of (`Family`), and the parts rules share: `Keep` (a class of
modules kept in high precision, and why) and `ExpertLayout` (how fused experts are stored).
Each family's rules are in its own module (deepseek.py, glm.py, qwen.py, gpt_oss.py, minimax.py,
bert.py); rules.py gathers them (`FAMILIES`) and answers for a model."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(frozen=True)
class Keep:
    pattern: str  # select's syntax: a glob, or "re:<regex>" matched against the module name
    what: str  # the modules, in words (docs/models.md)
    why: str  # why they stay in high precision by default
    include: str  # `select.include` name that quantizes them anyway
    engine_unquantized: bool = False  # vLLM builds it with quant_config=None / as a plain nn.Linear

    def matches(self, module: str) -> bool:
        """`pattern` (every rule here is a "re:" regex) matches the whole module name."""
        return re.fullmatch(self.pattern.removeprefix("re:"), module) is not None


@dataclass(frozen=True)
class ExpertLayout:
    """How a family stores its routed experts as fused 3-D tensors (transformers v5 names)."""
    name: str  # "v5": [E, 2I, H] gate then up halves; "gpt_oss": [E, H, 2I] interleaved, + biases
    transposed: bool  # stored (in, out): gate_up [E, H, 2I], down [E, I, H]
    interleaved: bool  # gate/up alternate along 2I (gate = 0::2, up = 1::2) instead of halves
    bias: bool  # gate_up_proj_bias [E, 2I] and down_proj_bias [E, H] beside the weights


V5 = ExpertLayout("v5", transposed=False, interleaved=False, bias=False)


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]  # config.json model_type values
    keep: tuple[Keep, ...] = ()  # kept in high precision by default (beyond the generic rules)
    fuse: Mapping[str, str] = field(default_factory=dict)  # Linear leaf -> fusion role (one global scale)
    experts: ExpertLayout = V5  # layout of fused expert tensors, when the checkpoint stores them fused
    modelopt: bool = False  # TensorRT-LLM serves it: the modelopt view is tested (tests/families)
    linears: str = "all"  # "all": every decoder-layer Linear; "standard": only what standard_linear shows
    no_model: tuple[str, ...] = ()  # engines whose release (vLLM 0.32) has no model class for it: refused
