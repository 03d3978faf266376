"""AWQ statistics: the input of every fusion group that is a normalisation layer's output.

AWQ (passes/quantize/awq.py) folds a per-channel scale s into the norm that
feeds a group (norm weight / s, member weight columns * s). That is exact only
when the norm's output goes to the group's Linears and nowhere else, and the
norm's output is linear in its weight (and bias): y = n(x) * w + b. So the
recorder does not trust module names; during the calibration forward it sees
which norm output each Linear receives, and at the end it checks the fold on
the real model:

- a forward hook on every norm-like module (a 1-D `weight`, "Norm" in its class
  name) remembers its last output (a weak reference: nothing is kept alive);
- a forward pre-hook on every Linear (and every group member) records which
  norm output it received: the very tensor object, a view of one (shares its
  storage), or none;
- a group is a candidate when every member received the same norm's output
  as is, on every call, and no other Linear received that output or a view of
  it (parallel attention/MLP blocks, an MoE router, a Linear left out by
  --ignore all disqualify it);
- `result()` then verifies the candidates: with their folds applied using
  power-of-two scales (exact in any float format), the model's output on a
  slice of the first calibration sequence must not move. This catches what
  hooks cannot see, e.g. a norm output that is also the residual stream
  (post-norm BERT) or a norm computing n(x) * (1 + w) (Gemma).

Per candidate group it keeps, over every calibration token: mean |x| and max
|x| per input channel (float32 [K]), and a uniform sample of at most
`max_rows` input rows (float32 [n, K]; seeded bottom-k sampling, so it depends
only on the seed and the token order). Memory: max_rows * K * 4 bytes per group.

Fused MoE experts (transformers v5 `experts.gate_up_proj`) are not Linear
modules, so their groups are never observed and stay RTN; so do groups whose
input is not a norm output (o_proj, down_proj).
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import nn

from tfcompile.calibration.statistics import Recorder, Setup, register_statistic, result_of
from tfcompile.dist import LOCAL
from tfcompile.dist.collect import share_tensors

NAME = "awq"

MAX_ROWS = 2048  # sampled input rows per group (the AWQ search's calibration set)
CHECK_TOKENS = 64  # tokens of the first calibration sequence used to verify the folds
_EXPERT = re.compile(r"\.experts\.\d+\.")


@dataclass(frozen=True)
class AWQInput:
    """What AWQ needs of one norm-fed fusion group's input."""
    norm: str  # module whose output is the group's input, e.g. model.layers.0.input_layernorm
    mean_abs: torch.Tensor  # float32 [K]: mean |x| per input channel, every calibration token
    max_abs: torch.Tensor  # float32 [K]: max |x| per input channel
    rows: torch.Tensor  # float32 [n, K]: uniform sample of input rows
    tokens: int  # calibration tokens the statistics cover


@dataclass(frozen=True)
class AWQStatistics:
    """The statistic's result: per norm-fed group its input, and why the other groups have none."""
    inputs: Mapping[str, AWQInput] = field(default_factory=dict)  # group key -> its input statistics
    skipped: Mapping[str, str] = field(default_factory=dict)  # group key -> why it has no AWQ statistics


def awq_statistics(calib) -> AWQStatistics:
    """The AWQ statistics of a `CalibStats` (empty when none were recorded)."""
    return result_of(calib, NAME, AWQStatistics())


class _Acc:
    """Running per-channel sums/maxima and a bottom-k row sample of one group's input."""

    def __init__(self, k: int, max_rows: int, seed: int):
        self.sum = torch.zeros(k, dtype=torch.float64)
        self.max = torch.zeros(k)
        self.n = 0
        self.max_rows = max_rows
        self.gen = torch.Generator().manual_seed(seed)
        self.rows = torch.zeros(0, k)
        self.keys = torch.zeros(0)

    def add(self, x: torch.Tensor) -> None:
        x = x.detach().reshape(-1, x.shape[-1]).float()
        a = x.abs()  # on x's device (--device); the statistics are kept on the CPU
        self.sum += a.sum(0, dtype=torch.float64).cpu()
        self.max = torch.maximum(self.max, a.amax(0).cpu())
        self.n += x.shape[0]
        keys = torch.cat([self.keys, torch.rand(x.shape[0], generator=self.gen)])
        rows = torch.cat([self.rows, x.cpu()])
        if keys.numel() > self.max_rows:
            keys, idx = torch.topk(keys, self.max_rows, largest=False, sorted=True)
            rows = rows[idx]
        self.keys, self.rows = keys, rows


def is_norm(mod: nn.Module) -> bool:
    w = getattr(mod, "weight", None)
    return isinstance(w, torch.Tensor) and w.ndim == 1 and "norm" in type(mod).__name__.lower()


class AWQRecorder(Recorder):
    """Per fusion group fed by a norm: the norm's name and statistics of its output.

    `groups`: quantized Linear module -> its fusion-group key (every member of
    every group). With no groups it installs no hooks. Under torchrun (`replay`, an
    OrderedReplay whose owners include "awq/{key}") each group's inputs are added on its owner
    in batch order, as one process adds them, and `result()` gives every rank the same."""

    def __init__(self, model: nn.Module, groups: dict[str, str], *, max_rows: int = MAX_ROWS,
                 seed: int = 0, replay=None):
        super().__init__()
        self.model, self.groups, self.world = model, dict(groups), replay.world if replay is not None else LOCAL
        self.max_rows, self.seed = max_rows, seed
        self._outs: dict[str, tuple] = {}  # norm -> (weakref to its last output, storage address)
        self._seen: dict[str, set] = {}  # Linear -> {norm name | "view:"+norm | None} per call
        self._acc: dict[str, _Acc] = {}  # group key -> statistics (first member's hook)
        self._ids: torch.Tensor | None = None  # first calibration sequence (for the fold check)
        if not self.groups:
            return
        first = {}
        for m, key in self.groups.items():
            first.setdefault(key, m)
        self._first = set(first.values())
        self._add = {k: replay.wrap(f"awq/{k}", self._fold(k)) if replay is not None else self._fold(k)
                     for k in sorted(first)}
        for name, mod in model.named_modules():
            if is_norm(mod):
                self.hooks.append(mod.register_forward_hook(self._norm_hook(name)))
            elif isinstance(mod, nn.Linear) or name in self.groups:
                self.hooks.append(mod.register_forward_pre_hook(self._linear_hook(name)))
        self.hooks.append(model.register_forward_pre_hook(self._model_hook, with_kwargs=True))

    def begin(self, ids: torch.Tensor) -> None:
        """The fold check's tokens: the first calibration sequence, whichever rank runs it."""
        self._ids = ids[:1, :CHECK_TOKENS].clone()

    def _fold(self, key: str):
        def add(x: torch.Tensor) -> None:
            if key not in self._acc:
                self._acc[key] = _Acc(x.shape[-1], self.max_rows, self.seed)
            self._acc[key].add(x)

        return add

    def _model_hook(self, mod, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        if self._ids is None and isinstance(ids, torch.Tensor):
            self._ids = ids[:1, :CHECK_TOKENS].clone()

    def _norm_hook(self, name: str):
        def hook(mod, args, out):
            if isinstance(out, torch.Tensor):
                self._outs[name] = (weakref.ref(out), _storage(out))

        return hook

    def _linear_hook(self, name: str):
        def hook(mod, args):
            x = args[0] if args else None
            if not isinstance(x, torch.Tensor) or not x.numel():
                return
            src = self._source(x)
            self._seen.setdefault(name, set()).add(src)
            key = self.groups.get(name)
            if name in self._first and src is not None and not src.startswith("view:"):
                self._add[key](x)

        return hook

    def _source(self, x: torch.Tensor) -> str | None:
        """The norm whose output x is ("view:<norm>" when x only shares its storage), or None."""
        ptr = _storage(x)
        for norm, (ref, nptr) in self._outs.items():
            if ref() is x:
                return norm
            if ptr == nptr and ref() is not None:
                return "view:" + norm
        return None

    def result(self) -> AWQStatistics:
        """Group key -> AWQInput, and group key -> why it has none; runs the fold check."""
        self._gather()
        cands, skipped = self._candidates()
        folds = {k: (norm, [m for m, g in self.groups.items() if g == k]) for k, norm in cands.items()}
        for key, why in verify_folds(self.model, self._ids, folds).items():
            skipped[key] = why
            cands.pop(key)
        out = {}
        for key, norm in sorted(cands.items()):
            acc = self._acc[key]
            out[key] = AWQInput(norm, (acc.sum / acc.n).float(), acc.max.clone(), acc.rows, acc.n)
        return AWQStatistics(out, dict(sorted(skipped.items())))

    def _gather(self) -> None:
        """Under torchrun: every rank's view of which norm fed which Linear, and each group's
        statistics from its owner (the tensors broadcast by it), on every rank."""
        if not self.world.distributed:
            return
        for part in self.world.all_objects("awq/seen", self._seen):
            for lin, srcs in part.items():
                self._seen.setdefault(lin, set()).update(srcs)
        mine = {f"{k}/{f}": getattr(a, f) for k, a in self._acc.items() for f in ("sum", "max", "rows")}
        counts = {k: a.n for k, a in self._acc.items()}
        for part in self.world.all_objects("awq/n", counts):
            counts.update(part)
        got = share_tensors(self.world, mine, "awq/stats")
        for k, n in counts.items():
            acc = self._acc.setdefault(k, _Acc(got[f"{k}/max"].shape[0], self.max_rows, self.seed))
            acc.sum, acc.max, acc.rows, acc.n = got[f"{k}/sum"], got[f"{k}/max"], got[f"{k}/rows"], n

    def _candidates(self) -> tuple[dict[str, str], dict[str, str]]:
        members: dict[str, list[str]] = {}
        for m, key in self.groups.items():
            members.setdefault(key, []).append(m)
        consumers: dict[str, set[str]] = {}  # norm -> Linears that received it (or a view)
        for lin, srcs in self._seen.items():
            for s in srcs - {None}:
                consumers.setdefault(s.removeprefix("view:"), set()).add(lin)
        cands, skipped = {}, {}
        for key, ms in members.items():
            srcs = set().union(*(self._seen.get(m, set()) for m in ms))
            if any(m not in self._seen for m in ms):
                skipped[key] = ("MoE expert: its input is a routed part of the norm output"
                                if any(_EXPERT.search(m) for m in ms) else "no calibration token reached it")
            elif len(srcs) != 1 or None in srcs or next(iter(srcs)).startswith("view:"):
                skipped[key] = "input is not a norm output"
            elif consumers[next(iter(srcs))] != set(ms):
                norm = next(iter(srcs))
                extra = sorted(consumers[norm] - set(ms))
                skipped[key] = f"{norm} also feeds {', '.join(extra[:3])}"
            else:
                cands[key] = next(iter(srcs))
        return cands, skipped


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def verify_folds(model: nn.Module, ids: torch.Tensor | None,
                 folds: dict[str, tuple[str, list[str]]]) -> dict[str, str]:
    """Folds (group key -> (norm, member Linears)) that change the model's output: key -> reason.

    All folds are tried at once; if the output moves, each one alone."""
    if not folds:
        return {}
    if ids is None:
        return {k: "fold not verified (no whole-model forward seen)" for k in folds}
    mods = dict(model.named_modules())
    with torch.inference_mode():
        base = _run(model, ids)
        if _unchanged(model, mods, ids, base, list(folds.values())):
            return {}
        return {k: f"folding into {v[0]} changes the model's output (not a plain norm -> Linears edge)"
                for k, v in folds.items() if not _unchanged(model, mods, ids, base, [v])}


def _unchanged(model, mods, ids, base, folds) -> bool:
    """Apply `folds` [(norm, [member Linears])] with random scales s in {1, 2, 4} (powers of
    two: exact in every float format), run the model, undo them; True when the output did
    not move. Member weights are multiplied first, so dividing back restores them bit for
    bit; the (small) norm parameters are restored from copies."""
    gen = torch.Generator().manual_seed(0)
    scaled, saved = [], []
    try:
        for norm, members in folds:
            nmod = mods[norm]
            s = torch.pow(2.0, torch.randint(0, 3, nmod.weight.shape, generator=gen).float())
            for p in (nmod.weight, getattr(nmod, "bias", None)):
                if isinstance(p, torch.Tensor):
                    saved.append((p, p.detach().clone()))
                    p.data.div_(s.to(p.dtype))
            for m in members:
                w = mods[m].weight
                w.data.mul_(s.to(w.dtype))
                scaled.append((w, s))
        out = _run(model, ids)
    finally:
        for w, s in scaled:
            w.data.div_(s.to(w.dtype))
        for p, copy in saved:
            p.data.copy_(copy)
    tol = 1e-3 * float(base.abs().amax()) + 1e-6
    return bool((out.float() - base.float()).abs().amax() <= tol)


def _run(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The model's first output (logits / last hidden state) for `ids`, without a KV cache."""
    try:
        out = model(input_ids=ids, use_cache=False)
    except TypeError:  # a forward without use_cache
        out = model(input_ids=ids)
    return out if isinstance(out, torch.Tensor) else out[0]


def _recorder(setup: Setup) -> AWQRecorder:
    """Every group's statistics, each folded on one rank (round robin over the keys, like observers)."""
    keys = sorted(set(setup.groups.values()))
    setup.replay.owners.update({f"{NAME}/{k}": i % setup.world.size for i, k in enumerate(keys)})
    return AWQRecorder(setup.model, dict(setup.groups), replay=setup.replay)


def _summary(calib) -> dict:
    stats = awq_statistics(calib)
    return {"awq_groups": len(stats.inputs), "awq_skipped_groups": len(stats.skipped)}


# the fold check runs the whole model (`verify_folds`): not in the layer loop
register_statistic(NAME, _recorder, whole_model=True, summary=_summary)
