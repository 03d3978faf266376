"""Under `--sharding fsdp` no rank holds a whole float32 copy of either model (tfcompile/distill/lazy.py;
docs/distributed.md "Distillation: DDP or FSDP2"): when FSDP2 shards a unit, the only float32
parameters materialized on the host, in both models, are that unit's own.

One process plays rank 0 of 2: FSDP2's `fully_shard` is replaced by a recorder that checks the bound
and then frees the unit's parameters (to the meta device), as sharding frees the full copy. The
models are found through transformers' `post_init`, which every model construction calls. The run
stops after the last unit (the teacher's root). The artifact equality of the real 2-rank run is
tests/dist/test_fsdp.py's.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from pathlib import Path

import torch
from torch import nn

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
ARGS = ["--format", "nvfp4a16", "--steps", "1", "--batch", "2", "--grad-accum", "2", "--data", "random",
        "--set", "distill.seq_len=32", "--set", "distill.train_unquantized=true", "--sharding", "fsdp"]


class _Stop(Exception):
    pass


def _materialized(models) -> dict[int, int]:
    """id -> elements of every float32 parameter on the host, not on the meta device, of `models`."""
    out = {}
    for model in models:
        for p in model.parameters():
            if p.dtype == torch.float32 and not p.is_meta:
                out[id(p)] = p.numel()
    return out


def _free(unit: nn.Module) -> None:
    """What sharding does to the unit's full copy: gone (each parameter replaced by an empty stand-in
    for this rank's shard)."""
    for mod in unit.modules():
        for attr, p in list(mod._parameters.items()):
            if p is not None and not p.is_meta:
                mod._parameters[attr] = nn.Parameter(torch.empty(0), requires_grad=p.requires_grad)


def test_no_rank_holds_a_whole_float32_model(monkeypatch, tmp_path, capsys):
    import torch.distributed.device_mesh
    import torch.distributed.fsdp
    import transformers

    from tfcompile.cli.main import main
    from tfcompile.dist.world import World
    from tfcompile.distill import run as distill_run  # the distill pass imports it when it runs

    models: list[weakref.ref] = []
    real_post_init = transformers.PreTrainedModel.post_init

    def post_init(self):
        real_post_init(self)
        models.append(weakref.ref(self))

    calls: list[tuple[int, int]] = []  # (float32 elements held whole outside the unit, in it)
    layers = json.loads((DEMO / "config.json").read_text())["num_hidden_layers"]

    def fully_shard(unit, mesh=None):
        live = _materialized(m for ref in models if (m := ref()) is not None)
        own = {id(p) for p in unit.parameters()}
        outside = sum(n for i, n in live.items() if i not in own)
        calls.append((outside, sum(n for i, n in live.items() if i in own)))
        _free(unit)
        if len(calls) == 2 * (layers + 1):  # the student's units, then the teacher's: done
            raise _Stop

    def as_rank0_of_2(inputs, *args, **kwargs):
        import dataclasses

        return real_distill(dataclasses.replace(inputs, world=World(rank=0, size=2)), *args, **kwargs)

    real_distill = distill_run.distill_checkpoint
    monkeypatch.setattr(transformers.PreTrainedModel, "post_init", post_init)
    monkeypatch.setattr(torch.distributed.device_mesh, "init_device_mesh", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed.fsdp, "fully_shard", fully_shard)
    monkeypatch.setattr(distill_run, "distill_checkpoint", as_rank0_of_2)
    with open("/dev/null", "w") as f, contextlib.redirect_stdout(f):
        main(["distill", str(DEMO), "-o", str(tmp_path / "out"), "-q", *ARGS])  # stopped by _Stop
    assert "_Stop" in capsys.readouterr().err
    assert len(calls) == 2 * (layers + 1)
    assert [outside for outside, _ in calls] == [0] * len(calls), "float32 held whole outside the unit sharded"
    assert all(own > 0 for _, own in calls)  # each unit was materialized when it was sharded
