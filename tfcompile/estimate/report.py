"""The resource plan as a table on stderr (`tfcompile plan --estimate`; --json prints the dict)."""

from __future__ import annotations

from rich.table import Table


def _s(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def estimate_table(doc: dict) -> Table:
    m, c, mem = doc["model"], doc["cluster"], doc["memory"]
    where = "this machine (CPU)" if c["devices"] == "cpu" else f"{c['nodes']} node(s) x {c['per_node']} {c['devices']}"
    t = Table(title=f"plan --estimate: {m['architecture']} ({m['params'] / 1e9:.1f}B params, {m['layers']} layers) "
                    f"-> {doc['format']} ({doc['algorithm']}) on {where}, {c['ranks']} rank(s)", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    t.add_row("source", f"{m['source_gb']:.1f} GB, {m['quantized_linears']} Linears quantized in {m['groups']} groups")
    t.add_row("output (exact)", f"{doc['output_gb']:.2f} GB in {doc['passes']['pack']['shards']} shard(s)")
    t.add_row("disk", f"{doc['disk']['output_gb']:.1f} GB at OUT; {doc['disk']['hessian_spill_gb_per_rank']:.1f} GB "
                      "of Hessians per rank in TMPDIR")
    fits = ", ".join(f"{k} {'fits' if v else 'DOES NOT FIT'}" for k, v in mem["fits"].items())
    dev = f"; device {mem['device_gb_per_rank']:.1f} GB per rank" if c["devices"] != "cpu" else ""
    t.add_row("memory", f"host {mem['host_gb_per_rank']:.1f} GB per rank ({mem['host_gb_per_node']:.1f} GB per node)"
                        f"{dev} ({fits})")
    for name, p in doc["passes"].items():
        if name == "distill":
            where = "device" if "device_gb" in p else "host"
            t.add_row(name, f"{p['sharding'] or 'one process'}: {where} {p['ddp_gb_per_rank']:.1f} GB per rank "
                            f"under DDP, {p['fsdp_gb_per_rank']:.1f} GB under FSDP2 (model state; training "
                            "time not estimated)")
            continue
        extra = ", ".join(f"{k} {v}" for k, v in p.items() if k.endswith("_s") or k == "batches_per_rank")
        t.add_row(f"{name}", f"{_s(p['seconds'])} ({extra})" if extra else _s(p["seconds"]))
    t.add_row("total", _s(doc["total_s"]))
    for engine, r in {k: v for k, v in doc.get("engines", {}).items() if isinstance(v, dict)}.items():
        said = "; ".join(p["message"] for p in r["problems"])
        t.add_row(f"{engine} (tp {doc['engines']['tp']})", r["verdict"] + (f": {said}" if said else ""))
    return t
