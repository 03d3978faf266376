"""Calibrate a model's MTP layer on what the engine feeds it: the target's final hidden states.

transformers builds no module for the multi-token-prediction layers (families/mtp.py), so the
calibration loops never run them; before this, their quantized Linears took the fallback amax
(calibration/moe_policy.py: the largest in the model) and no per-group statistic, so GPTQ and the
output-error scale search left them at round-to-nearest while the target's weights were solved.
An MTP head quantized by another rule than its target loses acceptance (issue 27, 33: the tiny
DeepSeek-V3.2 oracle's first-position acceptance fell 0.54 -> 0.18 when only the target's
scales were searched).

Here the layer runs as vLLM runs it at prefill (draft/mtp.py `MTPLayer.step`, the same code
`--draft mtp` measures): index i reads the token x[i+1] and the target's final normed hidden state
at position i, at position i, over each calibration sequence; the loops hand those states over
at their end (`on_final`), so under `calibrate.propagate` they are the quantized target's, as
served. The layer is built with its parameters on the meta device and bound to the mapped
checkpoint (calibration/binding.py), its modules registered under their checkpoint names, so the
same `Recorders` (observers, registered statistics, MoE experts) record it as any decoder layer,
and `merge_stats` adds what they record to the loop's `CalibStats`.

Not calibrated here: the MTP layer's own KV cache (--kv-cache: its attention keeps the engine's
default scale), whole-model statistics (AWQ's), and the layer-loop solvers (a propagating GPTQ or
learned rounding solves the MTP groups in pack from these statistics, not in the loop).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tfcompile.calibration.binding import bind, params_on_meta, tied_groups
from tfcompile.calibration.forward import final_norm
from tfcompile.calibration.recorders import Recorders
from tfcompile.dist import LOCAL
from tfcompile.draft.mtp import QWEN3_5, MTPLayer
from tfcompile.draft.mtp_load import OWN, mtp_layout
from tfcompile.errors import CheckpointError
from tfcompile.ir import CalibStats


class _Named(nn.Module):
    """The MTP layer's modules under their checkpoint names (`model.layers.{N}.self_attn...`,
    `mtp.layers.0.mlp...`): what `bind` and `Recorders` find by name. Holds the same module
    objects as the MTPLayer, so hooks on them see its forward."""

    def __init__(self, layer: MTPLayer):
        super().__init__()
        self.config = layer.config  # MoERecorder reads and sets the experts implementation here
        self._layer = (layer,)  # not a submodule: its parameters are reached through the names below

    def set_experts_implementation(self, impl: str) -> None:
        self._layer[0].set_experts_implementation(impl)

    def put(self, path: str, module: nn.Module) -> None:
        parent = self
        *parts, leaf = path.split(".")
        for p in parts:
            if p not in parent._modules:
                parent.add_module(p, nn.Module())
            parent = parent._modules[p]
        parent.add_module(leaf, module)


def _checkpoint_named(layer: MTPLayer, prefix: str) -> _Named:
    """`layer`'s modules under the checkpoint's names (mtp_load.local() inverted); the token
    embedding is left out: vLLM gives the MTP layer the target's (bound separately)."""
    named = _Named(layer)
    block = prefix + ("layers.0." if layer.layout == QWEN3_5 else "")
    for name, child in layer.named_children():
        if name == "block":
            for sub, mod in child.named_children():
                named.put(block + sub, mod)
        elif name in OWN and name != "embed_tokens":
            named.put(prefix + name, child)
    return named


class MTPCalibration:
    """The loops' `on_final` callback: records the MTP layer's statistics over the calibration
    sequences, with the loop's Recorders settings (`recorder_kwargs`: observer, statistics, groups,
    world, ...), for the MTP modules among `modules`; `stats` is the result after the call."""

    def __init__(self, model_dir: Path, ckpt, modules: set[str], dtype: torch.dtype, device, **recorder_kwargs):
        self.model_dir, self.ckpt, self.modules = Path(model_dir), ckpt, set(modules)
        self.dtype, self.device, self.kwargs = dtype, device, recorder_kwargs
        self.stats: CalibStats | None = None

    def __call__(self, model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], n_rounds: int,
                 source: str) -> None:
        """batches: this rank's (ids [B, T], the input of the target's final norm [B, T, H]), in round
        order, normed here one batch at a time; n_rounds: rounds every rank runs (collectives under
        torchrun)."""
        n, layout, prefix = mtp_layout(self.model_dir, self.ckpt.config)
        with params_on_meta():
            layer = MTPLayer(model, n, layout)
        named = _checkpoint_named(layer, prefix)
        bind(named, self.ckpt, self.dtype, device=self.device)
        left = [g[0] for g in tied_groups(named, meta_only=True)]
        if left:
            raise CheckpointError(f"{self.model_dir}: config.json declares an MTP layer, and its parameter "
                                  f"{left[0]} has no tensor in the checkpoint ({len(left)} missing)",
                                  hint="check the checkpoint with `tfcompile verify`; to quantize without the "
                                       "MTP layer, --ignore its modules and drop it from config.json")
        emb = model.get_input_embeddings().weight.detach()  # the target's (vLLM shares it); only rows are read
        layer.embed_tokens.weight = nn.Parameter(emb.to(self.device, self.dtype), requires_grad=False)
        for mod in layer.modules():  # buffers (the rotary tables) beside the bound parameters
            mod._buffers.update({k: b.to(self.device) for k, b in mod._buffers.items() if b is not None})
        kwargs = dict(self.kwargs, compute_dtype=self.dtype)
        groups = {m: k for m, k in (kwargs.pop("groups", None) or {}).items() if m in self.modules}
        # the loop's Recorders used the same collective tags in this run: a namespace of our own
        kwargs["world"] = kwargs.get("world", LOCAL).scoped("mtp")
        rec = Recorders(named, self.modules, groups=groups, **kwargs)
        norm = final_norm(model)
        norm_device, tokens = next(norm.parameters()).device, 0
        try:
            with torch.inference_mode():
                for r in range(n_rounds):
                    if r < len(batches):
                        ids, hidden = batches[r]
                        hidden = norm(hidden.to(norm_device))  # what vLLM hands the MTP layer
                        tokens += self._run(layer, ids.to(self.device), hidden.to(self.device))
                    rec.flush()
        finally:
            rec.remove()
        self.stats = rec.stats(tokens, source, self.model_dir)

    @staticmethod
    def _run(layer: MTPLayer, ids: torch.Tensor, hidden: torch.Tensor) -> int:
        """Step 0 over whole sequences: index i reads token x[i+1], hidden state i, position i."""
        t = ids.shape[1] - 1
        if t < 1:
            return 0
        pos = torch.arange(t, device=ids.device)
        layer.step(ids[:, 1:], hidden[:, :-1].to(layer.proj.weight.dtype), pos, None)
        return int(ids.shape[0] * t)
