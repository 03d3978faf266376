"""What `tfcompile tune` shows: a rich table for people (stderr), a JSON document for programs."""

from __future__ import annotations

from typing import Mapping

from rich import box
from rich.table import Table


def _cfg(c: Mapping) -> str:
    """BLOCK_M x BLOCK_N x BLOCK_K, warps/stages/split-K, compactly."""
    tiles = "x".join(str(c[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K") if k in c)
    extra = [f"w{c['num_warps']}" if "num_warps" in c else "", f"s{c['num_stages']}" if "num_stages" in c else "",
             f"k{c['SPLIT_K']}" if c.get("SPLIT_K", 1) > 1 else ""]
    return " ".join([tiles] + [e for e in extra if e])


_BY = {"cost-model": "model", "measured": "measured", "default": "default"}


def summary_tables(entries: Mapping[str, dict], kernels: Mapping) -> list[Table]:
    """One table per (target, kernel), one row per shape and M bucket: the chosen config,
    its time (measured, else predicted) and the rates it implies."""
    groups: dict[tuple, list] = {}
    for e in entries.values():
        groups.setdefault((e["target"], e["kernel"]), []).append(e)
    tables = []
    for (target, kernel), rows in sorted(groups.items()):
        t = Table(title=f"{target}  {kernel}", box=box.SIMPLE_HEAD, title_justify="left")
        for col in ("N x K", "M", "config", "us", "TFLOP/s", "GB/s", "by"):
            t.add_column(col, justify="left" if col in ("N x K", "config", "by") else "right")
        kd = kernels.get(kernel)
        for e in sorted(rows, key=lambda e: (e["n"], e["k"], e["m_bucket"])):
            us, (m, n, k) = e.get("measured_us", e.get("predicted_us")), (e["m_bucket"], e["n"], e["k"])
            t.add_row(f"{n}x{k}" if n else f"k={k}", str(m), _cfg(e["config"]), "-" if us is None else f"{us:.2f}",
                      _rate(kd.flops(m, n, k) if kd and n else None, us, 1e12),
                      _rate(kd.bytes_moved(m, n, k) if kd else None, us, 1e9), _BY.get(e["method"], e["method"]))
        tables.append(t)
    return tables


def _rate(amount, us, unit) -> str:
    if not amount or not us:
        return "-"
    return f"{amount / (us * 1e-6) / unit:,.1f}"


def json_doc(result, path) -> dict:
    """The --json document of `tfcompile tune`."""
    return {
        "ok": True, "artifact": str(path), "table": "kernels/tuning.json", "sha256": result.sha256,
        "seconds": round(result.seconds, 3),
        "serving": {t: {"gemm": list(s.gemm), "act_quant": list(s.act_quant), "note": s.note}
                    for t, s in sorted(result.served.items())},
        "entries": dict(sorted(result.entries.items())), "warnings": list(result.warnings),
    }
