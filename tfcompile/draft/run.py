"""`tfcompile draft MODEL -o OUT`: build, train and write an EAGLE-3 draft for the target as served.

The target is MODEL (bf16 checkpoint, run in float32 or --compute-dtype) or, with `--target-artifact ART`, the
artifact through `tfcompile eval`'s emulation (what the engine computes). OUT is written
atomically (a staging sibling renamed into place): the speculators files (format.py) and
`tfcompile/draft.json`, the training record (config, target, data, final losses, sizes,
sha256 of the files; no timings or machine paths beyond those given, so the same inputs and
config write the same bytes).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from tfcompile import __version__
from tfcompile.dist.devices import resolve_device
from tfcompile.dist.failure import note_pass, supervise
from tfcompile.dist.world import World, current
from tfcompile.distill.checkpoint import ResumeDir
from tfcompile.draft.config import DEFAULT_DRAFT_VOCAB, DraftConfig, aux_layers, shape_of
from tfcompile.draft.eagle3 import Eagle3Draft
from tfcompile.draft.format import WEIGHTS, load_draft, speculators_config, write_draft
from tfcompile.draft.ranks import resolve_parts, same_as_one_process
from tfcompile.draft.train import draft_vocab, train_draft, training_tokens
from tfcompile.errors import UserError
from tfcompile.evaluate.models import load_candidate, load_checkpoint_model
from tfcompile.evaluate.text import load_tokenizer
from tfcompile.io.atomic import atomic_output_dir
from tfcompile.io.dtypes import dominant_code
from tfcompile.io.bounded import load_json
from tfcompile.io.jsonfile import write_json
from tfcompile.io.sources import open_source
from tfcompile.machine import compute_dtype
from tfcompile.reporter import NullReporter

RECORD = "tfcompile/draft.json"


def load_target(model: Path, artifact: Path | None, dtype: torch.dtype = torch.float32
                ) -> tuple[torch.nn.Module, dict, str]:
    """(the target module computing in `dtype`, eval mode; its config.json dict; what it is)."""
    if artifact is None:
        return load_checkpoint_model(model, dtype, "reference"), _config(model), "checkpoint"
    cand = load_candidate(artifact, dtype)
    if cand.kind != "artifact":
        raise UserError(f"--target-artifact {artifact} is not a tfcompile artifact (no manifest)",
                        hint="pass a directory written by `tfcompile quantize`, or leave the option out "
                             "to train against MODEL")
    return cand.model.eval(), _config(artifact), f"artifact:{cand.scheme.name}"


def _config(path: Path) -> dict:
    cfg = load_json(Path(path) / "config.json", "config.json", hint="check the artifact with `tfcompile verify`")
    if not isinstance(cfg, dict):
        raise UserError(f"{path}/config.json is not a JSON object", hint="check the artifact with `tfcompile verify`")
    cfg.pop("quantization_config", None)
    return cfg


def resolve_compute_dtype(cfg: DraftConfig, model: Path, device: torch.device) -> tuple[DraftConfig, str]:
    """cfg with compute_dtype "auto" resolved (tfcompile.machine.compute_dtype, from MODEL's dominant
    safetensors dtype and this CPU) before anything records it, and why that dtype."""
    if cfg.compute_dtype != "auto":
        return cfg, "forced by --compute-dtype" if cfg.compute_dtype != "float32" else "the default"
    ckpt = open_source(model)
    try:
        dominant = dominant_code(ckpt.info(name).dtype for name in ckpt.names())
    finally:
        ckpt.close()
    name, why = compute_dtype("auto", dominant or "F32", device.type)
    return dataclasses.replace(cfg, compute_dtype=name), why


def target_identity(path: Path) -> str:
    """sha256 over config.json and the safetensors names and sizes (the resume fingerprint)."""
    h = hashlib.sha256((Path(path) / "config.json").read_bytes())
    for f in sorted(Path(path).glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()


def build_draft(target, cfg_json: dict, cfg: DraftConfig, tokens: torch.Tensor) -> Eagle3Draft:
    """A fresh draft: the target's embeddings and lm_head rows (frozen), seeded random layer;
    with cfg.init_from, that draft instead (continued training: its weights and vocabulary)."""
    if cfg.init_from:
        return continue_from(Path(cfg.init_from), cfg_json)
    vocab = int(cfg_json["vocab_size"])
    size = cfg.draft_vocab or min(vocab, DEFAULT_DRAFT_VOCAB)
    if not 0 < size <= vocab:
        raise UserError(f"--draft-vocab {size} must lie in [1, {vocab}]", hint="the target's vocabulary size bounds it")
    aux = aux_layers(int(cfg_json["num_hidden_layers"]), tuple(cfg.aux_layers))
    torch.manual_seed(cfg.seed)
    draft = Eagle3Draft(shape_of(cfg_json, size, aux))
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(target.get_input_embeddings().weight.detach().float())
    set_vocabulary(draft, target.get_output_embeddings().weight.detach().float().cpu(), tokens)
    if cfg.init == "target":
        init_from_target(draft, target)
    for p in (draft.embed_tokens.weight, draft.lm_head.weight):
        p.requires_grad_(False)
    return draft


@torch.no_grad()
def set_vocabulary(draft: Eagle3Draft, head: torch.Tensor, tokens: torch.Tensor) -> None:
    """The draft's vocabulary: the draft_vocab most frequent ids of `tokens` (all ids when it is the
    target's), scored by the target's `head` rows [V, H] for them; d2t / t2d map them."""
    size, vocab = draft.s.draft_vocab, draft.s.vocab
    keep = draft_vocab(tokens, vocab, size) if size < vocab else None
    draft.lm_head.weight.copy_(head if keep is None else head[keep])
    if keep is not None:
        draft.d2t.copy_(keep - torch.arange(size))
        draft.t2d.zero_()
        draft.t2d[keep] = True


def continue_from(path: Path, cfg_json: dict) -> Eagle3Draft:
    """The draft written at `path` (speculators format), checked against this target's shape."""
    draft = load_draft(path)
    want = shape_of(cfg_json, draft.s.draft_vocab, draft.s.aux_layers)
    if draft.s != want:
        raise UserError(f"--init-from {path}: the draft's shape {draft.s} is not this target's {want}",
                        hint="continue from a draft written by `tfcompile draft` for the same target model")
    for p in (draft.embed_tokens.weight, draft.lm_head.weight):
        p.requires_grad_(False)
    return draft.train()


@torch.no_grad()
def init_from_target(draft: Eagle3Draft, target) -> None:
    """Start from the target instead of random weights: fc passes the highest fused state through
    (identity on its third of the 3H input), the decoder layer is the target's layer whose input
    that state is (aux_layers[-1]; q/k/v read the token embedding and the state through the same
    weights, both halves of the 2H input), the final norm is the target's. The draft then begins as
    the target's own upper layer and learns the one-token shift and the chain from there."""
    s, lay = draft.s, draft.layers[0]
    src = target.get_decoder().layers[s.aux_layers[-1]]
    H = s.hidden
    draft.fc.weight.zero_()
    draft.fc.weight[:, -H:] = torch.eye(H)
    for name in ("q_proj", "k_proj", "v_proj"):
        w = getattr(src.self_attn, name).weight.detach().float()  # [out, H]
        getattr(lay.self_attn, name).weight.copy_(torch.cat([w, w], 1))
    lay.self_attn.o_proj.weight.copy_(src.self_attn.o_proj.weight.detach().float())
    for name in ("gate_proj", "up_proj", "down_proj"):
        getattr(lay.mlp, name).weight.copy_(getattr(src.mlp, name).weight.detach().float())
    for norm in (lay.input_layernorm, lay.hidden_norm):
        norm.weight.copy_(src.input_layernorm.weight.detach().float())
    lay.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight.detach().float())
    draft.norm.weight.copy_(target.get_decoder().norm.weight.detach().float())


def run_draft(model: Path, out: Path, cfg: DraftConfig, *, target_artifact: Path | None = None,
              overwrite: bool = False, reporter=None, world: World | None = None) -> dict:
    """Train and write the draft; returns the record plus `timings` (not written). OUT is checked
    and locked before anything runs (atomic_output_dir), and appears only when the draft is whole.

    Under torchrun (`world`, default tfcompile.dist.current()) every rank trains (ranks.py), rank 0
    alone holds OUT: it checks and locks it before the others start, and publishes it once every
    rank has finished; a failed or killed rank fails every rank (dist/failure.py) and nothing is
    published. --batch is checked against the world size first (UserError with a hint)."""
    world = world if world is not None else current()
    world.begin_run()
    reporter = reporter or NullReporter()
    with supervise(world):
        note_pass(world, "draft")
        cfg = resolve_parts(cfg, world)
        # rank 0 alone checks and locks OUT (tmp: its staging folder); the others hold None
        staging = atomic_output_dir(out, overwrite, protect=(Path(model),)) if world.is_root else nullcontext()
        with staging as tmp:
            world.barrier("draft output checked")  # OUT refused before any rank does work
            record, timings = _train(Path(model), cfg, target_artifact, tmp, reporter, world)
            world.barrier("draft trained")  # every rank finished: rank 0 publishes
        world.barrier("draft published")  # nobody reports success before OUT exists
    return {**record, "output": str(out), "timings": timings}


def _train(model: Path, cfg: DraftConfig, target_artifact: Path | None, tmp: Path | None, reporter,
           world: World) -> tuple[dict, dict]:
    """Train; rank 0 (tmp) writes the draft and its record there. (record, timings): {} on other ranks."""
    t0 = time.perf_counter()
    dev = resolve_device(cfg.device, world)
    cfg, why = resolve_compute_dtype(cfg, model, dev)
    if reporter.note:
        reporter.note(f"draft: the target's forwards compute in {cfg.compute_dtype} ({why})")
    target, cfg_json, served = load_target(model, target_artifact, getattr(torch, cfg.compute_dtype))
    target.to(dev)
    resume = _resume(cfg, Path(target_artifact or model), world) if cfg.resume_dir else None
    tokens, data = training_tokens(cfg, load_tokenizer(model), target, resume, world)
    t_data = time.perf_counter()
    draft = build_draft(target, cfg_json, cfg, tokens).to(dev)
    metrics = Path(cfg.metrics) if cfg.metrics else (resume.path / "metrics.jsonl" if resume else None)
    training = train_draft(draft, target, tokens, cfg, keep=_keep(draft), resume=resume, metrics_path=metrics,
                           reporter=reporter, world=world)
    t_train = time.perf_counter()
    timings = {"data_s": round(t_data - t0, 2), "train_s": round(t_train - t_data, 2),
               "resumed_at": training["resumed_at"], "compute_dtype": cfg.compute_dtype,
               "compute_dtype_why": why, "threads": torch.get_num_threads(), "processes": world.size}
    if tmp is None:
        return {}, timings
    spec = speculators_config(cfg_json, draft.s, verifier=str(target_artifact or model),
                              speculative_tokens=cfg.ttt_steps)
    files = write_draft(tmp, draft.cpu(), spec)
    kept = {k: v for k, v in training.items() if k != "resumed_at"}
    if not same_as_one_process(cfg, world):  # the sums' order changes the bits (ranks.py)
        kept["processes"] = world.size
    record = {"tfcompile": __version__, "method": cfg.method, "config": cfg.record(),
              "target": {"model": str(model), "artifact": None if target_artifact is None else str(target_artifact),
                         "served_as": served},
              "data": data, "training": kept,
              "draft": {**_sizes(draft), "bytes": (tmp / WEIGHTS).stat().st_size}, "files": files}
    (tmp / "tfcompile").mkdir()
    write_json(tmp / RECORD, record)
    return record, {**timings, "wall_s": round(time.perf_counter() - t0, 2)}


def _resume(cfg: DraftConfig, target: Path, world: World) -> ResumeDir:
    """The --resume-dir: created (or checked) by rank 0 first, then checked by the others. Its
    fingerprint holds the number of processes, as distill's does: a checkpoint continues only
    the computation that wrote it."""
    fp = {"config": cfg.record(), "target": target_identity(target), "torch": torch.__version__,
          "threads": torch.get_num_threads()}
    if world.distributed:  # one process's fingerprint as before (its folders resume across this change)
        fp["processes"] = world.size
    if not world.is_root:
        world.barrier("draft resume dir")
    resume = ResumeDir.open(cfg.resume_dir, fp)
    if world.is_root:
        world.barrier("draft resume dir")
    return resume


def _keep(draft: Eagle3Draft) -> torch.Tensor | None:
    """Target ids of the draft vocabulary, ascending (None: the whole vocabulary)."""
    return None if draft.d2t is None else torch.arange(draft.s.draft_vocab, device=draft.d2t.device) + draft.d2t


def _sizes(draft: Eagle3Draft) -> dict:
    total = sum(p.numel() for p in draft.parameters())
    trained = sum(p.numel() for _, p in draft.trainable())
    return {"parameters": total, "trained_parameters": trained, "draft_vocab": draft.s.draft_vocab,
            "aux_layers": list(draft.s.aux_layers)}
