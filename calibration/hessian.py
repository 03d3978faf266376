"""The "hessian" statistic: H = X^T X / n of each fusion group's input, float32 [K, K].

GPTQ solves with it (passes/quantize/gptq.py), quantize.scale_search=output scores scales
with it (passes/quantize/output_scales.py); both ask for it by name (`register_algorithm(
calibrate={"hessian": True})`: the calibrate setting of the same name schedules it). The
calibration loops record it through calibration/statistics.py and name it nowhere.

A per-group statistic: recorded on each group's first member (the members share X), folded on
the group's owner rank under torchrun, spilled per finished layer by the layer loop, and
dropped for routed experts that saw fewer than calibrate.moe_min_tokens tokens (GPTQ -> RTN).
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import torch

from tfcompile.calibration.statistics import Recorder, Setup, register_statistic, result_of
from tfcompile.families.experts import is_expert_group

NAME = "hessian"


class HessianRecorder(Recorder):
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group observed so far (under torchrun: per group this rank
    owns). A routed expert's batch (T_e rows, a few hundred) is much smaller than its K x K
    partial, so under torchrun an expert group's rows X_b travel to the owner, which computes
    X_b^T X_b there; other groups send the partial (module docstring of tfcompile/dist/collect.py).
    One process computes and adds the same products in the same order either way.
    Option `dtype` (calibrate.hessian_dtype): what X^T X is computed and summed in: "float32" (the
    default, as llm-compressor's GPTQ), or "compute", the forwards' dtype (bf16: every batch's
    product and the running sum rounded to 8 bits of mantissa); `result()` hands float32 to the
    solve either way. Option `blocks` (calibrate.hessian_blocks) b > 0: only H's diagonal b x b blocks,
    [K / b, b, b], what a scale search scores with (passes/quantize/output_scales.py): K / b times less
    memory and time than the whole [K, K] GPTQ needs (a DeepSeek-V3 expert's down_proj: 0.9 MB, not 17 MB)."""

    def __init__(self, setup: Setup):
        super().__init__()
        self.dtype = setup.compute_dtype if setup.options.get("dtype") == "compute" else torch.float32
        self.blocks = int(setup.options.get("blocks") or 0)
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self.groups = setup.first_members()  # member Linear (checkpoint name) -> group key
        self._seconds: dict[str, float] = {}  # group key -> seconds spent computing X^T X
        replay = setup.replay
        replay.owners.update({f"{NAME}/{k}": r for k, r in setup.owner.items()})
        # x -> H += X^T X: under torchrun X_b^T X_b on the batch's rank, the sum on the owner
        self._route = {k: replay.wrap(f"{NAME}/{k}", self._fold(k), self._prepare(k))
                       for k in sorted(set(self.groups.values()))}
        in_memory = {setup.names.to_model(m): k for m, k in self.groups.items()}
        self.hooks = [mod.register_forward_pre_hook(self._hook(self._route[in_memory[name]]))
                      for name, mod in setup.model.named_modules() if name in in_memory]

    def _hook(self, route):
        return lambda mod, args: None if self.paused else route(args[0])

    def add(self, member: str, x: torch.Tensor) -> None:
        """Input x of group member `member` (fused experts: calibration/moe.py)."""
        key = self.groups.get(member)
        if key is not None and not self.paused:
            self._route[key](x)

    def _prepare(self, key: str):
        """One batch's X^T X (in `dtype`, on x's device) and its row count: the expensive part, on the
        batch's rank; a routed expert's rows X_b [T_e, K] as they are (the owner multiplies)."""
        def prepare(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            x = x.detach().reshape(-1, x.shape[-1])
            if is_expert_group(key):
                return x, torch.tensor([x.shape[0]])
            return self._product(key, x), torch.tensor([x.shape[0]])

        return prepare

    def _product(self, key: str, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        x = x.to(self.dtype)
        if self.blocks:  # [T, K] -> [K / b, T, b]: each diagonal block's own b x b product
            xb = x.reshape(x.shape[0], -1, self.blocks).transpose(0, 1)
            h = xb.transpose(1, 2) @ xb  # [K / b, b, b]
        else:
            h = x.T @ x
        self._seconds[key] = self._seconds.get(key, 0.0) + time.perf_counter() - t0
        return h

    def _fold(self, key: str):
        """H = H + X_b^T X_b in batch order (on the group's owner rank under torchrun)."""
        def fold(h: torch.Tensor, rows: torch.Tensor) -> None:
            h = self._product(key, h) if is_expert_group(key) else h  # an expert's rows X_b
            self._h[key] = h if key not in self._h else self._h[key] + h
            self._n[key] = self._n.get(key, 0) + int(rows)

        return fold

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self._h[k].float() / self._n[k] for k in sorted(self._h)}

    def rows(self) -> dict[str, int]:
        """Input rows (tokens) behind each Hessian so far: a routed expert's are its tokens."""
        return dict(sorted(self._n.items()))

    def take(self) -> dict[str, torch.Tensor]:
        """The finished Hessians so far, forgotten here (the layer loop spills them)."""
        out = self.result()
        self._h.clear()
        self._n.clear()
        return out

    def seconds(self) -> dict[str, float]:
        return dict(self._seconds)


def hessians(calib) -> Mapping[str, torch.Tensor]:
    """Group key -> H [K, K] of a `CalibStats` ({} when none were recorded; lazy when spilled)."""
    return result_of(calib, NAME, {})


def _summary(calib) -> dict:
    """The calibrate pass's count: Hessians kept for pack, or already solved in the layer loop."""
    return {"hessians": len(hessians(calib)) + len(calib.solved)}


register_statistic(NAME, HessianRecorder, per_group=True, summary=_summary, label="GPTQ Hessians")
