"""Memory per rank of a distillation run, DDP vs FSDP2: what `distill.sharding auto` decides by
and `tfcompile plan --estimate` prints (docs/distributed.md "Distillation: DDP or FSDP2").

From element counts alone (a built student, or the meta model's shapes), in bytes; every
tensor of both models is float32 while training (tfcompile/distill/run.py loads them so):
- the student's trained tensors (T elements): master weight, gradient and the optimizer's state
  (AdamW/Adam: exp_avg and exp_avg_sq; SGD: the momentum buffer): 4 x (2 + states) x T;
- its frozen tensors (F: embeddings, norms, the Linears the plan leaves alone): 4 x F;
- the teacher (P elements, forward only): 4 x P, whole on every rank under DDP; under FSDP2 the
  online teacher is sharded like the student (the disk cache's is not); none when it is the
  disk cache and no held-out figures are computed (then it is freed before training);
- DDP: everything whole on each rank, plus DDP's all-reduce buckets (a second copy of the
  gradients: DistributedDataParallel's default gradient_as_bucket_view=False);
- FSDP: the student's (and the online teacher's) 1/N shards, plus what is unsharded at once,
  per model: the root unit (embeddings, final norm, lm_head: FSDP2 keeps it unsharded from the
  forward to the end of the backward) and two decoder layers (the one computing and the one
  FSDP2 prefetches); and the student's unsharded gradients of the root and one layer before
  their reduce-scatters.
Activations (batch x seq_len x hidden per layer, the logits) are the same in both modes and left
out: `fits` keeps HEADROOM of the device for them.

The host (`host_bytes`): under DDP (and one process) each rank loads both models whole in
float32 before placing them; under FSDP2 they are built unit by unit from the memory-mapped
checkpoint (lazy.py), so the host holds one unit's float32 copy at a time beside the shards
(the checkpoint's pages are the page cache's, shared by the node's ranks, and not counted).
"""

from __future__ import annotations

from dataclasses import dataclass

HEADROOM = 0.8  # the fraction of a device that model state may take (the rest: activations, allocator)


@dataclass(frozen=True)
class Counts:
    """Elements of a distillation run (float32 each)."""
    trained: int  # the student's trained tensors
    frozen: int  # the student's other tensors
    teacher: int  # the teacher's (0 when it is freed before training)
    layer: int  # the largest decoder layer (an FSDP unit)
    layer_trained: int  # its trained elements (gradients unsharded before the reduce-scatter)
    root: int  # the root unit: what no decoder layer holds (embeddings, final norm, lm_head)
    root_trained: int
    states: int  # optimizer state tensors per trained tensor (2: AdamW/Adam, 1: SGD with momentum)
    shard_teacher: bool = True  # FSDP2 shards the teacher too (the online one)


def optimizer_states(optimizer: str, momentum: float) -> int:
    return 2 if optimizer in ("adamw", "adam") else int(momentum > 0)


def per_rank_bytes(c: Counts, sharding: str, ranks: int) -> dict[str, int]:
    """Bytes each rank holds while training, by part, and their "total"."""
    student = 4 * (c.trained * (2 + c.states) + c.frozen)
    teacher = 4 * c.teacher
    if sharding == "fsdp" and ranks > 1:
        sharded = c.shard_teacher and c.teacher > 0
        parts = {"student_shard": -(-student // ranks),
                 "teacher" if not sharded else "teacher_shard": -(-teacher // ranks) if sharded else teacher,
                 "unsharded": 4 * ((c.root + 2 * c.layer) * (1 + sharded) + c.root_trained + c.layer_trained)}
    else:
        parts = {"student": student, "ddp_buckets": 4 * c.trained * (ranks > 1), "teacher": teacher}
    parts["total"] = sum(parts.values())
    return parts


def fits(total: int, capacity: int) -> bool:
    return total <= HEADROOM * capacity


def host_bytes(c: Counts, sharding: str, ranks: int, teacher_params: int, whole_teacher: bool,
               on_device: bool) -> int:
    """Peak bytes on each rank's host (the process's own memory; the checkpoint's mapped pages are
    the page cache's). `teacher_params`: the teacher's elements, loaded whole (counted even when
    it leaves before training) unless FSDP2 builds it sharded (`whole_teacher` False: the online
    teacher without --data self)."""
    if sharding == "fsdp" and ranks > 1:
        # lazy.py: one unit at a time in float32; a decoder layer's quantized Linears twice while
        # the student converts them (the parameters read, FakeQuantLinear's clones)
        build = 4 * max(2 * c.layer, c.root)
        kept = 0 if on_device else per_rank_bytes(c, "fsdp", ranks)["total"]  # the shards stay here
        return build + kept + 4 * teacher_params * whole_teacher
    student = 4 * (c.trained + c.frozen)
    if not on_device:
        return per_rank_bytes(c, "ddp", ranks)["total"]
    return student + 4 * teacher_params * (ranks > 1)  # one process: the teacher placed before the student
