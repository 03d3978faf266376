"""`rotate`: fuse QuaRot/SpinQuant-style rotations into the checkpoint before anything observes it.

Runs right after `load` (scheduled by any `rotate.*` setting, e.g. `--set rotate.kind=hadamard`).
It writes the rotated checkpoint (tfcompile/rotate/fuse.py: the residual stream rotated by a
randomized Hadamard matrix folded through the RMSNorms into every Linear, the embeddings and the
lm_head, the residual channels a norm switches off left unrotated; with `heads`, each attention
head's values rotated too) tensor by tensor into a temporary directory beside the output, with
the source's config (a tied lm_head untied) and tokenizer files, and hands the next passes that
checkpoint: select, calibrate (activation statistics, GPTQ Hessians of the *rotated* model),
quantize and pack all see it. The artifact is
an ordinary checkpoint of the same architecture, so transformers, vLLM, SGLang and TensorRT-LLM
load it with no online transform. The manifest keeps the original files as the source and
records the rotation under "rotate".

Memory: one tensor at a time; disk: one more copy of the model (removed with the run).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcompile.errors import RecipeError
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.io.dtypes import torch_dtype_of
from tfcompile.io.locks import work_dir
from tfcompile.io.writer import ShardPlan, ShardWriter, TensorSpec
from tfcompile.ir import ModelInfo
from tfcompile.pipeline.intents import TrainsOnTheSource
from tfcompile.pipeline.passes import PassResult, Unsupported, given, recipe_intents, register_pass
from tfcompile.recipe import Recipe
from tfcompile.rotate import fuse
from tfcompile.rotate.hadamard import rotation, rotation_keeping

KINDS = ("hadamard", "random")
SUPPRESSED = 0.01  # keep_suppressed: |g_j| below 1% of the norm's median |g| in some residual norm


@dataclass(frozen=True)
class RotateConfig:
    kind: str = "hadamard"  # "hadamard" (randomized Hadamard; random orthogonal if none of that order) | "random"
    seed: int = 0  # column signs / random matrix
    heads: bool = True  # also rotate each attention head's values (R2: v_proj rows, o_proj columns)
    # residual channels R1 leaves unrotated: those a residual norm switches off (where the massive
    # activations live: fuse.suppressed_channels), and/or the listed indices (--set rotate.keep=507,247)
    keep_suppressed: bool = True
    keep: tuple[int, ...] = ()


def _supports(recipe: Recipe, cfg: RotateConfig) -> list[Unsupported]:
    reasons = []
    if cfg.kind not in KINDS:
        reasons.append(Unsupported(f"rotate.kind {cfg.kind!r} is unknown", "choose one of: " + ", ".join(KINDS)))
    if any(c < 0 for c in cfg.keep):
        reasons.append(Unsupported(f"rotate.keep {list(cfg.keep)} holds a negative channel index",
                                   "give residual channel indices, e.g. --set rotate.keep=507,247"))
    if recipe_intents(recipe, TrainsOnTheSource):
        reasons.append(Unsupported("distillation trains against the unrotated model; use one or the other",
                                   "drop the rotate.* settings or run tfcompile quantize"))
    return reasons


@register_pass("rotate", config=RotateConfig, requires=("source", "model"), produces=("source", "model"),
               supports=_supports, when=given("rotate"))
def rotate(ctx, cfg: RotateConfig, reporter) -> PassResult:
    """Fuse a residual-stream (and per-head) rotation into the weights; later passes see the result."""
    src = ctx.source
    reason = fuse.check(src.config, set(src.names()))
    if reason:
        raise RecipeError(f"rotate: {src.path}: {reason}", hint="drop the rotate.* settings for this model")
    text = fuse.text_config(src.config)
    hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    keep = _kept_channels(cfg, src, int(text["num_hidden_layers"]), hidden)
    rot = fuse.Rotations(rotation_keeping(hidden, keep, cfg.kind, cfg.seed),
                         rotation(head_dim, cfg.kind, cfg.seed + 1) if cfg.heads else None,
                         int(text.get("num_key_value_heads") or heads), heads, head_dim)
    tied = "lm_head.weight" not in src.names()
    parent = Path(ctx.out_dir).parent if ctx.out_dir is not None else None
    work = work_dir(".tfcompile-rotate-", parent)  # lives with the checkpoint; owner-tagged (io/locks.py)
    _write(Path(work.name), src, rot, tied, reporter)
    out = open_checkpoint(work.name)
    out.files = list(src.files)  # the manifest hashes and names the user's checkpoint
    record = {"kind": cfg.kind, "seed": cfg.seed, "residual": hidden, "heads": head_dim if cfg.heads else None,
              "untied_lm_head": tied, "kept_channels": list(keep)}
    out.provenance = {**(getattr(src, "provenance", None) or {}), "rotate": record}
    out._keep = work
    model = ModelInfo.from_config(out.config, ctx.model.dtype)
    return PassResult(ctx.with_(source=out, model=model), {**record, "tensors": len(out.names())})


def _kept_channels(cfg: RotateConfig, src, layers: int, hidden: int) -> tuple[int, ...]:
    """The residual channels R1 leaves unrotated on this checkpoint, sorted."""
    bad = [c for c in cfg.keep if c >= hidden]
    if bad:
        raise RecipeError(f"rotate.keep: channel {bad[0]} is outside the residual stream (hidden size {hidden})",
                          hint=f"give channel indices 0..{hidden - 1}")
    found = fuse.suppressed_channels(src.get, layers, SUPPRESSED) if cfg.keep_suppressed else ()
    return tuple(sorted(set(cfg.keep) | set(found)))


def _write(directory: Path, src, rot: fuse.Rotations, tied: bool, reporter) -> None:
    """The rotated checkpoint: model.safetensors (every tensor, source dtypes), config.json, aux files."""
    names = src.names() + (["lm_head.weight"] if tied else [])
    alias = {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}
    info = {n: src.info(alias.get(n, n)) for n in names}
    specs = tuple(TensorSpec(n, torch_dtype_of(info[n].dtype), tuple(info[n].shape)) for n in names)

    def get(name: str) -> torch.Tensor:
        return src.get(alias.get(name, name))

    reporter.task("rotate", len(names))
    writer = ShardWriter(directory / "model.safetensors", ShardPlan("model.safetensors", specs))
    try:
        for spec in specs:
            t = fuse.rotated(spec.name, get, rot) if spec.dtype.is_floating_point else get(spec.name)
            writer.write(spec.name, t.to(spec.dtype).contiguous())
            src.release()
            reporter.advance(1, spec.name)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    config = dict(src.config)
    if tied:
        config["tie_word_embeddings"] = False
        if isinstance(config.get("text_config"), dict):
            config["text_config"] = dict(config["text_config"], tie_word_embeddings=False)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in src.aux_files():
        shutil.copyfile(f, directory / f.name)
