"""KL per decoder layer, through the logit lens (`tfcompile eval --layer-kl`).

After each decoder layer i, both models' hidden states h_i [B, L, H] go through their own
final norm and lm_head, as if the model stopped there, and we measure

    KL_i = mean over positions of KL(softmax(head(norm(h_i_ref))) || softmax(head(norm(h_i_model))))

in nats, on the first `max_positions` positions of the evaluation (batch order). After the last
layer the models apply exactly that norm and head, so its figure is taken from the logits the
evaluation already computed (LogitMetrics, on the same positions): the model's own KL(ref ||
model), with no lm_head work of its own, and equal to the eval table's `kl_mean` whenever the
evaluation has no more positions than the lens. Earlier layers show where along the depth the
quantized model's prediction drifts away. Cost: two head projections (V x H multiply-adds each)
per earlier layer and position, in float32 chunks of at most CHUNK_ELEMENTS logits, so a large
vocabulary (SmolLM2: 49,152) does not allocate [positions, V] tensors per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from tfcompile.evaluate.kvtext import LENS_MAX_POSITIONS as MAX_POSITIONS  # noqa: E402 (torch-free home)

CHUNK_ELEMENTS = 1 << 23  # logits per model per chunk: 32 MiB of float32


def decoder_parts(model: nn.Module) -> tuple[nn.ModuleList, nn.Module, nn.Module] | None:
    """(decoder layers, final norm, lm_head) of a transformers causal LM, or None when the
    architecture does not expose them as `<base>.layers` / `<base>.norm` (e.g. encoders)."""
    base = getattr(model, "model", None)
    layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(layers, nn.ModuleList) or norm is None or head is None:
        return None
    return layers, norm, head


@dataclass
class LayerKL:
    max_positions: int = MAX_POSITIONS
    kl: list[float] = field(default_factory=list)  # sum over positions, per layer
    positions: int = 0
    _cand: dict[int, torch.Tensor] = field(default_factory=dict)
    _hooks: list = field(default_factory=list)
    _parts: tuple = ()

    def attach(self, candidate: nn.Module, reference: nn.Module) -> bool:
        """Hook both models' decoder layers; False (nothing attached) if either has none."""
        cand, ref = decoder_parts(candidate), decoder_parts(reference)
        if cand is None or ref is None or len(cand[0]) != len(ref[0]):
            return False
        self._parts = (cand, ref)
        self.kl = [0.0] * len(ref[0])
        for i, (lc, lr) in enumerate(zip(cand[0][:-1], ref[0][:-1])):  # the last: batch_done
            self._hooks.append(lc.register_forward_hook(self._keep(i)))
            self._hooks.append(lr.register_forward_hook(self._compare(i)))
        return True

    def detach(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()

    def wanted(self, ids: torch.Tensor) -> int:
        """How many of a [B, L] batch's first positions (row-major) the lens covers."""
        return self._take(ids.numel())

    def batch_done(self, ids: torch.Tensor, last_kl: float) -> None:
        """Count a [B, L] batch's positions (call after both models ran on it); `last_kl`: the
        sum of the models' own KL(ref || model) over its first `wanted(ids)` positions, the last
        layer's term (LogitMetrics.update(..., prefix=wanted(ids)))."""
        if self.kl:
            self.kl[-1] += last_kl
        self.positions += self._take(ids.numel())

    def begin(self, offset: int) -> None:
        """Under torchrun a rank runs every N-th batch: the next one starts at global position
        `offset`, so it covers the positions one process would give it."""
        self.positions = min(offset, self.max_positions)

    def take(self) -> list[float]:
        """The last batch's per-layer sums (zeroed here): what the other ranks replay."""
        out, self.kl = self.kl, [0.0] * len(self.kl)
        return out

    def replay(self, parts: list[list[float]], positions: int) -> None:
        """Every batch's `take()` in batch order, added as one process adds them (bit for bit)."""
        self.kl = [0.0] * len(self.kl)
        for part in parts:
            for i, v in enumerate(part):
                self.kl[i] += v
        self.positions = min(positions, self.max_positions)

    def _take(self, n: int) -> int:
        return max(0, min(n, self.max_positions - self.positions))

    def _keep(self, i: int):
        def hook(_mod, _args, out):
            self._cand[i] = (out[0] if isinstance(out, (tuple, list)) else out).detach()
        return hook

    def _compare(self, i: int):
        def hook(_mod, _args, out):
            hc = self._cand.pop(i, None)
            hr = out[0] if isinstance(out, (tuple, list)) else out
            n = self._take(hr.shape[0] * hr.shape[1])
            if hc is None or n == 0:
                return
            self.kl[i] += self._kl(hc.reshape(-1, hc.shape[-1])[:n], hr.detach().reshape(-1, hr.shape[-1])[:n])
        return hook

    def _kl(self, hc: torch.Tensor, hr: torch.Tensor) -> float:
        """Sum over the rows of hc, hr [n, H] of KL(ref || model) through norm and head, in
        chunks of rows so each chunk's logits [rows, V] stay within CHUNK_ELEMENTS."""
        (_, norm_c, head_c), (_, norm_r, head_r) = self._parts
        rows = max(1, CHUNK_ELEMENTS // int(head_r.weight.shape[0]))
        total = 0.0
        for s in range(0, hc.shape[0], rows):
            lp = F.log_softmax(head_c(norm_c(hc[s:s + rows])).float(), -1)
            lpr = F.log_softmax(head_r(norm_r(hr[s:s + rows])).float(), -1)
            total += float((lpr.exp() * (lpr - lp)).sum(-1).clamp_min(0).double().sum())
        return total

    def result(self) -> list[dict]:
        """[{layer, kl_mean}] per decoder layer (nats/token over `positions` positions)."""
        if not self.positions:
            return []
        return [{"layer": i, "kl_mean": round(k / self.positions, 8)} for i, k in enumerate(self.kl)]
