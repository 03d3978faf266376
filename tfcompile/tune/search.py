"""Rank one problem's config space: prune, estimate, sort.

The order is total and fixed (predicted time, then the config's canonical
JSON), so the same inputs always choose the same config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from tfcompile.tune.cost import Estimate, estimate
from tfcompile.tune.hardware import get_target
from tfcompile.tune.shapes import Problem
from tfcompile.tune.space import fit, shape_ok, space

KEEP = 4  # configs kept per problem offline: the best and the table's 3 runner-ups
KEEP_MEASURED = 16  # measured on a GPU: NVIDIA's heuristics reach 96% of exhaustive with the top 16 (docs/kernels.md "Hardware facts")


def canonical(cfg: Mapping) -> str:
    return json.dumps(dict(cfg), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Ranked:
    config: dict
    est: Estimate


@dataclass(frozen=True)
class Choice:
    problem: Problem
    ranked: tuple[Ranked, ...]  # best first; at most KEEP
    candidates: int  # configs in the space
    feasible: int  # left after pruning
    pruned: Mapping[str, int] = field(default_factory=dict)  # reason -> count

    @property
    def best(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None


class Ranker:
    """Ranks problems, reusing per kernel its config space and per (kernel, target) each
    config's fit, which do not depend on the shape. `check` (compile.FrontendCheck): configs
    go through Triton's front end best first until `keep` pass ("static_assert" otherwise)."""

    def __init__(self, keep: int = KEEP, check=None):
        self.keep, self.check = keep, check
        self._space: dict[int, list[dict]] = {}
        self._fit: dict[tuple, object] = {}

    def rank(self, kdef, p: Problem) -> Choice:
        spec = get_target(p.target)
        if id(kdef) not in self._space:
            self._space[id(kdef)] = space(kdef)
        configs = self._space[id(kdef)]
        pruned: dict[str, int] = {}
        scored = []
        for i, cfg in enumerate(configs):
            if not shape_ok(kdef, p, cfg):
                pruned["shape"] = pruned.get("shape", 0) + 1
                continue
            f = self._fit.get((id(kdef), p.target, i))
            if f is None:
                f = self._fit[(id(kdef), p.target, i)] = fit(kdef, cfg, spec)
            if not f.ok:
                pruned[f.reason] = pruned.get(f.reason, 0) + 1
                continue
            scored.append(Ranked(cfg, estimate(kdef, p, cfg, spec, f)))
        scored.sort(key=lambda r: (r.est.us, canonical(r.config)))
        feasible = len(scored)
        if self.check is not None:
            scored = self._checked(kdef, p, spec, scored, pruned)
        # Empty `ranked` (nothing fits): the table records the kernel's default_config instead.
        return Choice(p, tuple(scored[:self.keep]), len(configs), feasible, dict(sorted(pruned.items())))

    def _checked(self, kdef, p: Problem, spec, scored: list, pruned: dict) -> list:
        kept = []
        for r in scored:
            if len(kept) == self.keep:
                break
            if self.check(kdef, p.n, p.k, r.config, spec.capability) is None:
                kept.append(r)
            else:
                pruned["static_assert"] = pruned.get("static_assert", 0) + 1
        return kept


def rank(kdef, p: Problem, keep: int = KEEP, check=None) -> Choice:
    """Every config of `kdef`'s space for problem `p`, pruned and ranked by the cost model."""
    return Ranker(keep, check).rank(kdef, p)
