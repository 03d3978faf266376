"""One distillation run: teacher, student, data, training, before/after figures, distilled weights.

Called by the `distill` pass (passes/distill.py) between quantize and pack. Both
models are transformers modules built from the checkpoint (no remote code) and
computed in float32, as `tfcompile eval` computes; the student is kept in eval
mode (no dropout), so teacher and student see the same network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from tfcompile.calibration.forward import load_hf_model, load_tokenizer
from tfcompile.calibration.binding import fixed_mmap_threshold, skeleton
from tfcompile.calibration.sequential import find_layers
from tfcompile.dist import LOCAL
from tfcompile.dist.devices import resolve_device
from tfcompile.dist.failure import inject_fault
from tfcompile.dist.world import World
from tfcompile.distill.checkpoint import METRICS, ResumeDir
from tfcompile.distill.config import DistillConfig
from tfcompile.distill.ddp import agree_stop, check_data_parallel, data_parallel, mean_over_ranks, micro_share
from tfcompile.distill.fsdp import Holder, choose, counts, reshard, shard
from tfcompile.distill.data import BlockOrder, load_data
from tfcompile.distill.heldout import heldout_metrics, sig
from tfcompile.distill.init import InitWeights, init_path
from tfcompile.distill.lazy import build_sharded, can_build
from tfcompile.distill.layerwise import run_layerwise
from tfcompile.distill.loss import ce_loss, hidden_mse, kl_loss
from tfcompile.distill.student import Student, build_student
from tfcompile.distill.teacher import CachedTeacher, OnlineTeacher
from tfcompile.distill.train import Loop, Segment, deterministic
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict
from tfcompile.io.overlay import overlay_specs, write_overlay
from tfcompile.io.resume import source_identity
from tfcompile.ir import Program, QuantPlan
from tfcompile.reporter import Reporter

HELDOUT_SEQ_LEN = 256  # rows of tfcompile eval's default length (or the model's maximum)


@dataclass(frozen=True)
class Inputs:
    """What a run distills: the checkpoint and the quantize pass's plan and program."""
    source_path: Path
    source: Checkpoint  # memory-mapped; its tensors' names, dtypes and shapes fingerprint the run
    dtype: torch.dtype  # the checkpoint's (the distilled weights are stored in it)
    plan: QuantPlan
    program: Program
    recipe: JsonDict  # the recorded recipe (Recipe.to_dict()): part of a --resume-dir's fingerprint
    world: World | None = None  # under torchrun: DDP or FSDP2 over the ranks (ddp.py, fsdp.py); None = one process


@dataclass(frozen=True)
class Outcome:
    weights: Path  # the distilled tensors (safetensors, checkpoint dtype)
    names: tuple[str, ...]  # tensor names it replaces
    record: dict  # the manifest's "distill" section: deterministic, no timings or paths
    stats: dict  # pass stats for --json (timings included)


def distill_checkpoint(ctx: Inputs, cfg: DistillConfig, reporter: Reporter, work_dir: Path) -> Outcome:
    """Distill the plan's Linears of ctx.source_path; write their weights into work_dir."""
    t0 = time.perf_counter()
    # large buffers freed by the hundred (the lazy build's unit copies, activations) would raise
    # glibc's mmap threshold and fragment the heap: measured 2.83-3.00 vs 2.05 GB peak RSS per rank
    # (docs/performance.md "Distillation on two processes")
    fixed_mmap_threshold()
    world = ctx.world or LOCAL
    device = resolve_device(cfg.device, world)
    if world.distributed:
        check_data_parallel(cfg, world)
    init = InitWeights.open(init_path(cfg), ctx.plan) if cfg.init else None
    convert = functools.partial(_convert, init=init, plan=ctx.plan, program=ctx.program, train=cfg.train,
                                lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, seed=cfg.seed,
                                dtype=ctx.dtype, impl=cfg.impl)
    # block-wise without held-out figures: one model, made the student layer by layer (memory: once)
    progressive = cfg.mode == "layerwise" and not cfg.heldout_tokens
    teacher, student, sharding, units, shard_teacher = _models(ctx, cfg, world, device, convert, progressive)
    resume = ResumeDir.open(cfg.resume_dir, fingerprint(ctx)) if cfg.resume_dir else None
    data = _data(ctx, cfg, teacher)
    if shard_teacher:
        shard(teacher, world, device)
    t_setup = time.perf_counter()
    with deterministic():
        reporter.task("held-out (before)", -(-len(data.heldout or []) // 4))  # heldout_metrics' batches of 4
        before = heldout_metrics(student.model, teacher, data.heldout, release=student.release, progress=reporter)
        reshard(units)
        t_before = time.perf_counter()
        teacher, loop, t_train = _train(ctx, cfg, reporter, teacher, student, data, resume, work_dir,
                                        convert if progressive else None, sharding)
        reporter.task("held-out (after)", -(-len(data.heldout or []) // 4))
        after = heldout_metrics(student.model, teacher, data.heldout, release=student.release, progress=reporter)
    t_write = time.perf_counter()
    names = student.tensor_names()
    holder = Holder(student.model, units) if units else None  # FSDP2: one unit unsharded at a time
    try:
        tensors = student.export(holder.hold if holder else None)
        path = write_overlay(work_dir / "distilled.safetensors", overlay_specs(ctx.source, names), tensors)
    finally:
        if holder:
            holder.close()
    t_end = time.perf_counter()
    record = _record(cfg, loop, data, names, before, after)
    if init is not None:  # what the student started from: the artifact's manifest, by hash
        record["init"] = {"scheme": init.scheme_name, "manifest_sha256": init.manifest_sha256}
    stats = {"steps": loop.total, "resumed_at": loop.resumed_at, "threads": torch.get_num_threads(),
             "sharding": sharding if world.distributed else None,
             "before": before, "after": after,
             "setup_s": round(t_setup - t0, 2), "heldout_before_s": round(t_before - t_setup, 2),
             "train_s": round(t_train, 2), "write_s": round(t_end - t_write, 2),
             "wall_s": round(t_end - t0, 2), "final_loss": record["final_loss"]}
    return Outcome(path, names, record, stats)


def _convert(model, *, init: InitWeights | None, only: str | None = None, **kw) -> Student:
    """build_student, the plan's Linears first set to the init artifact's weights (distill.init)."""
    if init is not None and not next(model.parameters()).is_meta:  # meta: the sizes-only skeleton (_meta_counts)
        init.apply(model, only)
    return build_student(model, only=only, **kw)


def _models(ctx: Inputs, cfg: DistillConfig, world, device, convert, progressive: bool):
    """The teacher and the student, placed: (teacher, student, sharding, the student's FSDP units or
    None, whether the teacher is still to be sharded, after `_data`)."""
    sharding = "ddp" if progressive else choose(cfg, world, device, _meta_counts(ctx, cfg, convert))
    # the online teacher runs on every rank in step with the student: sharded too, once it has
    # sampled --data self (whole: generation runs in inference mode, which FSDP2's unsharding does
    # not survive). The disk cache's teacher is not (rank 0 alone builds a --resume-dir's cache).
    shard_teacher = sharding == "fsdp" and cfg.teacher == "online"
    if sharding == "fsdp" and can_build(ctx):  # unit by unit from the checkpoint: no whole float32 copy
        now = shard_teacher and cfg.data != "self"  # the teacher sharded as it is built, or loaded whole
        teacher, student, units = build_sharded(ctx, cfg, world, device, convert, now)
        if not now:
            teacher.to(device)
        return teacher, student, sharding, units, shard_teacher and not now
    # whole on the CPU, then placed: on the device, or (FSDP2) sharded unit by unit
    teacher = load_hf_model(ctx.source_path, torch.float32)
    if not world.distributed:  # placed now (one process never shards): the host holds one model at a time
        teacher.to(device)
    student = Student.frozen(teacher) if progressive else convert(load_hf_model(ctx.source_path, torch.float32))
    if cfg.train_unquantized:
        student.train_unquantized(set(ctx.plan.passthrough), ctx.dtype)
    units = shard(student.model, world, device) if sharding == "fsdp" else None
    if units is None:
        student.model.to(device)
    if not shard_teacher or cfg.data == "self":
        teacher.to(device)
    return teacher, student, sharding, units, shard_teacher


def _meta_counts(ctx: Inputs, cfg: DistillConfig, convert):
    """The run's element counts, from both models built on the meta device (no weight read): what
    `auto` decides by, before anything is built for real. None when nothing is to be decided."""
    world = ctx.world or LOCAL
    if not world.distributed or cfg.sharding != "auto":
        return None
    student = convert(skeleton(ctx.source_path))
    if cfg.train_unquantized:
        student.train_unquantized(set(ctx.plan.passthrough), ctx.dtype)
    return counts(student, skeleton(ctx.source_path), cfg)


def _data(ctx: Inputs, cfg: DistillConfig, teacher):
    blocks = cfg.steps * cfg.batch * cfg.grad_accum if cfg.mode == "model" else cfg.layer_samples
    max_pos = getattr(teacher.config, "max_position_embeddings", None) or HELDOUT_SEQ_LEN
    return load_data(cfg.data, load_tokenizer(ctx.source_path), teacher, blocks=blocks, seq_len=cfg.seq_len,
                     heldout_tokens=cfg.heldout_tokens, heldout_seq_len=min(HELDOUT_SEQ_LEN, max_pos),
                     heldout_percent=cfg.heldout_percent, seed=cfg.seed)


def _record(cfg, loop, data, names, before, after) -> dict:
    """The manifest's "distill" section (deterministic: no timings, no paths of this machine)."""
    tokens = loop.total * cfg.batch * cfg.grad_accum * cfg.seq_len if cfg.mode == "model" else None
    return {"config": _config(cfg), "steps": loop.total, "tokens": tokens,
            "data": {"train": data.source, "train_blocks": int(data.train.shape[0]),
                     "heldout": data.heldout_source if data.heldout else None},
            "trained_tensors": len(names),
            "heldout": {"before": before, "after": after},
            "final_loss": {k: sig(v) for k, v in sorted(loop.last.items()) if k != "lr"}}


def _train(ctx: Inputs, cfg: DistillConfig, reporter: Reporter, teacher, student: Student, data, resume,
           work_dir: Path, convert=None, sharding: str = "ddp"):
    """Run the training loop; returns (teacher, loop, training seconds). The teacher may be
    freed while training with the disk cache and loaded again for the held-out figures."""
    world = ctx.world or LOCAL
    device = next(student.model.parameters()).device
    per_step = cfg.batch * cfg.grad_accum
    metrics = Path(cfg.metrics) if cfg.metrics else (resume.path / METRICS if resume else None)
    total = cfg.steps * (1 if cfg.mode == "model" else _num_layers(teacher))
    loop = Loop(cfg, resume=resume, metrics_path=metrics if world.is_root else None, reporter=reporter,
                total_steps=total, tokens_per_step=per_step * cfg.seq_len)
    loop.saves, loop.sharded = world.is_root, sharding == "fsdp"
    if world.distributed:
        loop.agree = functools.partial(agree_stop, world=world)
        # TFCOMPILE_FAULT=RANK:distill-step-K:raise|kill fails that rank after step K (tests)
        loop.after_step = lambda step: inject_fault(world, f"distill-step-{step}")
    t = time.perf_counter()
    if cfg.mode == "layerwise":
        run_layerwise(teacher, student, data.train, cfg, loop, convert)
        return teacher, loop, time.perf_counter() - t
    loop.adopt(student.parameters())
    if cfg.teacher == "cache":
        where = resume.teacher_dir if resume else work_dir / "teacher"
        if resume is not None and world.distributed and not world.is_root:
            world.barrier("teacher cache")  # rank 0 builds the shared cache once
        target = CachedTeacher.open_or_build(where, teacher, data.train, cfg.topk, cfg.batch, reporter)
        if resume is not None and world.distributed and world.is_root:
            world.barrier("teacher cache")
        teacher = None
        gc.collect()
    else:
        target = OnlineTeacher(teacher, cfg.hidden_weight > 0)
    t = time.perf_counter()
    loop.run(_model_segment(student, target, data.train, cfg, world, device, sharding))
    seconds = time.perf_counter() - t
    if teacher is None and data.heldout:
        teacher = load_hf_model(ctx.source_path, torch.float32).to(device)
    return teacher, loop, seconds


def _model_segment(student: Student, target, train: torch.Tensor, cfg, world=LOCAL, device="cpu",
                   sharding: str = "ddp") -> Segment:
    order = BlockOrder(len(train), cfg.batch, cfg.grad_accum, cfg.seed)
    hidden = cfg.hidden_weight > 0
    weights = {"kl": cfg.kl_weight, "ce": cfg.ce_weight, "hidden": cfg.hidden_weight}
    share = micro_share(cfg, world)  # (micro-batch, its blocks) this rank runs each step
    model = data_parallel(student.model, world, device, sharding)
    ddp = world.distributed and sharding == "ddp"

    def step(local: int) -> dict:
        sums = dict.fromkeys(["loss", *[k for k, w in weights.items() if w]], 0.0)
        for j, (micro, part) in enumerate(share):
            blocks = order.blocks(local, micro)[part]
            ids = train[blocks].to(device)  # [batch, seq_len]
            tgt = target(ids, blocks)
            # DDP all-reduces the gradients on the last micro-batch of the step only; FSDP2
            # reduce-scatters every micro-batch's (no unsharded gradients kept in between)
            sync = model.no_sync() if ddp and j + 1 < len(share) else contextlib.nullcontext()
            with sync:
                out = model(input_ids=ids, output_hidden_states=hidden, use_cache=False)
                terms = {}
                if cfg.kl_weight:
                    terms["kl"] = kl_loss(out.logits, _on(tgt.logits, device), cfg.temperature)
                if cfg.ce_weight:
                    terms["ce"] = ce_loss(out.logits, ids)
                if hidden:
                    terms["hidden"] = hidden_mse(out.hidden_states, tgt.hidden)
                loss = sum(weights[k] * v for k, v in terms.items())
                (loss / len(share)).backward()
            student.release()
            for k, v in [("loss", loss), *terms.items()]:
                sums[k] += float(v.detach()) / len(share)
        return mean_over_ranks(sums, world)

    student.model.eval()
    return Segment("model", student.parameters(), 0, cfg.steps, step)


def _on(t, device):
    """Teacher targets on the student's device (a cached top-k teacher reads them from disk)."""
    return dataclasses.replace(t, values=t.values.to(device), indices=t.indices.to(device)) \
        if dataclasses.is_dataclass(t) else t.to(device)


def _num_layers(model) -> int:
    return len(find_layers(model)[1])


def _config(cfg) -> dict:
    """The config as recorded: runtime fields (where files go) left out, `omit_default` ones at their default."""
    return {f.name: (list(v) if isinstance(v := getattr(cfg, f.name), tuple) else v)
            for f in dataclasses.fields(cfg) if not f.metadata.get("runtime")
            and not (f.metadata.get("omit_default") and getattr(cfg, f.name) == f.default)}


def fingerprint(ctx: Inputs) -> dict:
    """What a --resume-dir must match: recipe, source, torch version, thread and process count."""
    return {"recipe": ctx.recipe, **source_identity(ctx.source), "processes": (ctx.world or LOCAL).size}
