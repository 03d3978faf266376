"""Choose a format per fusion group under a budget, from each group's measured cost.

Every group starts in the base format (`--format`, the fewest bits) and is upgraded greedily:
each step takes the upgrade (group, format) with the largest predicted KL saved per extra bit
stored, among those that still fit the budget. Costs are additive predictions: the KL of the
model's output with that group alone quantized in that format (sensitivity.py), summed over
groups. Budgets:

- avg_bits: the average stored bits per weight over the candidate groups' weights stays at or
  below it (scales included: NVFP4 4.5, MXFP4 4.25, MXFP8 8.25, FP8 8, bf16 16);
- max_kl: upgrade until the predicted KL is at or below it, with the fewest bits.

Deterministic: ties go to the earlier group (plan order) and the cheaper format.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.schemes import SCHEMES

UNQUANTIZED = "bf16"  # the format name of a group left in the model dtype
UNQUANTIZED_BITS = 16.0


@dataclass(frozen=True)
class GroupCost:
    key: str  # fusion group key
    params: int  # weights in the group
    kl: dict  # format name -> predicted KL with this group alone in that format (base included)


def known(fmt: str) -> bool:
    """A format a group may take: a scheme, or unquantized."""
    return fmt == UNQUANTIZED or fmt in SCHEMES


def bits(fmt: str) -> float:
    """Stored bits per weight of format `fmt`, scales included, as the format states it
    (`Scheme.bits_per_weight`: NVFP4 4 + 8/16, MX 4 or 8 + 8/32; FP8's scales are < 0.01 bits)."""
    return UNQUANTIZED_BITS if fmt == UNQUANTIZED else SCHEMES[fmt].bits_per_weight


def choose(costs: list[GroupCost], base: str, *, avg_bits: float = 0.0, max_kl: float = 0.0) -> dict[str, str]:
    """group key -> format, under `avg_bits` (> 0) or `max_kl` (> 0)."""
    if (avg_bits > 0) == (max_kl > 0):
        raise ValueError("give exactly one of avg_bits and max_kl")
    pick = {c.key: base for c in costs}
    total_params = sum(c.params for c in costs)
    budget = avg_bits * total_params if avg_bits > 0 else float("inf")
    used = bits(base) * total_params
    kl = sum(c.kl[base] for c in costs)
    while max_kl <= 0 or kl > max_kl:
        best = None
        for i, c in enumerate(costs):
            cur = pick[c.key]
            for fmt in sorted(c.kl, key=bits):
                extra = (bits(fmt) - bits(cur)) * c.params
                saved = c.kl[cur] - c.kl[fmt]
                if extra <= 0 or saved <= 0 or used + extra > budget:
                    continue
                score = saved / extra
                if best is None or score > best[0]:
                    best = (score, c, fmt, extra, saved)
        if best is None:
            break
        _, c, fmt, extra, saved = best
        pick[c.key], used, kl = fmt, used + extra, kl - saved
    return pick


def summary(costs: list[GroupCost], pick: dict[str, str]) -> dict:
    """Average bits and predicted KL of a choice, and how many groups took each format."""
    total = sum(c.params for c in costs)
    counts: dict[str, int] = {}
    for c in costs:
        counts[pick[c.key]] = counts.get(pick[c.key], 0) + 1
    return {"avg_bits": round(sum(bits(pick[c.key]) * c.params for c in costs) / max(total, 1), 4),
            "predicted_kl": round(sum(c.kl[pick[c.key]] for c in costs), 6),
            "groups_per_format": dict(sorted(counts.items()))}
