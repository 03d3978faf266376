"""CUTLASS GEMMs in the tuner: problems, configs ranked by the same cost model, table entries.

The CUTLASS kernels (tfcompile.kernels.cutlass.configs.KERNELS) are ranked like the
Triton ones: the space is each kernel's short list of configs (tile, cluster, schedule;
its `presets`), pruned by shape and hardware limits (space.py) and ranked by the analytic
model (cost.py). Triton's front-end check does not apply (no Triton function).

Table entries sit in the same kernels/tuning.json, keyed like the Triton ones with the
CUTLASS version in place of Triton's:
  "<kernel>:<target>:<N>x<K>:m<M>:cutlass-<version>"
and hold {"config", "method", "predicted_us", "runner_up", "space", "cutlass", ...}. A
table entry (e.g. measured on a GPU, or edited by hand) wins over the cost model.
"""

from __future__ import annotations

import json
from typing import Iterable, Mapping

from tfcompile.kernels.cutlass.configs import KERNELS, gaps, serving
from tfcompile.kernels.cutlass.toolchain import cutlass_includes
from tfcompile.schemes import get_scheme
from tfcompile.tune.search import Ranker, canonical
from tfcompile.tune.shapes import Problem
from tfcompile.tune.table import cost_entry


def version() -> str:
    """The nvidia-cutlass version the sources are generated for ("none" when not installed)."""
    return cutlass_includes()[1] or "none"


def entry_key(p: Problem, cutlass: str) -> str:
    return f"{p.key}:cutlass-{cutlass}"


def problems(scheme: str, shapes: Iterable[tuple[int, int]], targets: Iterable[str],
             buckets: Iterable[int]) -> tuple[list[Problem], dict[str, str]]:
    """(target, CUTLASS kernel, N, K, M bucket) for every shape and bucket; and, per target
    no CUTLASS kernel serves, why (one line)."""
    shapes, buckets = sorted(set(shapes)), sorted(set(buckets))
    out: list[Problem] = []
    notes: dict[str, str] = {}
    for target in targets:
        kernels = serving(scheme, target)
        if not kernels:
            notes[target] = gaps(scheme, target, get_scheme(scheme).weights.element_bits)
        out += [Problem(target, k.name, n, kk, m) for k in kernels for m in buckets for n, kk in shapes]
    return sorted(out), notes


def choose(probs: Iterable[Problem], table: Mapping | None, cutlass: str) -> tuple[dict[str, dict], int]:
    """Table entries for `probs`: the given table's where it has one, else the cost model's;
    and how many came from the table."""
    ranker = Ranker(check=None)
    out, given_n = {}, 0
    for p in probs:
        key = entry_key(p, cutlass)
        given = (table or {}).get("entries", {}).get(key)
        if given is not None and _usable(given.get("config")):
            out[key], given_n = dict(given), given_n + 1
            continue
        kdef = KERNELS[p.kernel]
        e = cost_entry(ranker.rank(kdef, p), cutlass, kdef.default_config)
        e.pop("triton", None)
        out[key] = {**e, "cutlass": cutlass}
    return out, given_n


def _usable(cfg) -> bool:
    """A config the templates can be rendered with."""
    need = ("id", "BLOCK_M", "BLOCK_N", "BLOCK_K", "CLUSTER_M", "CLUSTER_N", "mainloop", "epilogue")
    return isinstance(cfg, dict) and all(k in cfg for k in need)


def consolidate(entries: dict[str, dict], probs: Iterable[Problem], cutlass: str,
                slack: float) -> tuple[dict[str, dict], int]:
    """Fewer configs to compile: drop a chosen config when every problem it serves has another
    chosen config predicted within `slack` x its time (each config is a 15-50 s nvcc build, a
    rarely chosen one rarely pays for it). Greedy, least-used config first; entries taken
    from a table are kept as they are. Returns (entries, configs dropped)."""
    if slack <= 1.0:
        return entries, 0
    ranker = Ranker(keep=1 << 30, check=None)
    times: dict[str, dict[str, float]] = {}  # entry key -> config canonical -> predicted us
    for p in probs:
        c = ranker.rank(KERNELS[p.kernel], p)
        times[entry_key(p, cutlass)] = {canonical(r.config): r.est.us for r in c.ranked}
    out, dropped = dict(entries), 0
    while True:
        use: dict[str, list[str]] = {}
        for key, e in sorted(out.items()):
            use.setdefault(canonical(e["config"]), []).append(key)
        movable = [(len(keys), cfg) for cfg, keys in use.items()
                   if all(out[k].get("method") == "cost-model" for k in keys)]
        moved = False
        for _, cfg in sorted(movable):
            plan = _reassign(use[cfg], cfg, set(use) - {cfg}, out, times, slack)
            if plan is not None:
                out.update(plan)
                dropped, moved = dropped + 1, True
                break
        if not moved:
            return out, dropped


def _reassign(keys: list[str], cfg: str, others: set[str], entries: dict, times: dict,
              slack: float) -> dict | None:
    """New entries moving every key off `cfg` onto the fastest of `others` within slack, or None."""
    plan = {}
    for key in keys:
        t = times.get(key, {})
        best = t.get(cfg)
        alts = sorted((us, o) for o, us in t.items() if o in others)
        if best is None or not alts or alts[0][0] > best * slack:
            return None
        us, o = alts[0]
        plan[key] = dict(entries[key], config=json.loads(o), predicted_us=float(f"{us:.4g}"),
                         consolidated_from=entries[key]["config"]["id"])
    return plan
