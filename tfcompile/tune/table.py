"""The tuning table: kernels/tuning.json in the artifact.

{
  "schema_version": 1,
  "cost_model": {...hardware.MODEL...},
  "entries": {
    "<kernel>:<target>:<N>x<K>:m<M>:triton-<version>": {
      "kernel", "target", "n", "k", "m_bucket", "triton",
      "config": {...knobs...},
      "method": "cost-model" | "measured" | "default",
      "predicted_us": 12.3,            # cost model (every method)
      "measured_us": 10.1,             # "measured" only (triton.testing.do_bench, median)
      "device": "NVIDIA H100 ...",     # "measured" only
      "bound", "tiles", "waves",       # the cost model's view of the chosen config
      "runner_up": [{"config", "predicted_us"[, "measured_us"]}, ...],   # next best, up to 3
      "space": {"candidates": 1920, "feasible": 412, "pruned": {"shape": .., "smem": ..}}
    }, ...
  }
}

Deterministic: sorted keys (tfcompile.io.jsonfile), floats rounded to 4 significant
digits, no timestamps or paths, so the same inputs give a byte-identical file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping

from tfcompile.errors import UserError
from tfcompile.io.bounded import load_json
from tfcompile.tune.hardware import MODEL
from tfcompile.tune.search import Choice
from tfcompile.tune.shapes import Problem

TABLE = "kernels/tuning.json"
SCHEMA_VERSION = 1
RUNNERS_UP = 3


def triton_version() -> str:
    import triton  # lazy: for its version string only; triton's import costs ~1 s

    return triton.__version__


def sig4(v: float) -> float:
    return float(f"{v:.4g}")


def entry_key(p: Problem, triton: str) -> str:
    return f"{p.key}:triton-{triton}"


def cost_entry(c: Choice, triton: str, default_config: Mapping) -> dict:
    """A cost-model entry for one ranked problem (or the kernel default if nothing fit)."""
    p = c.problem
    doc = {"kernel": p.kernel, "target": p.target, "n": p.n, "k": p.k, "m_bucket": p.m, "triton": triton,
           "space": {"candidates": c.candidates, "feasible": c.feasible, "pruned": dict(c.pruned)}}
    if c.best is None:
        return {**doc, "config": dict(default_config), "method": "default", "runner_up": []}
    e = c.best.est
    doc.update(config=dict(c.best.config), method="cost-model", predicted_us=sig4(e.us), bound=e.bound,
               tiles=e.tiles, waves=e.waves,
               runner_up=[{"config": dict(r.config), "predicted_us": sig4(r.est.us)}
                          for r in c.ranked[1:1 + RUNNERS_UP]])
    return doc


def measured_entry(c: Choice, triton: str, times: list[tuple[dict, float]], device: str) -> dict:
    """`times`: (config, median us) of the configs measured, fastest first."""
    predicted = {json.dumps(r.config, sort_keys=True): r.est.us for r in c.ranked}
    doc = cost_entry(c, triton, {})
    best_cfg, best_us = times[0]
    pred = lambda cfg: sig4(predicted[json.dumps(cfg, sort_keys=True)])  # noqa: E731
    doc.update(config=dict(best_cfg), method="measured", measured_us=sig4(best_us), device=device,
               predicted_us=pred(best_cfg),
               runner_up=[{"config": dict(cfg), "measured_us": sig4(us), "predicted_us": pred(cfg)}
                          for cfg, us in times[1:1 + RUNNERS_UP]])
    return doc


def empty_table() -> dict:
    return {"schema_version": SCHEMA_VERSION, "cost_model": dict(MODEL), "entries": {}}


def load_table(path: Path) -> dict:
    """Read a tuning table (an artifact's kernels/tuning.json, or a file); UserError when unusable."""
    if not Path(path).exists():
        raise UserError(f"{path}: no tuning table", hint="run `tfcompile tune ARTIFACT` first")
    # a regular file under 16 MiB, at most 64 deep (io/bounded.py)
    doc = load_json(path, "tuning table", hint="delete it and run `tfcompile tune` again")
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION \
            or not isinstance(doc.get("entries"), dict):
        raise UserError(f"{path}: not a tuning table of schema {SCHEMA_VERSION}",
                        hint="delete it and run `tfcompile tune` again")
    return doc


def lookup(table: Mapping | None, p: Problem, triton: str) -> dict | None:
    if not table:
        return None
    return table["entries"].get(entry_key(p, triton))


def merge(old: Mapping | None, entries: Mapping[str, dict]) -> dict:
    """`old` updated with `entries` (same keys replaced; others, e.g. other targets or
    triton versions, kept). The cost model's constants are the current ones."""
    doc = empty_table()
    if old:
        doc["entries"].update(old["entries"])
    doc["entries"].update(entries)
    doc["entries"] = dict(sorted(doc["entries"].items()))
    return doc

