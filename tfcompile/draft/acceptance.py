"""Acceptance of a drafter against a target on held-out text: the figures `eval --draft` reports.

Prompts are consecutive `prompt_len`-token rows of the evaluation text (python-doc's held-out
split by default, as `tfcompile eval` cuts it: never the training text); each is decoded
`new_tokens` further by the reference speculative decoder (spec.py) at each k. Reported per k:
mean acceptance length (tokens per target forward), acceptance per draft position, and the
modelled decode speedup tau / (1 + m * c): tau the acceptance length, m the draft tokens
proposed per round, c the measured cost of one draft token over one target verification
forward (wall time in this process: a model of an engine, not a measurement of one).
"""

from __future__ import annotations

from pathlib import Path

import torch

from tfcompile.artifact.manifest import has_manifest
from tfcompile.dist.devices import resolve_device
from tfcompile.draft.format import load_draft
from tfcompile.draft.mtp import TARGET_HIDDEN, MTPDrafter
from tfcompile.draft.mtp_load import load_mtp
from tfcompile.draft.spec import EagleDrafter, NGramDrafter, Stats, Target, greedy, speculative
from tfcompile.errors import UserError
from tfcompile.evaluate.models import load_candidate, load_checkpoint_model
from tfcompile.evaluate.text import load_text, load_tokenizer, token_rows

NGRAM = "ngram"
MTP = "mtp"  # the model's own multi-token-prediction layer (draft/mtp.py)


def prompts_of(text: Path | None, tokenizer, *, count: int, prompt_len: int, vocab: int) -> list[list[int]]:
    rows = token_rows(load_text(text).text, tokenizer, max_tokens=count * prompt_len, seq_len=prompt_len,
                      vocab=vocab)
    rows = [r.tolist() for r in rows if len(r) == prompt_len]
    if not rows:
        raise UserError(f"the evaluation text gives no prompt of {prompt_len} tokens",
                        hint="give a longer --text or a smaller --draft-prompt-len")
    return rows


def drafter_factory(spec: str, model_path: Path | None = None, target_model=None):
    """`ngram` (prompt lookup), `mtp` (the MTP layer of `model_path`, the checkpoint or artifact
    `target_model` was built from) or a speculators EAGLE-3 directory -> (make drafter, aux layers, name)."""
    if spec == NGRAM:
        return NGramDrafter, None, NGRAM
    if spec == MTP:
        layer = load_mtp(Path(model_path), target_model).to(next(target_model.parameters()).device)
        return (lambda: MTPDrafter(layer)), TARGET_HIDDEN, MTP
    draft = load_draft(Path(spec))
    return (lambda: EagleDrafter(draft)), draft.s.aux_layers, "eagle3"


def greedy_refs(target_model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """The target's own greedy continuations (the exactness oracle of `measure`)."""
    return [greedy(Target(target_model), p, new_tokens) for p in prompts]


def measure(target_model, spec: str, prompts: list[list[int]], *, ks: tuple[int, ...], new_tokens: int,
            check_exact: bool = False, refs: list[list[int]] | None = None, progress=None,
            model_path: Path | None = None) -> dict:
    """{drafter, prompts, new_tokens, by_k: [{k, acceptance_length, per_position, ...}], exact}.

    exact: every output equal to `refs` (computed here with check_exact; None: not checked).
    model_path: where target_model came from (`mtp` reads its MTP layer there)."""
    make, aux, name = drafter_factory(spec, model_path, target_model)
    target = Target(target_model, aux)
    by_k, exact = [], None
    if refs is None and check_exact:
        refs = greedy_refs(target_model, prompts, new_tokens)
    if progress is not None:
        progress.task(f"speculative decoding ({name})", len(ks) * len(prompts))
    for k in ks:
        total = Stats(k)
        for i, p in enumerate(prompts):
            out, st = speculative(target, make(), p, new_tokens, k)
            total.add(st)
            if refs is not None:
                exact = (exact is not False) and out == refs[i]
            if progress is not None:
                progress.advance(1)
        by_k.append(figures(total))
    return {"drafter": name, "draft": spec, "prompts": len(prompts), "prompt_len": len(prompts[0]),
            "new_tokens": new_tokens, "by_k": by_k, "exact": exact}


def figures(st: Stats) -> dict:
    per_draft = st.draft_s / st.proposed if st.proposed else 0.0  # seconds per proposed token
    per_forward = st.target_s / max(1, st.forwards)
    c = per_draft / per_forward if per_forward else None
    m = st.proposed / max(1, st.forwards)
    tau = st.acceptance_length
    return {"k": st.k, "acceptance_length": round(tau, 4),
            "per_position": [None if x is None else round(x, 4) for x in st.per_position()],
            "tokens": st.tokens, "target_forwards": st.forwards, "proposed_per_round": round(m, 3),
            "cost_ratio": None if c is None else round(c, 4),
            "modelled_speedup": None if c is None else round(tau / (1 + m * c), 3)}


def acceptance_gate(report: dict, threshold: float | None) -> dict | None:
    """The `--min-acceptance` gate on the first k's acceptance length."""
    if threshold is None:
        return None
    value = report["by_k"][0]["acceptance_length"]
    return {"gate": "min-acceptance", "metric": "acceptance_length", "k": report["by_k"][0]["k"],
            "threshold": threshold, "value": value, "ok": bool(value >= threshold)}



def eval_draft(model_path: Path, reference: Path, spec: str, *, text: Path | None, ks: tuple[int, ...],
               prompts: int, prompt_len: int, new_tokens: int, dtype: str = "float32", kv_cache: str = "auto",
               device: str = "auto", floor: bool = True, progress=None) -> dict:
    """`tfcompile eval MODEL --draft SPEC`: the drafter against MODEL as served (an artifact through
    the eval emulation), on held-out prompts; with `floor`, the n-gram drafter on the same prompts.
    `mtp` on an artifact also measures the reference's own MTP layer against the reference
    (`source`): what quantizing the target and its MTP layer cost in acceptance."""
    dev = resolve_device(device)
    model = load_candidate(Path(model_path), getattr(torch, dtype), kv_cache).model.to(dev).eval()
    tokenizer = load_tokenizer(Path(reference))
    vocab = int(model.get_output_embeddings().weight.shape[0])
    rows = prompts_of(text, tokenizer, count=prompts, prompt_len=prompt_len, vocab=vocab)
    kw = dict(ks=ks, new_tokens=new_tokens, progress=progress)
    report = measure(model, spec, rows, model_path=Path(model_path), **kw)
    report["text"] = load_text(text).source
    if spec == MTP and has_manifest(Path(model_path)):
        ref = load_checkpoint_model(Path(reference), getattr(torch, dtype), "reference").to(dev).eval()
        src = measure(ref, MTP, rows, model_path=Path(reference), **kw)
        report["source"] = {"model": str(reference), "by_k": src["by_k"]}
        for r, s in zip(report["by_k"], src["by_k"]):
            r["source_acceptance_length"] = s["acceptance_length"]
            r["acceptance_drop"] = round(s["acceptance_length"] - r["acceptance_length"], 4)
    if floor and spec != NGRAM:
        ng = measure(model, NGRAM, rows, **kw)
        report["ngram_floor"] = [{"k": r["k"], "acceptance_length": r["acceptance_length"]} for r in ng["by_k"]]
    return report
