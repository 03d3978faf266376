"""The models of a `--sharding fsdp` run, built unit by unit from the checkpoint (docs/distributed.md
"Distillation: DDP or FSDP2"): no rank ever holds a whole float32 copy of either model.

1. transformers builds the model with every parameter on the meta device (buffers, such as the
   RoPE tables, are computed for real), as layer-by-layer calibration does
   (`skeleton`, calibration/binding.py).
2. For each FSDP unit in turn (decoder layer 0, 1, ..., then the root: embeddings, final norm,
   lm_head), `materialize` reads its parameters from the memory-mapped safetensors and converts
   them to float32 (an exact upcast: the values `from_pretrained(dtype=float32)` gives). The
   checkpoint's pages are file pages, shared by the ranks of a node through the page cache, and
   dropped from this process's resident set after each unit (`Checkpoint.release`).
3. The student's Linears of the unit are fake-quantized (`build_student(only=prefix)`), its
   unquantized tensors parametrized (`train_unquantized`), and `fully_shard` keeps this rank's
   rows: the unit's float32 copies are freed before the next unit is read.

Peak host memory per rank while building: the shards built so far, plus one unit's float32
copy (the student's quantized Linears twice: the parameter read and FakeQuantLinear's clone).
The student is the one the whole-model path builds (same values, same parameter order), so the
artifact is byte-identical (tests/dist/test_fsdp.py).
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from tfcompile.calibration.forward import load_hf_model
from tfcompile.calibration.binding import group_tensor, parameter, set_parameter, skeleton, tied_groups
from tfcompile.distill.fsdp import shard
from tfcompile.distill.student import Student
from tfcompile.errors import CheckpointError
from tfcompile.io.sources.model import is_published


def can_build(ctx) -> bool:
    """Whether the checkpoint's tensors bind by name (a published quantized source is decoded whole
    by tfcompile/io/sources/model.py instead)."""
    return not is_published(ctx.source.config)


def materialize(unit: nn.Module, prefix: str, ckpt) -> None:
    """Bind `unit`'s parameters still on the meta device (those of no unit sharded before it) to
    float32 copies of their checkpoint tensors; tied parameters (lm_head and the embeddings) stay
    one Parameter. `prefix`: the unit's module name with its trailing dot ("" for the root)."""
    names = set(ckpt.names())
    for group in tied_groups(unit, meta_only=True):
        found = group_tensor(unit, group, ckpt, names, prefix)
        meta = parameter(unit, group[0])
        if found is None or tuple(found[1].shape) != tuple(meta.shape):
            what = "no tensor" if found is None else f"shape {list(found[1].shape)}"
            raise CheckpointError(f"{ckpt.path}: parameter {prefix + group[0]} of shape {list(meta.shape)}: "
                                  f"{what} in the checkpoint",
                                  hint="--sharding fsdp reads each parameter by name; use --sharding ddp")
        set_parameter(unit, group, nn.Parameter(found[1].to(torch.float32, copy=True),
                                                requires_grad=meta.requires_grad))
    ckpt.release()


def build_sharded(ctx, cfg, world, device: torch.device, convert, shard_teacher: bool):
    """(teacher, student, the student's FSDP units): both models sharded unit by unit. The teacher is
    sharded too when `shard_teacher` (the online teacher; not for --data self, which samples from a
    whole teacher first); otherwise it is loaded whole (the disk cache's teacher, --data self's),
    and `run.py` places it."""
    student = Student.frozen(skeleton(ctx.source_path))
    unquantized = set(ctx.plan.passthrough) if cfg.train_unquantized else set()

    def prepare(unit: nn.Module, prefix: str) -> None:
        materialize(unit, prefix, ctx.source)
        convert(student.model, only=prefix, into=student)  # the unit's groups (the root's: those left)
        if unquantized:
            student.train_unquantized({n for n in unquantized if n.startswith(prefix)}, ctx.dtype)

    units = shard(student.model, world, device, prepare)
    order = [t.module for g in ctx.plan.groups for t in g.members]  # one process's parameter order
    student.linears = {m: student.linears[m] for m in order if m in student.linears}
    if shard_teacher:
        teacher = skeleton(ctx.source_path)
        shard(teacher, world, device, functools.partial(materialize, ckpt=ctx.source))
    else:
        teacher = load_hf_model(ctx.source_path, torch.float32)
    return teacher, student, units

