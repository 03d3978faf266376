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


WORST = 5  # layers named by a missed gate's error, JSON and report


def figure_failure(g: dict) -> str:
    """`--max-kl: kl_mean 0.12 nats > 0.05 nats` (a figure gate's measured value and limit)."""
    _, kind, unit = GATES[g["gate"]]
    op = ">" if kind == "max" else "<"
    value = "not finite" if g["value"] is None else f"{g['value']:.6g}{unit}"
    return f"--{g['gate']}: {g['metric']} {value} {op} {g['threshold']:g}{unit}"


def task_failure(t: dict) -> str:
    """`--max-task-drop: pydoc_cloze acc dropped 12.5 points > 5 (reference 52, candidate 39.5)`."""
    return (f"--max-task-drop: {t['task']} {t['metric']} dropped {t['drop']:.4g} points > {t['threshold']:g} "
            f"(reference {t['reference']:.4g}, candidate {t['candidate']:.4g})")


def worst_layers(layers: list[dict], n: int = WORST) -> list[dict]:
    """The `n` quantized Linears of lowest output SQNR (isolated), worst first, each with
    `noise_share`: its share of the summed relative output noise power 10^(-SQNR/10) over all
    Linears (a rough estimate of how much of the error leaving it in BF16 would remove)."""
    finite = [la for la in layers if la.get("sqnr_db") is not None]
    total = sum(10 ** (-la["sqnr_db"] / 10) for la in finite)
    rows = sorted(finite, key=lambda la: (la["sqnr_db"], la["module"]))[:n]
    return [{"module": la["module"], "sqnr_db": la["sqnr_db"], "e2e_sqnr_db": la.get("e2e_sqnr_db"),
             "noise_share": round(10 ** (-la["sqnr_db"] / 10) / total, 4) if total else None} for la in rows]


def _layers_hint(worst: list[dict]) -> str:
    if not worst:
        return ("inspect the per-layer SQNR (the worst layers are usual --ignore candidates), try a "
                "higher-precision format, or relax the threshold if the loss is acceptable")
    named = ", ".join(f"{w['module']} ({w['sqnr_db']:.1f} dB"
                      + (f", ~{100 * w['noise_share']:.0f}% of the output noise)" if w["noise_share"] else ")")
                      for w in worst)
    ignore = " ".join(f"--ignore '{w['module']}'" for w in worst)
    return (f"the worst layers by output SQNR: {named}; re-quantize with them left in BF16 "
            f"(`tfcompile quantize ... {ignore}`), or a stronger --format (fp8 or mxfp8 instead of a 4-bit "
            "format), or relax the threshold if the loss is acceptable")


def gate_error(gates: list[dict], tasks: list[dict] = (), layers: list[dict] = ()) -> GateFailed | None:
    """The error for the missed gates (None when all passed): figure gates, then task gates;
    the hint names the worst of `layers` (the per-layer SQNR rows) and the options to try."""
    failed = [g for g in gates if not g["ok"]]
    failed_tasks = [t for t in tasks if not t["passed"]]
    if not failed and not failed_tasks:
        return None
    parts = [figure_failure(g) for g in failed] + [task_failure(t) for t in failed_tasks]
    if failed and not failed_tasks and all(g["gate"] == "min-acceptance" for g in failed):
        return GateFailed(f"quality gate failed: {parts[0]}",
                          hint="train the draft against the model as served (`tfcompile draft MODEL "
                               "--target-artifact ART`), longer, or relax --min-acceptance")
    return GateFailed(f"quality gate{'s' if len(parts) > 1 else ''} failed: " + "; ".join(parts),
                      hint=_layers_hint(worst_layers(list(layers))))
