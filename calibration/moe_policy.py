"""Every quantized module gets a positive, finite activation amax, whatever the calibration data.

The policy (docs/models.md "MoE calibration"; llm-compressor #2826 is what it prevents:
experts no token reached got a NaN or zero `input_global_scale`):

1. A module that saw tokens keeps its own amax, except a routed expert that saw fewer
   than `min_tokens` routed tokens (`calibrate.moe_min_tokens`, default 16): its own
   amax rests on a handful of tokens, so it takes the largest amax of the same
   projection (gate/up input, or down_proj input) over all experts of its layer,
   its own included, so it can only grow.
2. A module nothing reached (or only zeros) takes the largest amax in its decoder
   layer, else the largest in the model.
3. If nothing at all was observed, that is an error: calibration did not reach the
   model's modules (never a silent 1.0).

Every module that got a fallback is returned, and calibrate warns once, listing them.
"""

from __future__ import annotations

import math
import re

from tfcompile.errors import CheckpointError
from tfcompile.families.experts import EXPERT_ROLES

_EXPERT = re.compile(r"^(?P<expert>(?P<parent>.*\.experts)\.\d+)\.(?P<proj>" + "|".join(EXPERT_ROLES) + ")$")


def resolve_amax(modules: set[str], amax: dict[str, float], tokens: dict[str, int], min_tokens: int,
                 where=None) -> tuple[dict[str, float], list[str]]:
    """(module -> amax > 0, modules that took a fallback), per the policy above."""
    seen = {m: v for m, v in amax.items() if v and math.isfinite(v) and v > 0}
    if modules and not seen:
        raise CheckpointError(f"{where or 'calibration'}: no calibration token reached any of the "
                              f"{len(modules)} quantized modules (e.g. {sorted(modules)[0]})",
                              hint="the model's module names do not match the checkpoint's; report it, "
                                   "or use a weight-only format (e.g. nvfp4a16) that needs no calibration")
    top = max(seen.values(), default=0.0)
    experts = _expert_max(seen)
    out, fallback = {}, []
    for m in sorted(modules):
        v = seen.get(m)
        e = _EXPERT.match(m)
        few = e is not None and e["expert"] in tokens and tokens[e["expert"]] < min_tokens
        if few and experts.get((e["parent"], _kind(e["proj"]))):
            v = experts[(e["parent"], _kind(e["proj"]))]  # >= its own amax: it includes it
            fallback.append(m)
        elif v is None:
            layer = re.match(r"(.*?\.\d+)\.", m)
            same = [a for k, a in seen.items() if layer and k.startswith(layer.group(1) + ".")]
            v = max(same, default=0.0) or top
            fallback.append(m)
        out[m] = v
    return out, fallback


def _kind(proj: str) -> str:
    return "down" if EXPERT_ROLES[proj] == "down" else "gate_up"


def _expert_max(seen: dict[str, float]) -> dict[tuple[str, str], float]:
    """(experts module, gate_up | down) -> the largest amax any of its experts saw."""
    out: dict[tuple[str, str], float] = {}
    for m, v in seen.items():
        e = _EXPERT.match(m)
        if e:
            key = (e["parent"], _kind(e["proj"]))
            out[key] = max(out.get(key, 0.0), v)
    return out


def summarize(modules: list[str], limit: int = 6) -> str:
    """'model.layers.3.mlp.experts.{0,5,7}.down_proj, ...' : fallback modules, grouped for one warning."""
    groups: dict[tuple[str, str], list[str]] = {}
    for m in modules:
        e = re.match(r"^(.*\.experts)\.(\d+)\.(.*)$", m)
        key, idx = ((e.group(1), e.group(3)), e.group(2)) if e else ((m, ""), "")
        groups.setdefault(key, []).append(idx)
    parts = [f"{p}.{{{','.join(ix)}}}.{leaf}" if leaf else p for (p, leaf), ix in groups.items()]
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more
