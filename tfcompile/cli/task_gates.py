"""What `eval` and `quantize --eval` share for release gating: --task (lm-eval task gates),
--junit (the gates as JUnit XML), the tasks table and the worst layers of a missed gate."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from tfcompile.evaluate.gates import worst_layers
from tfcompile.evaluate.junit import write_junit
from tfcompile.tasks.gate import require_lm_eval, resolve

TASK_HELP = ("Gate on an lm-evaluation-harness task (repeatable): a task name (its data in the local Hub "
             "cache), a task YAML (local data: dataset_path json + data_files), or pydoc-cloze (this "
             "project's own, built from python3.11-doc). Needs the eval extra: pip install 'tfcompile[eval]'.")
DROP_HELP = "Gate: each task's primary metric may drop at most this many points (0-100) below the reference's."
LIMIT_HELP = "Score only the first N documents of each task (lm-eval --limit)."
JUNIT_HELP = "Also write the gates as JUnit XML to FILE: one test case per figure gate and per task gate."


def task_options(f):
    """--task, --max-task-drop, --limit and --junit (`tfcompile eval`)."""
    for opt in reversed([
        click.option("--task", "tasks", multiple=True, metavar="NAME|YAML", help=TASK_HELP),
        click.option("--max-task-drop", type=float, metavar="POINTS", help=DROP_HELP),
        click.option("--limit", "task_limit", type=click.IntRange(min=1), metavar="N", help=LIMIT_HELP),
        click.option("--junit", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE", help=JUNIT_HELP),
    ]):
        f = opt(f)
    return f


def check_task_args(tasks: tuple[str, ...], max_task_drop: float | None, limit: int | None) -> None:
    """Usage errors (exit 2) and a missing lm-eval (exit 1, hint naming the extra), before any work."""
    if not tasks and (max_task_drop is not None or limit is not None):
        raise click.UsageError("--max-task-drop and --limit need --task NAME|YAML")
    if tasks:
        require_lm_eval()
        resolve(tasks)  # an unreadable YAML fails now, not after the figures


def finish_doc(doc: dict, junit: Path | None, name: str) -> dict:
    """`doc` with `tasks` (always a list), `worst_layers` when a gate failed; the JUnit file written."""
    tasks = doc.get("tasks", [])
    ok = doc["ok"] and all(t["passed"] for t in tasks)
    doc = {**doc, "tasks": tasks, "ok": ok}
    if not ok:
        doc["worst_layers"] = worst_layers(doc.get("layers") or [])
    if junit is not None:
        write_junit(junit, doc["gates"], tasks, name)
    return doc


def _pts(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def tasks_table(tasks: list[dict]) -> Table:
    t = Table(title="task gates (lm-evaluation-harness; points = metric x 100)")
    for col in ("task", "metric", "reference", "candidate", "drop", "limit", "result"):
        t.add_column(col, justify="left" if col in ("task", "metric") else "right")
    for e in tasks:
        status = "[green]pass[/]" if e["passed"] else "[red]FAIL[/]"
        t.add_row(e["task"], e["metric"], _pts(e["reference"]), _pts(e["candidate"]), _pts(e["drop"]),
                  "-" if e["threshold"] is None else f"{e['threshold']:g}", status)
    return t


def worst_table(rows: list[dict]) -> Table:
    t = Table(title="worst layers (lowest output SQNR first; share = of the summed relative output noise)")
    for col in ("module", "isolated dB", "e2e dB", "share"):
        t.add_column(col, justify="left" if col == "module" else "right")
    for w in rows:
        t.add_row(w["module"], _pts(w["sqnr_db"]), _pts(w["e2e_sqnr_db"]),
                  "-" if w["noise_share"] is None else f"{100 * w['noise_share']:.0f}%")
    return t
