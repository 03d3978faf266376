"""compressed-tensors config for a mixed-precision artifact, and its check.

One config group per scheme in use, each the scheme's preset (artifact/ct_presets.py, generated
from compressed-tensors itself) with `targets` the exact module names quantized in it and its
own `format`; the top-level format is "mixed-precision" (compressed-tensors' own value when a
model holds several), or the one format when every group kept the base (or went to bf16). Loaders (transformers + compressed-tensors, vLLM) match a module to the
group whose targets name it, so every Linear is read with the scheme its tensors were written in.
"""

from __future__ import annotations

import copy

from tfcompile.artifact.configs import ct_quantization_config
from tfcompile.artifact.ct_presets import CONFIG_GROUP
from tfcompile.schemes import get_scheme

MIXED_FORMAT = "mixed-precision"


def ct_mixed_config(plan, ignore: list[str], kv: str | None = None, kv_format: str = "fp8") -> dict:
    """config.json["quantization_config"] of a plan with several schemes (QuantPlan.group_schemes)."""
    qc = ct_quantization_config(plan.scheme, ignore, kv, kv_format)
    groups = {}
    for i, scheme in enumerate(plan.schemes()):
        targets = sorted(t.module for g in plan.groups if plan.scheme_of(g) == scheme for t in g.members)
        group = copy.deepcopy(CONFIG_GROUP[scheme.ct_preset])
        group["targets"], group["format"] = targets, scheme.ct_format
        groups[f"group_{i}"] = group
    qc["config_groups"] = groups
    if len(groups) > 1:
        qc["format"] = MIXED_FORMAT
    return qc


def config_mismatches(qc: dict, layers: list[dict]) -> list[str]:
    """Each quantized layer (manifest `layers`: module, format) must be the target of exactly one
    config group whose weights / input_activations are its scheme's preset; [] when all are."""
    owner: dict[str, list[dict]] = {}
    for group in (qc.get("config_groups") or {}).values():
        for target in group.get("targets", []):
            owner.setdefault(target, []).append(group)
    bad = []
    for layer in layers:
        m, want = layer["module"], CONFIG_GROUP[get_scheme(layer["format"]).ct_preset]
        got = owner.get(m, [])
        if len(got) != 1:
            bad.append(f"{m}: named by {len(got)} config groups")
        elif any(got[0].get(k) != want.get(k) for k in ("weights", "input_activations")):
            bad.append(f"{m}: its config group is not {layer['format']}")
    return bad
