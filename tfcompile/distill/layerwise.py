"""Block-wise (layer-by-layer) distillation, for models that do not fit twice in memory.

Each decoder layer is distilled on its own, in order, as BRECQ (Li et al. 2021)
reconstructs blocks: the target of student layer i is the teacher layer i's
output on the teacher's own input stream, and the student layer is fed the
student's stream (the outputs of the already distilled student layers 0..i-1),
so each layer learns to undo the error that reaches it:

    X_T(0) = X_S(0) = the embeddings of `layer_samples` training blocks
    Y(i)   = teacher_layer_i(X_T(i))                        (no grad)
    train  student_layer_i to minimise ||student_layer_i(X_S(i)) - Y(i)||^2 / ||Y(i)||^2
    X_T(i+1) = Y(i),  X_S(i+1) = student_layer_i(X_S(i))    (no grad)

Memory: the model once (the student's untouched parts are the teacher's), one
extra layer in training, and three activation sets of layer_samples x seq_len x
hidden float32 (64 x 256 x 256 x 4 B = 17 MB each for the demo LM). No logits
are formed, so the loss never sees the vocabulary; the mask and RoPE tables
come from the model's own forward (captured at layer 0, as calibration does).
`steps` is per layer; a checkpoint covers the layer in training and every
finished one, and a resumed run re-derives the streams from the restored
layers before continuing.
"""

from __future__ import annotations

import torch
from torch import nn

from tfcompile.calibration.sequential import find_layers
from tfcompile.distill.data import BlockOrder
from tfcompile.distill.train import Segment
from tfcompile.errors import UserError


class _Caught(Exception):
    pass


class _Catcher(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer, self.calls = layer, []

    def forward(self, hidden, *args, **kwargs):
        self.calls.append((hidden, kwargs))
        raise _Caught


def layer_inputs(model: nn.Module, layers: nn.ModuleList, ids: torch.Tensor, batch: int) -> list:
    """[(hidden [b, L, H], kwargs)] into decoder layer 0, per micro-batch of `batch` blocks."""
    catcher = _Catcher(layers[0])
    layers[0] = catcher
    try:
        with torch.no_grad():  # not inference_mode: the tensors feed autograd later
            for start in range(0, ids.shape[0], batch):
                try:
                    model(input_ids=ids[start:start + batch], use_cache=False)
                except _Caught:
                    continue
                raise UserError("distill.mode layerwise: the forward never reached decoder layer 0",
                                hint="use --set distill.mode=model")
    finally:
        layers[0] = catcher.layer
    return catcher.calls


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def run_layerwise(teacher: nn.Module, student, train_ids: torch.Tensor, cfg, loop, convert=None) -> None:
    """Distill every decoder layer in turn through `loop` (train.Loop), one segment per layer.

    `convert(only=prefix, into=student)`, when given, makes decoder layer i of the student
    just after the teacher produced its targets: then teacher and student are one model,
    turned into the student layer by layer (the model is in memory once)."""
    path, t_layers = find_layers(teacher)
    s_layers = student.model.get_submodule(path)
    ids = train_ids[: cfg.layer_samples]
    calls = layer_inputs(teacher, t_layers, ids, cfg.batch)
    kwargs = [kw for _, kw in calls]
    x_t = [h for h, _ in calls]
    x_s = list(x_t)
    for i in range(len(t_layers)):
        with torch.no_grad():
            y = [_first(t_layers[i](h, **kw)) for h, kw in zip(x_t, kwargs)]
        if convert is not None:
            convert(student.model, only=f"{path}.{i}.", into=student)
        ls = s_layers[i]
        params = student.parameters(prefix=f"{path}.{i}.")
        loop.adopt(params)
        if params:
            loop.run(_segment(i, ls, params, x_s, y, kwargs, cfg, student))
        with torch.no_grad():
            x_s = [_first(ls(h, **kw)) for h, kw in zip(x_s, kwargs)]
        student.release()
        x_t = y


def _segment(i: int, layer: nn.Module, params: list, x_s: list, y: list, kwargs: list, cfg, student) -> Segment:
    order = BlockOrder(len(x_s), 1, cfg.grad_accum, cfg.seed + i)

    def step(local: int) -> dict:
        total = 0.0
        for micro in range(cfg.grad_accum):
            b = int(order.blocks(local, micro)[0])
            out = _first(layer(x_s[b], **kwargs[b]))
            loss = (out - y[b]).square().sum() / y[b].square().sum().clamp_min(1e-12)
            (loss / cfg.grad_accum).backward()
            total += float(loss.detach()) / cfg.grad_accum
        student.release()
        return {"loss": total, "layer_mse": total}

    return Segment(f"layer {i}", params, i * cfg.steps, cfg.steps, step)
