"""OverlayCheckpoint: pack reads replaced tensors from the overlay file, the rest from the base."""

from __future__ import annotations

import pytest
import torch

from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.io.overlay import OverlayCheckpoint, overlay_specs, write_overlay


def test_overlay_replaces_named_tensors(tiny_llama_src, tmp_path):
    base = open_checkpoint(tiny_llama_src)
    name = "model.layers.0.mlp.down_proj.weight"
    new = torch.full(tuple(base.info(name).shape), 0.5, dtype=torch.bfloat16)
    produced = []

    def tensors():  # streamed: each tensor is made only when the writer wants it
        produced.append(name)
        yield name, new

    path = write_overlay(tmp_path / "w.safetensors", overlay_specs(base, [name]), tensors())
    assert produced == [name] and not (tmp_path / "w.safetensors.tmp").exists()
    ov = OverlayCheckpoint(base, path, {"distill": {"steps": 1}})
    assert ov.names() == base.names() and ov.files == base.files and ov.replaced == (name,)
    assert torch.equal(ov.get(name), new)
    other = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(ov.get(other), base.get(other))
    assert ov.info(name).file == path and ov.provenance == {"distill": {"steps": 1}}
    ov.release()
    ov.close()


def test_overlay_must_match_dtype_and_shape(tiny_llama_src, tmp_path):
    base = open_checkpoint(tiny_llama_src)
    name = "model.layers.0.mlp.down_proj.weight"
    from tfcompile.io.writer import TensorSpec

    bad = torch.zeros(tuple(base.info(name).shape), dtype=torch.float32)
    path = write_overlay(tmp_path / "w.safetensors", [TensorSpec(name, torch.float32, bad.shape)], [(name, bad)])
    with pytest.raises(ValueError, match="same dtype and shape"):
        OverlayCheckpoint(base, path, {})


def test_failed_write_leaves_nothing(tiny_llama_src, tmp_path):
    base = open_checkpoint(tiny_llama_src)
    names = ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"]

    def tensors():
        yield names[0], torch.zeros(tuple(base.info(names[0]).shape), dtype=torch.bfloat16)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_overlay(tmp_path / "w.safetensors", overlay_specs(base, names), tensors())
    assert list(tmp_path.iterdir()) == []
