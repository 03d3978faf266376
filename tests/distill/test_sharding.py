"""What FSDP2 distillation relies on, checked in one process (the 2-process runs: tests/dist/test_fsdp.py):
the clipping norm does not depend on how the gradients are split, a fusion group's NVFP4 global
scale follows weights whose `_version` FSDP2 keeps, `auto` picks FSDP2 when DDP does not fit, and
the memory model's arithmetic (tfcompile/distill/memory.py)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from tfcompile.distill import fsdp, train
from tfcompile.distill.config import DistillConfig
from tfcompile.distill.memory import Counts, host_bytes, per_rank_bytes
from tfcompile.errors import RecipeError


def _grads(seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(2500, 48), (16, 3000), (256,), (7, 5, 3)]  # more rows than a chunk, long rows, 1-D, 3-D
    return [torch.randn(s, generator=g) * 0.05 for s in shapes]


def _params(grads):
    ps = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = g.clone()
    return ps


def test_row_squares_are_exact_per_row_and_independent_of_the_split():
    g = _grads(0)[0]
    rows = fsdp.squares_by_row(g)
    oracle = [math.fsum(float(x) ** 2 for x in row) for row in g[:40].tolist()]  # exactly rounded
    assert torch.allclose(rows[:40], torch.tensor(oracle, dtype=torch.float64), rtol=1e-15, atol=0)
    halves = torch.cat([fsdp.squares_by_row(g[:1250]), fsdp.squares_by_row(g[1250:])])  # 2 ranks' shards
    thirds = torch.cat([fsdp.squares_by_row(p) for p in g.tensor_split(3)])
    assert torch.equal(halves, rows) and torch.equal(thirds, rows)


@pytest.mark.parametrize("max_norm", [0.0, 1e-3, 1e6])
def test_clip_is_torchs_clip_up_to_the_norms_rounding(max_norm):
    ours, theirs = _params(_grads(1)), _params(_grads(1))
    norm = train._clip(ours, max_norm)
    ref = float(torch.nn.utils.clip_grad_norm_(theirs, max_norm or math.inf, foreach=False))
    exact = math.sqrt(math.fsum(float(x) ** 2 for p in ours for x in p.grad.flatten().tolist())) \
        if max_norm != 1e-3 else None
    assert norm == pytest.approx(ref, rel=1e-6)
    if exact is not None:  # unclipped: the grads are untouched and the norm is the exact one's float64
        assert norm == pytest.approx(exact, rel=1e-13)
        assert all(torch.equal(a.grad, b) for a, b in zip(ours, _grads(1)))
    else:  # clipped to 1e-3 x (1 - 1e-6 / norm), as torch scales
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
        assert math.sqrt(sum(float(p.grad.double().square().sum()) for p in ours)) == pytest.approx(1e-3, rel=1e-5)


def test_clip_norm_has_the_same_bits_on_one_and_two_threads():
    old = torch.get_num_threads()
    try:
        norms = []
        for n in (1, 2):
            torch.set_num_threads(n)
            norms.append(train._clip(_params(_grads(2)), 0.0))
    finally:
        torch.set_num_threads(old)
    assert norms[0] == norms[1]


def test_group_scale_follows_weights_whose_version_is_kept(tiny_llama_src):
    """FSDP2 refills a unit's unsharded parameters without bumping `_version`; the scale cached
    by version must still follow the new weights after the forward's release()."""
    from test_student import _prepared, _student

    st = _student(tiny_llama_src, _prepared(tiny_llama_src, "nvfp4a16"), "weights")
    q = st.linears["model.layers.0.self_attn.q_proj"]
    before = q.group.global_scale().clone()
    st.release()
    weights = tuple(m.weight for m in q.group.members)  # q, k, v
    with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(weights):
        for w in weights:
            w.mul_(2.0)  # as an all-gather writes the stepped weights: same tensors, same _version
    assert torch.equal(q.group.global_scale(), before / 2)  # 2688 / max|w|: exact for a power of two


def test_memory_per_rank_ddp_and_fsdp():
    c = Counts(trained=100, frozen=50, teacher=150, layer=30, layer_trained=20, root=10, root_trained=0, states=2)
    # student 4 x (100 x (1 weight + 1 grad + 2 AdamW states) + 50) = 1800 B; teacher 4 x 150 = 600 B
    assert per_rank_bytes(c, "ddp", 1) == {"student": 1800, "ddp_buckets": 0, "teacher": 600, "total": 2400}
    assert per_rank_bytes(c, "ddp", 2)["total"] == 2400 + 400  # + the all-reduce buckets (4 x 100)
    # 1/2 of the student (900) and of the online teacher (300); per model the root and two layers
    # unsharded (4 x (10 + 2 x 30) each), and one layer's gradients (4 x 20)
    assert per_rank_bytes(c, "fsdp", 2) == {"student_shard": 900, "teacher_shard": 300, "unsharded": 640,
                                            "total": 1840}
    cached = dataclasses.replace(c, shard_teacher=False)  # the disk cache's teacher stays whole
    assert per_rank_bytes(cached, "fsdp", 2) == {"student_shard": 900, "teacher": 600, "unsharded": 360,
                                                 "total": 1860}
    assert per_rank_bytes(c, "fsdp", 1) == per_rank_bytes(c, "ddp", 1)  # one process shards nothing


def test_host_memory_per_rank_ddp_and_fsdp():
    c = Counts(trained=100, frozen=50, teacher=150, layer=30, layer_trained=20, root=10, root_trained=0, states=2)
    # DDP with a GPU: both models whole in float32 on the host before placing them, 4 x (150 + 150)
    assert host_bytes(c, "ddp", 2, 150, whole_teacher=False, on_device=True) == 1200
    assert host_bytes(c, "ddp", 1, 150, whole_teacher=False, on_device=True) == 600  # the teacher placed first
    # FSDP2 with a GPU: one unit at a time, the largest layer twice while converted: 4 x max(2 x 30, 10)
    assert host_bytes(c, "fsdp", 2, 150, whole_teacher=False, on_device=True) == 240
    assert host_bytes(c, "fsdp", 2, 150, whole_teacher=True, on_device=True) == 240 + 600  # the cache's teacher
    # on the CPU the shards stay on the host: + per_rank_bytes' 1840
    assert host_bytes(c, "fsdp", 2, 150, whole_teacher=False, on_device=False) == 240 + 1840
    assert host_bytes(c, "ddp", 2, 150, whole_teacher=False, on_device=False) == 2800


class _World:
    distributed, size, local_size, rank = True, 2, 2, 0

    def __init__(self, peer: str):
        self.peer = peer

    def all_objects(self, name, mine):
        return [mine, self.peer]


@pytest.mark.parametrize("capacity,peer,expected", [(10 ** 6, "ddp", "ddp"), (2000, "ddp", "fsdp"),
                                                    (10 ** 6, "fsdp", "fsdp")])
def test_auto_shards_when_ddp_does_not_fit_on_any_rank(monkeypatch, capacity, peer, expected):
    c = Counts(trained=100, frozen=50, teacher=150, layer=30, layer_trained=20, root=10, root_trained=0,
               states=2)  # DDP: 2800 B per rank
    monkeypatch.setattr(fsdp, "capacity", lambda device, world: capacity)
    cpu = torch.device("cpu")
    assert fsdp.choose(DistillConfig(), _World(peer), cpu, c) == expected
    assert fsdp.choose(DistillConfig(sharding="ddp"), _World(peer), cpu, c) == "ddp"
    assert fsdp.choose(DistillConfig(sharding="fsdp"), SimpleNamespace(distributed=False), cpu, c) == "ddp"


def test_sharding_setting_is_checked():
    with pytest.raises(RecipeError, match="distill.sharding 'zero'") as e:
        DistillConfig(sharding="zero")
    assert "--set distill.sharding=auto" in e.value.hint
