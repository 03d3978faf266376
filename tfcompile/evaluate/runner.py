"""`evaluate()`: run a candidate and its reference on the same tokens and report."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Protocol

import torch

from tfcompile.artifact.engines import served_activations
from tfcompile.dist import LOCAL
from tfcompile.dist.devices import resolve_device
from tfcompile.dist.world import World
from tfcompile.evaluate.errors import EvalError
from tfcompile.evaluate.gates import check_gates
from tfcompile.evaluate.kvcache import KV_MODES, not_emulated
from tfcompile.evaluate.lens import LayerKL, decoder_parts
from tfcompile.evaluate.metrics import LayerSQNR, LogitMetrics
from tfcompile.evaluate.models import load_candidate, load_checkpoint_model
from tfcompile.evaluate.text import batches, load_text, load_tokenizer, token_rows
from tfcompile.io.jsonfile import JsonDict

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_SEQ_LEN = 256


class Progress(Protocol):
    def task(self, description: str, total: int | None) -> None: ...
    def advance(self, n: int = 1, detail: str | None = None) -> None: ...


def _check_positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise EvalError(f"{name} must be at least 1, got {value}", hint=f"pass a positive {name}")


def _vocab(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def evaluate(model_path: Path, reference: Path, *, text: Path | None = None, max_tokens: int = 16384,
             seq_len: int | None = None, batch_size: int = 4, dtype: str = "float32",
             kv_cache: str = "auto", thresholds: dict[str, float | None] | None = None,
             progress: Progress | None = None, layer_kl: bool = False,
             manifest: JsonDict | None = None, device: str = "auto", world: World | None = None,
             layers: bool = True, served_on: str | None = None) -> dict:
    """The report as a JSON-ready dict (see docs/ci.md for the fields).

    kv_cache: "auto" emulates an artifact's FP8 KV cache (kvcache.py), "off" does not.
    layer_kl: also KL per decoder layer through the logit lens (lens.py), as "layer_kl".
    layers: the per-Linear output SQNR rows (False: `layers` is empty; bench/eval_layers.py's
    plain eval, the baseline of what the per-layer figures cost).
    manifest: the artifact's manifest when it is not on disk yet (`quantize --eval`).
    served_on: "ENGINE:TARGET" (artifact/engines.py SERVED_ON): emulate the activations that engine
    runs where it reads the artifact otherwise than written (vLLM 0.32 on sm_100a: mxfp4a16 as W4A4).
    device: where both models run (tfcompile/dist/devices.py). Under torchrun (`world`) batch b
    runs on rank b mod N and every rank gets the figures one process computes, bit for bit."""
    for name, value in (("--max-tokens", max_tokens), ("--seq-len", seq_len), ("--batch-size", batch_size)):
        _check_positive(name, value)
    if dtype not in DTYPES:
        raise EvalError(f"unknown --dtype {dtype!r}", hint="choose one of: " + ", ".join(DTYPES))
    if kv_cache not in KV_MODES:
        raise EvalError(f"unknown --kv-cache {kv_cache!r}", hint="choose one of: " + ", ".join(KV_MODES))
    t0 = time.monotonic()
    source = load_text(text)  # cheap checks first
    ref = load_checkpoint_model(Path(reference), DTYPES[dtype], "reference")
    tokenizer = load_tokenizer(Path(reference))
    try:
        act_as = served_activations(served_on)
    except ValueError as e:
        raise EvalError(str(e), hint="omit --served-on to score the artifact as written") from None
    cand = load_candidate(Path(model_path), DTYPES[dtype], kv_cache, manifest, act_as)
    vocab, ref_vocab = _vocab(cand.model), _vocab(ref)
    if vocab != ref_vocab:
        raise EvalError(f"vocabulary mismatch: {model_path} has {vocab} output tokens, "
                        f"reference {reference} has {ref_vocab}",
                        hint="compare an artifact with the checkpoint it was quantized from")
    seq_len = _seq_len(ref, seq_len)
    rows = token_rows(source.text, tokenizer, max_tokens=max_tokens,
                      seq_len=seq_len, vocab=vocab)
    dev = resolve_device(device, world)
    cand.model.to(dev)
    ref.to(dev)
    lens = LayerKL() if layer_kl else None
    logit_m, layer_m = _run(cand, ref, batches(rows, batch_size), progress, lens, world or LOCAL, dev,
                            per_layer=layers)
    kv_entry, kv_warnings = _kv_report(cand, kv_cache)
    metrics = logit_m.result()
    shapes = {n: list(q.module.weight.shape) for n, q in cand.linears.items()}
    layers = [{**la, "shape": shapes[la["module"]]} for la in layer_m.result()]
    gates = check_gates(metrics, thresholds or {})
    warnings = list(cand.warnings) + kv_warnings
    if not all(math.isfinite(v) for v in metrics.values()):
        warnings.append("some metrics are not finite (reported as null): the model's logits overflow")
        metrics = {k: v if math.isfinite(v) else None for k, v in metrics.items()}
        gates = [{**g, "value": g["value"] if math.isfinite(g["value"]) else None} for g in gates]
    scheme = cand.scheme
    extra = {"layer_kl": lens.result(), "layer_kl_positions": lens.positions} if lens is not None else {}
    return {
        "ok": all(g["ok"] for g in gates),
        "model": str(model_path), "reference": str(reference), "kind": cand.kind,
        "format": scheme.name if scheme else None,
        "activations": (scheme.act if scheme else None),
        "served_on": served_on, "activations_as_served": act_as,  # {written format: format emulated}
        "kv_cache": kv_entry,
        "dtype": dtype,
        "text": {"source": source.source, "tokens": metrics["tokens"], "sequences": len(rows),
                 "seq_len": seq_len, "batch_size": batch_size},
        "metrics": metrics,
        "layers": layers,
        "layer_summary": _layer_summary(layers),
        "gates": gates,
        "warnings": warnings,
        "seconds": round(time.monotonic() - t0, 3),
        **extra,
    }


def _seq_len(ref, seq_len: int | None) -> int:
    max_pos = getattr(ref.config, "max_position_embeddings", None)
    if seq_len is None:
        return min(DEFAULT_SEQ_LEN, max_pos or DEFAULT_SEQ_LEN)
    if max_pos and seq_len > max_pos:
        raise EvalError(f"--seq-len {seq_len} exceeds the reference's max_position_embeddings {max_pos}",
                        hint=f"pass --seq-len {max_pos} or less")
    return seq_len


def _run(cand, ref, work: list[torch.Tensor], progress: Progress | None, lens: LayerKL | None = None,
         world=LOCAL, device: torch.device | str = "cpu", per_layer: bool = True) -> tuple[LogitMetrics, LayerSQNR]:
    """Both models over every [B, L] batch (this rank's, under torchrun); the metrics (and
    `lens`, if given, filled in place)."""
    logit_m, layer_m = LogitMetrics(), LayerSQNR()
    if per_layer:
        layer_m.attach(cand.linears, ref)
    starts = [0]  # batch b's first global position (the lens and the isolated SQNR count in batch order)
    for ids in work:
        starts.append(starts[-1] + ids.numel())
    if lens is not None and not lens.attach(cand.model, ref, starts[-1]):
        lens = None
    mine = range(world.rank, len(work), world.size)
    steps = _LayerSteps(progress, cand.model, ref, len(mine))  # progress per decoder layer, inside a batch
    terms = {}  # batch -> (row terms, layer terms, lens terms): what other ranks replay
    try:
        with torch.inference_mode():
            for b in mine:
                ids = work[b].to(device)
                layer_m.begin(starts[b], ids.numel())  # the isolated SQNR's positions of this batch
                picks = lens.begin(starts[b], ids.numel()) if lens is not None else None
                logits = cand.model(input_ids=ids).logits  # candidate first: layer_m pairs outputs
                ref_logits = ref(input_ids=ids).logits
                rows = logit_m.update(ids, logits, ref_logits, picks=picks)
                if lens is not None:  # its last layer: the KL just computed, on its positions
                    lens.batch_done(logit_m.picked_kl)
                if world.distributed:
                    terms[b] = (rows, layer_m.take(), lens.take() if lens is not None else None)
                steps.batch_done(ids.numel())
    finally:
        steps.detach()
        layer_m.detach()
        if lens is not None:
            lens.detach()
    if world.distributed:
        logit_m, layer_m = _replay(world, cand, terms, len(work), layer_m, lens)
    return logit_m, layer_m


class _LayerSteps:
    """Eval progress in units of one decoder layer of one model (candidate, then reference), so
    a long batch reports inside itself and the ETA follows measured work; models without
    `<base>.layers` report per batch. Total: batches x (candidate layers + reference layers)."""

    def __init__(self, progress: Progress | None, candidate, reference, batches: int):
        self.progress, self.hooks, self.batch, self.batches = progress, [], 1, batches
        parts = [decoder_parts(candidate), decoder_parts(reference)]
        self.per_batch = sum(len(p[0]) for p in parts if p is not None) if all(parts) else 0
        if progress is None:
            return
        progress.task(f"eval {batches} batches" + (f" x {self.per_batch} layers" if self.per_batch else ""),
                      batches * (self.per_batch or 1))
        if self.per_batch:
            for role, (layers, _, _) in zip(("candidate", "reference"), parts):
                for i, layer in enumerate(layers):
                    self.hooks.append(layer.register_forward_hook(self._step(role, i + 1, len(layers))))

    def _step(self, role: str, i: int, n: int):
        def hook(_mod, _args, _out):
            self.progress.advance(1, f"batch {self.batch}/{self.batches}, {role} layer {i}/{n}")
        return hook

    def batch_done(self, tokens: int) -> None:
        if self.progress is not None and not self.per_batch:
            self.progress.advance(1, f"{tokens} tokens")
        self.batch += 1

    def detach(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks.clear()


def _replay(world, cand, terms: dict, n: int, layer_m: LayerSQNR,
            lens: LayerKL | None) -> tuple[LogitMetrics, LayerSQNR]:
    """Every rank's batch terms, added in batch order as one process adds them (bit for bit)."""
    logit_m, layers = LogitMetrics(), LayerSQNR(acc={m: type(a)() for m, a in layer_m.acc.items()})
    calls = dict(cand.kv.calls) if cand.kv is not None else {}
    for part, kv_calls in world.all_objects("eval/terms", (terms, calls)):
        terms.update(part)
        if cand.kv is not None and part is not terms:  # attention calls of every rank (the report)
            for m, k in kv_calls.items():
                cand.kv.calls[m] = cand.kv.calls.get(m, 0) + k
    for b in range(n):
        for row in terms[b][0]:
            logit_m.add(row)
        layers.add(terms[b][1])
    if lens is not None:
        lens.replay([terms[b][2] for b in range(n)])
    return logit_m, layers


def _kv_report(cand, mode: str) -> tuple[dict, list[str]]:
    """The report's kv_cache entry, and warnings for attention the emulation never saw."""
    if cand.kv is None:
        return not_emulated(mode, cand.kv_scales), []
    if not cand.kv.calls:
        raise EvalError("the artifact has an FP8 KV-cache scheme, but no attention call went through "
                        "transformers' AttentionInterface, so the KV cache cannot be emulated",
                        hint="evaluate with --kv-cache off (the figures then leave the KV cache out)")
    unreached = cand.kv.unreached()
    warn = [f"KV-cache emulation: no attention call reached {len(unreached)} module(s) with scales, "
            f"e.g. {unreached[0]}"] if unreached else []
    return cand.kv.report(mode), warn


def _layer_summary(layers: list[dict]) -> dict:
    finite = [la for la in layers if la["sqnr_db"] is not None]
    worst = min(finite, key=lambda la: la["sqnr_db"]) if finite else None
    return {"count": len(layers),
            "worst_module": worst["module"] if worst else None,
            "worst_sqnr_db": worst["sqnr_db"] if worst else None,
            "mean_sqnr_db": round(sum(la["sqnr_db"] for la in finite) / len(finite), 3) if finite else None}
