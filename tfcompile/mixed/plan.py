"""Apply a per-group format choice to a QuantPlan.

A group in the plan's own format is unchanged; one in another scheme gets a `group_schemes`
entry (quantize, pack, manifest, verify and eval read it through QuantPlan.scheme_of); one left
in "bf16" leaves the plan's groups: its Linears join the `ignore` list (loaders keep them in high
precision) and its source tensors are copied verbatim, like any other unquantized tensor.
"""

from __future__ import annotations

import dataclasses

from tfcompile.schemes import get_scheme


def apply(plan, pick: dict[str, str], source_names: list[str], record: dict):
    """The plan with `pick` (group key -> format name) applied and `record` as its `mixed` field."""
    keep, dropped = [], []
    for g in plan.groups:
        (dropped if pick.get(g.key) == "bf16" else keep).append(g)
    schemes = {g.key: get_scheme(pick[g.key]) for g in keep
               if pick.get(g.key, plan.scheme.name) != plan.scheme.name}
    freed = {t.source for g in dropped for t in g.members}
    passthrough = set(plan.passthrough) | freed
    return dataclasses.replace(
        plan, groups=tuple(keep), group_schemes=schemes, mixed=record,
        passthrough=tuple(n for n in source_names if n in passthrough),
        ignore=tuple(sorted(set(plan.ignore) | {t.module for g in dropped for t in g.members})),
        sources=frozenset(plan.sources - freed))
