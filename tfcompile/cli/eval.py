"""`tfcompile eval`: perplexity, KL, top-1 and per-layer SQNR against a reference, with gates."""

from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from tfcompile.artifact.engines import SERVED_ON
from tfcompile.artifact.manifest import MANIFEST, load_manifest
from tfcompile.cli.model_ref import resolve_params
from tfcompile.cli.output import RichReporter, emit_json, rank_output
from tfcompile.cli.task_gates import check_task_args, finish_doc, task_options, tasks_table, worst_table
from tfcompile.dist import current
from tfcompile.dist.failure import supervise
from tfcompile.errors import VerifyError
from tfcompile.evaluate import gate_error
from tfcompile.evaluate.kvtext import KV_MODES, describe
from tfcompile.tasks.gate import run_task_gates


def _fmt(v, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def _db(v) -> str:
    return "inf" if v is None else f"{v:.2f}"  # null SQNR: no error at all


def table_rows(doc: dict) -> list[dict]:
    """The eval table as [{row, value}] plain text (stderr's table; `table` in --json). `doc`: the
    report, or quantize --eval's manifest section (which has no model/format keys)."""
    m = doc["metrics"]
    fmt = (doc["format"] or "none (checkpoint)") if "format" in doc else "artifact"
    rows = [("format", f"{fmt}, activations {doc['activations'] or 'not quantized'}"),
            ("KV cache", describe(doc.get("kv_cache"))),
            ("tokens", f"{m['tokens']} in {doc['text']['sequences']} sequences ({doc['text']['source']})"),
            ("perplexity", f"{_fmt(m['perplexity'])} (reference {_fmt(m['reference_perplexity'])}, "
                           f"{_fmt(None if m['ppl_increase'] is None else 100 * m['ppl_increase'], '+.2f')}%)"),
            ("KL(ref || model)", f"{_fmt(m['kl_mean'], '.6f')} nats/token (max {_fmt(m['kl_max'], '.4f')})"),
            ("top-1 agreement", _fmt(m["top1_agreement"]))]
    s = doc["layer_summary"]
    if s["count"]:
        rows.append(("worst layer SQNR", f"{_fmt(s['worst_sqnr_db'], '.2f')} dB ({s['worst_module']})"))
    for g in doc["gates"]:
        rows.append((f"gate --{g['gate']}", f"{'pass' if g['ok'] else 'FAIL'} {_fmt(g['value'], '.6g')} "
                                            f"vs {g['threshold']:g}"))
    for e in doc.get("tasks", []):
        rows.append((f"task {e['task']}", f"{'pass' if e['passed'] else 'FAIL'} {e['metric']} "
                     f"{e['candidate']:.2f} (reference {e['reference']:.2f}, drop {e['drop']:.2f} points)"))
    return [{"row": r, "value": v} for r, v in rows]


def metrics_table(doc: dict, title: str | None = None) -> Table:
    """The report (or quantize --eval's manifest section) as a two-column table."""
    t = Table(title=title or f"eval {doc['model']} vs {doc['reference']}", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    for r in table_rows(doc):
        value = r["value"]
        if r["row"].startswith(("gate ", "task ")):  # pass / FAIL in colour
            status, _, rest = value.partition(" ")
            value = f"{'[green]pass[/]' if status == 'pass' else '[red]FAIL[/]'} {rest}"
        t.add_row(r["row"], value)
    return t


def layers_table(layers: list[dict]) -> Table:
    t = Table(title="per-layer output SQNR (dB; isolated = reference input, e2e = in the model)")
    for col in ("module", "shape", "isolated", "e2e"):
        t.add_column(col, justify="left" if col == "module" else "right")
    for la in layers:
        t.add_row(la["module"], "x".join(map(str, la["shape"])), _db(la["sqnr_db"]), _db(la["e2e_sqnr_db"]))
    return t


@click.command("eval")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--reference", required=True, type=click.Path(path_type=Path),
              help="The original checkpoint to compare against (its tokenizer is used): a directory "
              "or a Hugging Face Hub id ORG/NAME.")
@click.option("--revision", metavar="REV", help="Branch, tag or commit of a Hub --reference (default main).")
@click.option("--text", type=click.Path(path_type=Path),
              help="Evaluation text (UTF-8 file), or python-doc (the default): the held-out split "
              "of tfcompile.calibration.corpus.")
@click.option("--max-tokens", type=int, default=16384, show_default=True, help="Tokens of text to evaluate.")
@click.option("--seq-len", type=int, default=None, help="Tokens per sequence [default: 256, or the model's maximum].")
@click.option("--batch-size", type=int, default=4, show_default=True, help="Sequences per forward pass.")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
              show_default=True, help="Compute dtype of both models.")
@click.option("--kv-cache", type=click.Choice(KV_MODES), default="auto", show_default=True,
              help="auto: emulate the artifact's FP8 KV cache when it has one (kv_cache_scheme); off: never.")
@click.option("--served-on", type=click.Choice(list(SERVED_ON)), default=None,
              help="Score what ENGINE:TARGET serves where it reads the artifact otherwise than written "
              "(vllm:sm_100a: an mxfp4a16 artifact's activations quantized as W4A4 MXFP4, vLLM #56770); "
              "default: as written.")
@click.option("--max-kl", type=float, help="Gate: mean KL(ref || model) in nats must be <= this.")
@click.option("--max-ppl-increase", type=float, help="Gate: relative perplexity increase, e.g. 0.05 = 5%.")
@click.option("--min-top1", type=float, help="Gate: top-1 agreement with the reference must be >= this.")
@click.option("--device", default="auto", show_default=True, metavar="auto|cpu|cuda|cuda:N",
              help="Where both models run (auto: the GPU when torch sees one). Under torchrun each rank "
              "evaluates every N-th batch and the figures equal one process's.")
@click.option("--layers/--no-layers", default=True, help="Show the per-layer table.")
@click.option("--layer-kl", is_flag=True, help="Also KL per decoder layer (logit lens: each layer's hidden "
              "states through the final norm and lm_head), as `layer_kl` in --json; tfcompile report plots it.")
@click.option("--draft", metavar="DIR|ngram|mtp", help="Also measure speculative decoding: a speculators EAGLE-3 "
              "draft (`tfcompile draft`), ngram (prompt lookup) or mtp (the model's own MTP layer, DeepSeek-V3 / "
              "GLM-4.5 style; for an artifact also the reference's) against MODEL as served, on held-out prompts.")
@click.option("--draft-k", default="4", show_default=True, metavar="K[,K...]", help="Draft lengths to measure.")
@click.option("--draft-prompts", type=int, default=8, show_default=True, help="Prompts of the evaluation text.")
@click.option("--draft-prompt-len", type=int, default=64, show_default=True, help="Tokens per prompt.")
@click.option("--draft-new-tokens", type=int, default=64, show_default=True, help="Tokens decoded per prompt.")
@click.option("--min-acceptance", type=float, help="Gate: mean acceptance length (tokens per target forward) "
              "at the first --draft-k must be >= this.")
@task_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
@click.option("-q", "--quiet", is_flag=True, help="No progress on stderr.")
@click.option("--no-verify", "no_verify", is_flag=True, help="Skip the integrity checks of an artifact MODEL "
              "(verify's manifest integrity, paths, extra files and checksums) run before evaluating it.")
def eval_cmd(model, reference, revision, text, max_tokens, seq_len, batch_size, dtype, kv_cache, served_on, max_kl,
             max_ppl_increase, min_top1, device, layers, layer_kl, draft, draft_k, draft_prompts, draft_prompt_len,
             draft_new_tokens, min_acceptance, tasks, max_task_drop, task_limit, junit, as_json, quiet, no_verify):
    """Evaluate MODEL (artifact or checkpoint) against --reference: perplexity, KL, top-1, layer SQNR.

    An artifact is checked first as `verify` checks its files (--no-verify skips it).
    Exit 1 when a gate (--max-kl, --max-ppl-increase, --min-top1, --min-acceptance, --max-task-drop)
    is missed."""
    if min_acceptance is not None and not draft:
        raise click.UsageError("--min-acceptance needs --draft DIR|ngram|mtp")
    check_task_args(tasks, max_task_drop, task_limit)
    ks = _ks(draft_k)
    paths = {"reference": reference, "model": model, "quiet": quiet}
    resolve_params(paths, ("reference", "model"), revision)  # Hub ids -> the Hugging Face cache
    model, reference = paths["model"], paths["reference"]
    if not no_verify:
        check_artifact_files(Path(model))
    if draft == "mtp":  # before the evaluation: a model without (or an artifact without) its MTP layer
        from tfcompile.draft.mtp_load import check_mtp  # lazy: torch

        check_mtp(Path(model))
        if (Path(model) / MANIFEST).exists():  # an artifact: the reference's MTP layer is measured beside it
            check_mtp(Path(reference))
    console, quiet, as_json = rank_output(quiet, as_json)
    reporter = RichReporter(console, quiet=quiet)
    from tfcompile.evaluate.runner import evaluate  # lazy: torch and transformers, only when the command runs

    world = current()
    world.begin_run()
    with supervise(world):
        doc = evaluate(model, reference, text=text, max_tokens=max_tokens, seq_len=seq_len,
                       batch_size=batch_size, dtype=dtype, kv_cache=kv_cache, progress=reporter, layer_kl=layer_kl,
                       thresholds={"max-kl": max_kl, "max-ppl-increase": max_ppl_increase, "min-top1": min_top1},
                       device=device, world=world, served_on=served_on)
    if draft and world.is_root:
        doc = _with_draft(doc, model, reference, draft, ks, text=text, prompts=draft_prompts,
                          prompt_len=draft_prompt_len, new_tokens=draft_new_tokens, dtype=dtype, kv_cache=kv_cache,
                          device=device, reporter=reporter, min_acceptance=min_acceptance)
    if tasks and world.is_root:
        doc = _with_tasks(doc, model, reference, tasks, max_drop=max_task_drop, limit=task_limit, dtype=dtype,
                          kv_cache=kv_cache, device=device, reporter=None if quiet else reporter)
    doc = finish_doc(doc, junit if world.is_root else None, name=Path(model).name)
    doc["table"] = table_rows(doc)
    reporter._stop()
    for w in doc["warnings"]:
        reporter.warn(w)
    if as_json:
        emit_json(doc)
    elif not quiet:
        _print_tables(console, doc, layers)
    err = gate_error(doc["gates"], doc["tasks"], doc["layers"])
    if err is not None and world.is_root:  # under torchrun rank 0 reports the missed gate (exit 1)
        raise err


def _print_tables(console, doc: dict, layers: bool) -> None:
    console.print(metrics_table(doc))
    if layers and doc["layers"]:
        console.print(layers_table(doc["layers"]))
    if doc["tasks"]:
        console.print(tasks_table(doc["tasks"]))
    if doc.get("draft"):
        console.print(draft_table(doc["draft"]))
    if doc.get("worst_layers"):
        console.print(worst_table(doc["worst_layers"]))


def _with_tasks(doc: dict, model, reference, tasks, *, reporter, **kw) -> dict:
    """The report with `tasks`: each lm-eval task scored on MODEL (as served) and the reference."""
    entries = run_task_gates(Path(model), Path(reference), tasks, progress=reporter, **kw)
    return {**doc, "tasks": entries}


def _ks(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(v) for v in value.split(","))
    except ValueError:
        ks = ()
    if not ks or min(ks) < 1:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive integers",
                                 param_hint="--draft-k")
    return ks


def _with_draft(doc: dict, model, reference, draft: str, ks, *, reporter, min_acceptance, **kw) -> dict:
    """The report with `draft` (speculative decoding figures) and the --min-acceptance gate."""
    from tfcompile.draft.acceptance import acceptance_gate, eval_draft  # lazy: torch, transformers models

    report = eval_draft(Path(model), Path(reference), draft, ks=ks, progress=reporter, **kw)
    gate = acceptance_gate(report, min_acceptance)
    gates = doc["gates"] + ([gate] if gate else [])
    return {**doc, "draft": report, "gates": gates, "ok": doc["ok"] and all(g["ok"] for g in gates)}


def draft_table(rep: dict) -> Table:
    t = Table(title=f"speculative decoding ({rep['drafter']}; {rep['prompts']} prompts of {rep['prompt_len']} "
                    f"tokens, {rep['new_tokens']} new tokens each, greedy)")
    source = "source" in rep  # --draft mtp on an artifact: the reference's own MTP layer beside it
    cols = ("k", "acceptance length", *(("source's",) if source else ()), "per position", "cost ratio",
            "modelled speedup", "n-gram floor")
    for col in cols:
        t.add_column(col, justify="right")
    floor = {r["k"]: r["acceptance_length"] for r in rep.get("ngram_floor", [])}
    for r in rep["by_k"]:
        pos = " ".join("-" if p is None else f"{p:.2f}" for p in r["per_position"])
        src = (_fmt(r.get("source_acceptance_length"), ".3f"),) if source else ()
        t.add_row(str(r["k"]), f"{r['acceptance_length']:.3f}", *src, pos, _fmt(r["cost_ratio"], ".3f"),
                  _fmt(r["modelled_speedup"], ".2f"), _fmt(floor.get(r["k"]), ".3f"))
    return t


def check_artifact_files(path: Path) -> None:
    """VerifyError unless an artifact's files are those its manifest lists (a checkpoint passes)."""
    if not (path / MANIFEST).exists() and not (path / MANIFEST).is_symlink():
        return  # a plain checkpoint: nothing to check against
    from tfcompile.artifact.verify import VerifyReport, check_files  # lazy: verify.py imports torch

    rep = VerifyReport(str(path))
    check_files(path, load_manifest(path), rep)
    bad = rep.failures()
    if bad:
        raise VerifyError(f"{path} fails verify's " + "; ".join(f"'{c['check']}' check ({c['detail']})" for c in bad),
                          hint="the artifact changed since it was built: rebuild it, or pass --no-verify to "
                               "evaluate it anyway")


def quantize_eval_table(section: dict) -> Table:
    """`quantize --eval`: the figures stored under the manifest's "eval" key."""
    return metrics_table(section, title="eval of the artifact against MODEL (manifest \"eval\")")


def quantize_eval_failed(err: Exception, *, console, quiet: bool, as_json: bool, recipe,
                         warnings: list[str]) -> None:
    """When `quantize --eval` missed a gate: its figures in a table (stderr) and the --json
    document ({ok: false, output: null, rejected: OUT.rejected or null, eval, eval_table, error});
    other errors are left alone."""
    report = getattr(getattr(err, "inner", None), "report", None)
    if report is None:
        return
    if not quiet and not as_json:
        console.print(quantize_eval_table(report))
        if report.get("worst_layers"):
            console.print(worst_table(report["worst_layers"]))
    if as_json:
        emit_json({"ok": False, "output": None, "rejected": report.get("rejected"), "recipe": recipe.to_dict(),
                   "eval": report, "eval_table": table_rows(report), "error": getattr(err, "message", str(err)),
                   "warnings": list(warnings)})
