"""The pieces of tfcompile/dist that need no second process: assignment, shard ownership,
job windows, devices, and where calibration puts layers and activations."""

from __future__ import annotations

import pytest
import torch

from tests_helpers import tensors
from tfcompile.artifact.sink import ShardSink
from tfcompile.dist.devices import resolve_device
from tfcompile.dist.partition import gptq_cost, hessian_owners, lpt, mine, rounds, shard_owner
from tfcompile.dist.stream import Plan
from tfcompile.errors import RecipeError, UserError


def test_batches_round_robin_cover_everything_once():
    for count in range(0, 12):
        for size in (1, 2, 3, 5):
            parts = [mine(count, r, size) for r in range(size)]
            assert sorted(i for p in parts for i in p) == list(range(count))
            # round t holds batches t*size .. t*size+size-1, rank r the r-th of them
            assert all(i // size < rounds(count, size) and i % size == r for r, p in enumerate(parts) for i in p)


def test_lpt_is_deterministic_and_balanced():
    costs = {f"g{i}": gptq_cost(256 * (1 + i % 3), 128 * (1 + i % 5)) for i in range(40)}
    a, b = lpt(costs, 3), lpt(dict(reversed(list(costs.items()))), 3)
    assert a == b  # a function of the costs, not of dict order
    loads = [sum(c for k, c in costs.items() if a[k] == r) for r in range(3)]
    assert max(loads) <= 4 / 3 * (sum(costs.values()) / 3) + max(costs.values())  # Graham's bound
    assert lpt({"x": 1.0}, 4) == {"x": 0}


def test_routed_experts_are_owned_per_solve_batch():
    """One MoE layer's expert Hessians are spread over the ranks in blocks of gptq_expert_batch
    experts (e // batch: the batches gptq_moe.py solves together), not one rank per projection."""
    from types import SimpleNamespace as NS

    def group(key, n, k):
        return NS(key=key, members=(NS(shape=(n, k)),))

    groups = [group(f"model.layers.1.mlp.experts.{e}.{role}", n, k)
              for e in range(16) for role, n, k in (("gate_up", 128, 64), ("down_proj", 64, 64))]
    groups.append(group("model.layers.1.self_attn.qkv", 96, 64))
    owners = hessian_owners(groups, 4, expert_batch=4)
    for role in ("gate_up", "down_proj"):
        blocks = [{owners[f"model.layers.1.mlp.experts.{e}.{role}"] for e in range(b * 4, b * 4 + 4)}
                  for b in range(4)]
        assert all(len(b) == 1 for b in blocks)  # a solve batch never spans two ranks
    assert len({owners[g.key] for g in groups if ".experts." in g.key}) == 4  # every rank owns some
    whole = hessian_owners(groups, 4, expert_batch=16)  # one batch per projection: one rank each
    assert len({whole[f"model.layers.1.mlp.experts.{e}.gate_up"] for e in range(16)}) == 1


def test_windows_split_by_output_bytes():
    spec = (("t", torch.uint8, (1024,)),)
    plan = Plan((0,) * 10, (frozenset({0}),) * 10, (spec,) * 10)
    assert [list(w) for w in plan.windows(3000)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert [list(w) for w in plan.windows(1 << 30)] == [list(range(10))]


def test_owned_sinks_together_write_the_single_sink_files(tmp_path):
    """Shard i written by rank i mod N: the union of every rank's files is the one-process output."""
    specs = [type("S", (), {"name": f"w{i}", "dtype": torch.bfloat16, "shape": (64, 64)}) for i in range(7)]
    data = {s.name: torch.randn(64, 64).to(torch.bfloat16) for s in specs}

    def write(out, owned=None, index=True):
        sink = ShardSink(out, specs, 3 * 64 * 64 * 2, owned=owned)
        for s in specs:
            sink.put(s.name, data[s.name])
        files = sink.close()
        if not index:
            assert "model.safetensors.index.json" not in files
        return files

    one = write(tmp_path / "one")
    many = {}
    for rank in range(2):
        many.update(write(tmp_path / "two", owned=lambda i, r=rank: shard_owner(i, 2) == r, index=False))
    one.pop("model.safetensors.index.json")
    assert many == one  # same files, same sha256
    assert tensors(tmp_path / "two").keys() == data.keys()


def test_devices():
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(UserError, match="sees no CUDA device"):
            resolve_device("cuda:0")
    with pytest.raises(RecipeError, match="not auto, cpu, cuda or cuda:N"):
        resolve_device("gpu")


def test_calibration_places_the_layer_and_activations_on_the_device(tiny_llama):
    """The layer loop's placement, checked on the meta device: the bound decoder layer and every
    tensor handed to it (hidden states, mask, RoPE tables) are on the requested device, while
    what precedes layer 0 ran on the CPU (CUDA itself is untested here: docs/distributed.md)."""
    from tfcompile.calibration.binding import bind, skeleton
    from tfcompile.calibration.sequential import _catch_inputs, find_layers
    from tfcompile.io.checkpoint import open_checkpoint

    ckpt = open_checkpoint(tiny_llama)
    model = skeleton(tiny_llama)
    path, layers = find_layers(model)
    bind(model, ckpt, torch.bfloat16, skip=f"{path}.")
    ids = torch.randint(0, 200, (3, 8))
    inputs = _catch_inputs(model, layers, ids, 2, starts=[2], device="meta")
    assert len(inputs) == 1 and inputs[0][0].shape == (1, 8, 128)  # only the batch asked for
    flat = [inputs[0][0], *[t for v in inputs[0][1].values() for t in (v if isinstance(v, tuple) else [v])
                            if isinstance(t, torch.Tensor)]]
    assert flat and all(t.device.type == "meta" for t in flat)
    bind(layers[1], ckpt, torch.bfloat16, prefix=f"{path}.1.")  # the CPU: the mapped tensors themselves
    assert all(p.device.type == "cpu" for p in layers[1].parameters())
    bind(layers[1], ckpt, torch.bfloat16, prefix=f"{path}.1.", device="meta")
    assert all(p.device.type == "meta" for p in layers[1].parameters())
    assert model.get_input_embeddings().weight.device.type == "cpu"
