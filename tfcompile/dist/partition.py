"""Deterministic assignment of work to ranks: a pure function of the work list and the world size.

Every rank computes the same assignment from the same inputs, so no rank has to be told
what to do, and a run's result cannot depend on which rank happened to be faster.
"""

from __future__ import annotations

import heapq
from typing import Hashable, Mapping

from tfcompile.families.experts import EXPERT_GROUP


def mine(count: int, rank: int, size: int) -> list[int]:
    """Items round-robin: rank r gets r, r+size, r+2*size, ... (calibration batches, source files).
    Item i of round t is t*size + r, so a round holds consecutive items in rank order."""
    return list(range(rank, count, size))


def rounds(count: int, size: int) -> int:
    """Rounds of `size` consecutive items (the last may be partial)."""
    return -(-count // size)


def lpt(costs: Mapping[Hashable, float], size: int) -> dict[Hashable, int]:
    """Longest processing time first: items by decreasing cost (ties by key), each to the least
    loaded rank (ties to the lowest rank). Within 4/3 of the optimal makespan (Graham, 1969)."""
    heap = [(0.0, r) for r in range(size)]
    out = {}
    for key in sorted(costs, key=lambda k: (-costs[k], str(k))):
        load, r = heapq.heappop(heap)
        out[key] = r
        heapq.heappush(heap, (load + float(costs[key]), r))
    return out


def shard_owner(shard: int, size: int) -> int:
    """Output shard i is written by rank i mod size (shards are similar in size by construction)."""
    return shard % size


def gptq_cost(rows: int, cols: int) -> float:
    """Work of one GPTQ solve of an [rows, cols] weight: the Cholesky factorisations (~cols^3)
    plus the column sweep and lazy updates (~2 rows cols^2) -- both in multiply-adds."""
    return cols ** 3 + 2.0 * rows * cols * cols


def hessian_owners(groups, size: int, expert_batch: int = 8) -> dict[str, int]:
    """Group key -> the rank that sums its Hessian and solves its GPTQ: longest processing time
    first over the solves' cost. A routed expert's groups go with the experts of the same solve
    batch (`solve_unit`: experts module, projection, e // expert_batch; passes/quantize/gptq_moe.py
    solves exactly these together), so one MoE layer's expert Hessians are spread over the ranks.
    `groups`: the quantization plan's groups (key, members with shape [N, K])."""
    costs: dict[str, float] = {}
    for g in groups:
        unit = solve_unit(g.key, expert_batch)
        costs[unit] = costs.get(unit, 0.0) + gptq_cost(sum(t.shape[0] for t in g.members), g.members[0].shape[1])
    owner = lpt(costs, size)
    return {g.key: owner[solve_unit(g.key, expert_batch)] for g in groups}


def solve_unit(key: str, expert_batch: int) -> str:
    """What one rank owns: a group, or a routed expert's solve batch
    "{experts module}:{role}#{e // expert_batch}" (quantize.gptq_expert_batch)."""
    m = EXPERT_GROUP.match(key)
    return key if m is None else f"{m['parent']}:{m['role']}#{int(m['e']) // max(1, expert_batch)}"
