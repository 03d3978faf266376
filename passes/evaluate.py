"""`eval`: measure the staged artifact against its source checkpoint before it is published.

`tfcompile quantize --eval` schedules this pass after `verify`. It runs
`tfcompile eval`'s evaluation (tfcompile.evaluate: the artifact with its
dequantized weights, activation and KV-cache emulation, against the source
checkpoint, on the same tokens), and with `tasks` the lm-eval task gates
(tfcompile/tasks) on the staged artifact and the source, and returns the
figures as a fact (`EVALUATION`, declared here), which the manifest records under an
`"eval"` key when it is written after the last pass. A missed gate raises
`GateFailed` (exit 1): nothing is published at OUT; the error carries the
manifest the artifact would have had (its eval section with the worst layers),
and run_pipeline keeps the staged artifact with it at OUT.rejected
(tfcompile/artifact/rejected.py; `keep_rejected = false` deletes it).

The section holds no paths of the staging directory, no timings, and floats
rounded to 6 significant digits, so reruns stay byte-identical (the
evaluation itself is deterministic on a given machine: fixed tokens, no
sampling, inference mode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from tfcompile.dist.devices import check_device
from tfcompile.errors import UserError
from tfcompile.evaluate import gate_error
from tfcompile.evaluate.gates import worst_layers
from tfcompile.evaluate.kvtext import KV_MODES
from tfcompile.evaluate.text import CORPUS
from tfcompile.facts import fact
from tfcompile.io.jsonfile import JsonDict
from tfcompile.pipeline.intents import RunsTheModel
from tfcompile.pipeline.passes import PassResult, Unsupported, given, register_pass
from tfcompile.manifest_doc import manifest_doc
from tfcompile.recipe import Recipe
from tfcompile.tasks.gate import require_lm_eval, resolve, run_task_gates

SIG_DIGITS = 6  # manifest floats: insensitive to summation order in the last bits


@dataclass(frozen=True)
class EvalConfig:
    text: str = CORPUS  # "python-doc" (the corpus' held-out split) or a UTF-8 text file
    max_tokens: int = 16384  # tokens of text evaluated
    seq_len: int = 0  # tokens per row; 0 = 256, or the model's maximum if smaller
    batch_size: int = 4  # rows per forward pass
    dtype: str = "float32"  # compute dtype of both models
    kv_cache: str = "auto"  # auto: emulate the FP8 KV cache when the artifact has one; off
    max_kl: float | None = None  # gate: kl_mean (nats/token) <= this
    max_ppl_increase: float | None = None  # gate: perplexity / reference - 1 <= this
    min_top1: float | None = None  # gate: top-1 agreement >= this
    device: str = field(default="auto", metadata={"runtime": True})  # where both models run (--device)
    # also store per-layer figures: each Linear's output SQNR and the KL per decoder layer (logit
    # lens); quantize --report sets it, for the report's plots
    details: bool = False
    # lm-eval task gates (--task, tfcompile/tasks): task names or YAML paths, each scored on the
    # staged artifact and on the source; max_task_drop in points; task_limit documents (0 = all)
    tasks: tuple[str, ...] = ()
    max_task_drop: float | None = None
    task_limit: int = 0
    # a missed gate keeps the staged artifact, manifest written, at OUT.rejected/ (--no-keep-rejected)
    keep_rejected: bool = field(default=True, metadata={"runtime": True})


def _supports(recipe: Recipe, cfg: EvalConfig) -> list[Unsupported]:
    from tfcompile.evaluate.runner import DTYPES  # lazy: the evaluator (docs/design.md "Pass modules")
    reasons = []
    if cfg.dtype not in DTYPES:
        reasons.append(Unsupported(f"eval.dtype {cfg.dtype!r} is not one of {', '.join(DTYPES)}"))
    if cfg.kv_cache not in KV_MODES:
        reasons.append(Unsupported(f"eval.kv_cache {cfg.kv_cache!r} is not one of {', '.join(KV_MODES)}"))
    for name in ("max_tokens", "batch_size"):
        if getattr(cfg, name) < 1:
            reasons.append(Unsupported(f"eval.{name} must be at least 1, got {getattr(cfg, name)}"))
    if cfg.seq_len < 0:
        reasons.append(Unsupported(f"eval.seq_len must be 0 (default) or positive, got {cfg.seq_len}"))
    check_device(cfg.device, "eval.device")
    if cfg.text != CORPUS and not Path(cfg.text).is_file():  # fail before quantizing, not after
        reasons.append(Unsupported(f"evaluation text {cfg.text} does not exist or is not a file "
                                   "(--eval-text python-doc|FILE)"))
    if cfg.tasks:  # lm-eval installed, every YAML readable: before quantizing
        try:
            require_lm_eval()
            resolve(tuple(cfg.tasks))
        except UserError as e:
            reasons.append(Unsupported(f"{e.message} ({e.hint})"))
    return reasons


# the figures and gates (no other pass reads them: declared here); the manifest's "eval" section
EVALUATION = fact("evaluation", dict, "the evaluation's figures and gates (--eval)",
                  manifest=lambda ctx, section: {"eval": section}, owner=__name__)


@register_pass("eval", config=EvalConfig, requires=("source_path", "manifest", "out_dir"),
               produces=(EVALUATION,), supports=_supports, when=given("eval"),
               intents=lambda c: (RunsTheModel("eval"),))
def evaluate_artifact(ctx, cfg: EvalConfig, reporter) -> PassResult:
    """Evaluate the staged artifact against the source; the manifest records the figures."""
    from tfcompile.evaluate.runner import evaluate  # lazy: the evaluator (docs/design.md "Pass modules")
    doc = evaluate(Path(ctx.out_dir), Path(ctx.source_path),
                   text=None if cfg.text == CORPUS else Path(cfg.text), max_tokens=cfg.max_tokens,
                   seq_len=cfg.seq_len or None, batch_size=cfg.batch_size, dtype=cfg.dtype,
                   kv_cache=cfg.kv_cache, progress=reporter, layer_kl=cfg.details, manifest=ctx.manifest,
                   device=cfg.device, world=ctx.world,
                   thresholds={"max-kl": cfg.max_kl, "max-ppl-increase": cfg.max_ppl_increase,
                               "min-top1": cfg.min_top1})
    if cfg.tasks:
        doc["tasks"] = run_task_gates(Path(ctx.out_dir), Path(ctx.source_path), tuple(cfg.tasks),
                                      max_drop=cfg.max_task_drop, limit=cfg.task_limit or None, dtype=cfg.dtype,
                                      kv_cache=cfg.kv_cache, device=cfg.device, manifest=ctx.manifest,
                                      progress=reporter)
        doc["ok"] = doc["ok"] and all(t["passed"] for t in doc["tasks"])
    section = manifest_section(doc, details=cfg.details)
    for w in doc["warnings"]:
        reporter.warn(f"eval: {w}")
    err = gate_error(doc["gates"], doc.get("tasks", []), doc["layers"])
    if err is not None:
        section = {**section, "worst_layers": _rounded(worst_layers(doc["layers"]))}
        err.report = section  # the CLI's --json prints the figures that missed
        if cfg.keep_rejected:  # run_pipeline writes it into the staged artifact and keeps that
            err.rejected_manifest = manifest_doc(ctx.add(EVALUATION, section))
        raise err
    m = section["metrics"]
    return PassResult(ctx.add(EVALUATION, section),
                      {"perplexity": m["perplexity"], "reference_perplexity": m["reference_perplexity"],
                       "ppl_increase": m["ppl_increase"], "kl_mean": m["kl_mean"],
                       "top1_agreement": m["top1_agreement"], "tokens": m["tokens"],
                       "kv_cache_emulated": section["kv_cache"]["emulated"], "gates": len(section["gates"])})


def manifest_section(doc: dict, details: bool = False) -> JsonDict:
    """The eval report (tfcompile.evaluate.evaluate) as stored in the manifest: no paths of the
    staging directory, no timings, rounded floats; per-layer rows (`layers`: output SQNR per
    Linear; `layer_kl`: KL per decoder layer, on `layer_kl_positions` positions) only with
    `details`, else their summary only."""
    keep = ("ok", "activations", "dtype", "text", "kv_cache", "metrics", "layer_summary", "gates", "tasks")
    keep += ("layers", "layer_kl", "layer_kl_positions") if details else ()
    return _rounded({k: doc[k] for k in keep if k in doc})


def _rounded(v):
    if isinstance(v, float):
        return float(f"{v:.{SIG_DIGITS}g}") if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v
