"""Task gates: lm-eval tasks scored on the candidate and its reference, and the drop between them.

`run_task_gates(candidate, reference, specs, ...)` scores each task twice through the same
adapter (tfcompile.tasks.adapter.TfcompileLM: the artifact as `tfcompile eval` emulates it, the
reference checkpoint as is) and returns one entry per task:

    {task, metric, reference, candidate, drop, threshold, passed, samples}

`reference` / `candidate` are the task's primary metric (the first of its YAML's metric_list) in
points (a 0-1 metric times 100: accuracy 0-100); `drop` = reference - candidate for a
higher-is-better metric (candidate - reference otherwise), so a positive drop is a loss;
`passed` = drop <= threshold (--max-task-drop; always true without one).

A task spec is an lm-eval task name, a path to an lm-eval task YAML (its folder is added to the
task search path, so `include:` and local `data_files` work), or `pydoc-cloze` (this project's
own task, built on first use: tfcompile/tasks/cloze.py). lm-eval is an optional extra: without it
`require_lm_eval()` raises a UserError naming `tfcompile[eval]` (exit 1).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from pathlib import Path

from tfcompile.errors import UserError
from tfcompile.tasks import cloze

EXTRA_HINT = "install the eval extra: pip install 'tfcompile[eval]' (lm-evaluation-harness 0.4.x)"
_SKIP_KEYS = ("alias", "name", "sample_len", "samples")


def require_lm_eval() -> None:
    """UserError (exit 1) unless lm-evaluation-harness can be imported."""
    try:
        found = importlib.util.find_spec("lm_eval") is not None
    except (ImportError, ValueError):  # a broken or blocked (sys.modules[...] = None) install
        found = False
    if not found:
        raise UserError("--task needs lm-evaluation-harness (the lm_eval package), which is not installed",
                        hint=EXTRA_HINT)


def resolve(specs: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(lm-eval task names, extra include folders) for --task values, checked before any model loads."""
    names, include = [], []
    for spec in specs:
        path = cloze.build() if spec == cloze.NAME else Path(spec)
        if path.suffix in (".yaml", ".yml") or path.is_file():
            if not path.is_file():
                raise UserError(f"--task {spec}: no such task YAML", hint="pass an existing lm-eval task "
                                "YAML, an lm-eval task name, or pydoc-cloze")
            names.append(_yaml_task_name(path))
            include.append(str(path.resolve().parent))
        else:
            names.append(spec)
    return names, sorted(set(include))


def _yaml_task_name(path: Path) -> str:
    import yaml  # lazy: PyYAML (~10 ms), only for --task YAML; CLI start-up does not pay it

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"--task {path}: cannot read it as YAML ({e})", hint="pass an lm-eval task YAML") from None
    name = doc.get("task") if isinstance(doc, dict) else None
    if not isinstance(name, str):
        raise UserError(f"--task {path}: the YAML has no `task:` name", hint="an lm-eval task YAML names its "
                        "task in a top-level `task:` key")
    return name


def task_manager(names: list[str], include: list[str]):
    """lm-eval's TaskManager over its own tasks and `include`; UserError for an unknown name."""
    from lm_eval.tasks import TaskManager  # lazy: lm-eval (the optional eval extra), only with --task

    tm = TaskManager(include_path=include or None)
    known = set(tm.all_tasks)
    for n in names:
        if n not in known:
            raise UserError(f"--task {n}: lm-eval knows no such task or group",
                            hint="pass a task name `lm_eval ls tasks` lists, a path to a task YAML, or pydoc-cloze")
    return tm


@contextlib.contextmanager
def _no_tqdm():
    """lm-eval's and datasets' progress bars off (TQDM_DISABLE): the adapter reports its own
    progress through tfcompile's reporter, and stderr stays readable in a CI log."""
    old = os.environ.get("TQDM_DISABLE")
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = old


def score(lm, names: list[str], tm, limit: int | None) -> dict[str, dict]:
    """{task: {metric, value, higher_is_better, samples}} for `lm` (an lm-eval LM instance)."""
    import lm_eval  # lazy: lm-eval (the optional eval extra), only with --task

    with contextlib.redirect_stdout(sys.stderr), _no_tqdm():  # stdout is data (--json)
        out = lm_eval.simple_evaluate(model=lm, tasks=list(names), task_manager=tm, limit=limit,
                                      bootstrap_iters=0, log_samples=False, verbosity="ERROR")
    results, configs = out["results"], out.get("configs", {})
    higher = out.get("higher_is_better", {})
    return {n: _primary(n, results.get(n, {}), configs.get(n, {}), higher.get(n, {}),
                        out.get("n-samples", {}).get(n, {})) for n in names}


def _primary(task: str, res: dict, config: dict, higher: dict, samples: dict) -> dict:
    """The task's first metric of its metric_list (or its first reported one, for a group)."""
    listed = [m["metric"] for m in config.get("metric_list", []) if isinstance(m.get("metric"), str)]
    keys = [k for k in res if k not in _SKIP_KEYS and "_stderr" not in k and isinstance(res[k], (int, float))]
    key = next((k for m in listed for k in keys if k.split(",")[0] == m), keys[0] if keys else None)
    if key is None:
        raise UserError(f"--task {task}: lm-eval reported no metric for it",
                        hint="a task gate needs a task with a numeric metric (multiple choice, exact match...)")
    metric = key.split(",")[0]
    return {"metric": metric, "value": float(res[key]), "higher_is_better": bool(higher.get(metric, True)),
            "samples": samples.get("effective")}


def gate_entries(ref: dict[str, dict], cand: dict[str, dict], max_drop: float | None) -> list[dict]:
    """One entry per task: both scores in points, the drop, and whether it passed."""
    out = []
    for task, r in ref.items():
        c = cand[task]
        scale = 100.0 if 0.0 <= r["value"] <= 1.0 and 0.0 <= c["value"] <= 1.0 else 1.0  # fractions -> points
        rv, cv = r["value"] * scale, c["value"] * scale
        drop = rv - cv if r["higher_is_better"] else cv - rv
        out.append({"task": task, "metric": r["metric"], "reference": round(rv, 4), "candidate": round(cv, 4),
                    "drop": round(drop, 4), "threshold": max_drop,
                    "passed": max_drop is None or drop <= max_drop, "samples": r["samples"]})
    return out


def run_task_gates(candidate: Path, reference: Path, specs: tuple[str, ...], *, max_drop: float | None = None,
                   limit: int | None = None, dtype: str = "float32", kv_cache: str = "auto",
                   device: str = "auto", manifest: dict | None = None, progress=None) -> list[dict]:
    """Score `specs` on the reference checkpoint and on the candidate (artifact or checkpoint)."""
    require_lm_eval()
    names, include = resolve(specs)
    tm = task_manager(names, include)
    from tfcompile.tasks.adapter import TfcompileLM  # lazy: lm-eval and torch (the optional eval extra)

    scores = {}
    for role, kw in (("reference", {"pretrained": str(reference)}),
                     ("candidate", {"artifact": str(candidate), "tokenizer": str(reference), "manifest": manifest,
                                    "kv_cache": kv_cache})):
        if progress is not None:
            progress.task(f"tasks: {role}", None)
        lm = TfcompileLM(dtype=dtype, device=device, progress=progress, **kw)
        scores[role] = score(lm, names, tm, limit)
        del lm  # one model in memory at a time
    return gate_entries(scores["reference"], scores["candidate"], max_drop)
