"""Quality gates: thresholds on the metrics that decide the exit code."""

from __future__ import annotations

from tfcompile.evaluate.errors import GateFailed

# option -> (metric key, "max" | "min", unit for messages)
GATES = {
    "max-kl": ("kl_mean", "max", " nats"),
    "max-ppl-increase": ("ppl_increase", "max", ""),
    "min-top1": ("top1_agreement", "min", ""),
    "min-acceptance": ("acceptance_length", "min", " tokens/forward"),  # eval --draft (tfcompile/draft)
}


def check_gates(metrics: dict, thresholds: dict[str, float | None]) -> list[dict]:
    """One entry per given threshold: {gate, metric, threshold, value, ok}."""
    out = []
    for gate, threshold in thresholds.items():
        if threshold is None:
            continue
        key, kind, _ = GATES[gate]
        value = metrics[key]
        ok = value <= threshold if kind == "max" else value >= threshold
        out.append({"gate": gate, "metric": key, "threshold": threshold, "value": value, "ok": bool(ok)})
    return out


def gate_error(gates: list[dict]) -> GateFailed | None:
    """The error for the missed gates (None when all passed)."""
    failed = [g for g in gates if not g["ok"]]
    if not failed:
        return None
    parts = []
    for g in failed:
        _, kind, unit = GATES[g["gate"]]
        op = ">" if kind == "max" else "<"
        value = "not finite" if g["value"] is None else f"{g['value']:.6g}{unit}"
        parts.append(f"--{g['gate']}: {g['metric']} {value} {op} {g['threshold']:g}{unit}")
    if all(g["gate"] == "min-acceptance" for g in failed):
        return GateFailed(f"quality gate failed: {parts[0]}",
                          hint="train the draft against the model as served (`tfcompile draft MODEL "
                               "--target-artifact ART`), longer, or relax --min-acceptance")
    return GateFailed(
        f"quality gate{'s' if len(parts) > 1 else ''} failed: " + "; ".join(parts),
        hint="inspect the per-layer SQNR (the worst layers are usual --ignore candidates), "
             "try a higher-precision format, or relax the threshold if the loss is acceptable")
