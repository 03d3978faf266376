"""The statistics the calibration loops record, registered by name: the loops name none.

A statistic is a `Recorder` built once per calibration run by the factory registered with
`register_statistic(name, factory)`. It installs its own hooks on the model it is given
(`Setup`), and the loops (calibration/forward.py whole model, calibration/sequential.py layer
by layer, through calibration/recorders.py) only call the methods below at fixed points:

    begin(ids)    the calibration token ids [samples, seq_len], before the first batch (every rank)
    add(m, x)     the input x [T, K] of a fused expert's Linear m (calibration/moe.py: no module to hook)
    take()        a finished decoder layer: its per-group tensors, forgotten here (the layer loop spills them)
    rows()        input rows behind each per-group tensor so far (a routed expert's tokens)
    result()      after the loop: the statistic (a `per_group` one: this rank's group key -> tensor)
    seconds()     group key -> seconds spent computing it (summed over ranks: the calibrate pass reports them)

and set `paused` while the layer loop reruns a quantized layer (calibration/propagate.py).

A `per_group` statistic maps fusion-group keys to tensors and is treated alike whatever it is:
under torchrun each key's tensor is folded on one owner rank (`Setup.owner`, through
`Setup.replay`), the layer loop spills finished layers to disk, routed experts that saw fewer
than `moe_min_tokens` tokens lose theirs (their group stays round to nearest), and the result
handed on is a `HeldTensors` mapping that says which rank holds each key. Any other statistic's
`result()` is handed on as it is (one whose result runs the whole model says `whole_model`).

Algorithms ask for statistics by name (`register_algorithm(calibrate={"statistics": (...)})`,
tfcompile/ir.py); the statistic's own module owns the typed accessor that reads its result back
from `CalibStats.statistics` (and `Program.statistics`, which quantize hands on to pack).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import safe_open
from torch import nn

from tfcompile.dist import LOCAL
from tfcompile.dist.collect import OrderedReplay
from tfcompile.families.names import NameMap


@dataclass(frozen=True)
class Setup:
    """What a statistic's recorder is built from, for one calibration run."""
    model: nn.Module  # the model the loop runs (the layer loop's skeleton: layers bound one at a time)
    names: NameMap  # checkpoint module name -> the module's name in `model`
    groups: Mapping[str, str]  # every quantized Linear (checkpoint name) -> its fusion-group key
    # under torchrun: wrap(f"{statistic}/{key}", fold, prepare) replays order-sensitive updates on the
    # key's owner in batch order (tfcompile/dist/collect.py); one process: calls fold(*prepare(x))
    replay: OrderedReplay
    options: Mapping[str, Any] = field(default_factory=dict)  # the statistic's own options (calibrate pass)
    owner: Mapping[str, int] = field(default_factory=dict)  # per_group: group key -> the rank folding it
    compute_dtype: torch.dtype = torch.float32  # what the forwards compute in (calibrate.dtype resolved)

    @property
    def world(self):
        return self.replay.world

    def first_members(self) -> dict[str, str]:
        """Group key's first member -> key: the members of a group share their input."""
        first: dict[str, str] = {}
        for m, key in self.groups.items():
            first.setdefault(key, m)
        return {m: k for k, m in first.items()}


def local_setup(model: nn.Module, groups: Mapping[str, str], options: Mapping[str, Any] | None = None,
                compute_dtype: torch.dtype = torch.float32) -> Setup:
    """A one-process `Setup` on `model` (tests and benches build one recorder with it)."""
    return Setup(model, NameMap(model), dict(groups), OrderedReplay(LOCAL, {}), dict(options or {}),
                 compute_dtype=compute_dtype)


class Recorder:
    """One statistic's hooks over one calibration run (module docstring); the defaults do nothing."""

    def __init__(self) -> None:
        self.hooks: list = []  # torch hook handles, removed by `remove`
        self.paused = False

    def begin(self, ids: torch.Tensor) -> None: ...

    def add(self, member: str, x: torch.Tensor) -> None: ...

    def take(self) -> dict[str, torch.Tensor]:
        return {}

    def rows(self) -> dict[str, int]:
        return {}

    def result(self) -> Any:
        return {}

    def seconds(self) -> dict[str, float]:
        return {}

    def remove(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []


@dataclass(frozen=True)
class Statistic:
    name: str
    factory: Callable[[Setup], Recorder]
    per_group: bool = False  # result: group key -> tensor (owners, spilling, expert token threshold)
    whole_model: bool = False  # needs the whole-model loop (e.g. a check that runs the whole model)
    # summary(CalibStats) -> the calibrate pass's statistics of it (e.g. {"my_groups": 4})
    summary: Callable[[Any], dict] | None = None
    label: str = ""  # what people call it, in messages (e.g. "input second moments"); default: the name


STATISTICS: dict[str, Statistic] = {}


def register_statistic(name: str, factory: Callable[[Setup], Recorder], *, per_group: bool = False,
                       whole_model: bool = False, summary: Callable[[Any], dict] | None = None,
                       label: str = "") -> Statistic:
    """Make statistic `name` recordable by every calibration loop (module docstring)."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"statistic name {name!r}: lowercase letters, digits and _ (it names spill files)")
    STATISTICS[name] = Statistic(name, factory, per_group, whole_model, summary, label or f"{name} statistics")
    return STATISTICS[name]


def result_of(calib, name: str, default: Any = None) -> Any:
    """Statistic `name` of a `CalibStats` (None: not calibrated), or `default` if not recorded."""
    stats = getattr(calib, "statistics", None) or {}
    return stats.get(name, default)


def enough_tokens(key: str, tokens: Mapping[str, int], min_tokens: int) -> bool:
    """A fused expert's group keeps its per-group statistic only when min_tokens were routed to it."""
    m = re.match(r"(.*\.experts\.\d+)\.", key)
    return m is None or m.group(1) not in tokens or tokens[m.group(1)] >= min_tokens


def expert_rows(rows: Mapping[str, int]) -> dict[str, int]:
    """Routed tokens per expert "{experts module}.{e}", read from per-group row counts."""
    out = {}
    for key, n in rows.items():  # a routed expert's rows are its tokens (calibration/moe.py)
        m = re.match(r"(.*\.experts\.\d+)\.", key)
        if m:
            out[m.group(1)] = n
    return out


SOLVED = "_solved"  # the layer solver's codes, spilled beside the statistics (no statistic's name)


class HeldTensors(Mapping):
    """Group key -> tensor of a per-group statistic (or the layer solver's codes), each read from
    its spill file (the layer loop's, one safetensors file per layer) only when asked for.

    Under torchrun the keys are every group's; this rank holds those `owners` maps to it, and
    `owner(key)` tells pack which rank computes with it (or holds the codes)."""

    def __init__(self, files: Mapping[str, Path], inline: Mapping, owners: Mapping[str, int] | None = None,
                 rank: int = 0, keep: Any = None):
        self._files, self._inline = dict(files), dict(inline)
        self._keep = keep  # what owns the files (the layer loop's spill: its directory lives as long)
        self._owners, self._rank = dict(owners or {}), rank
        self._keys = sorted(set(self._files) | set(self._inline) | set(self._owners))

    def with_files(self, files: Mapping[str, Path], keep: Any = None) -> "HeldTensors":
        """The same keys and owners, with the tensors spilled to `files` (key -> its file) added."""
        return HeldTensors({**self._files, **files}, self._inline, self._owners, self._rank, keep)

    def owner(self, key: str) -> int | None:
        return self._owners.get(key, self._rank if key in self._keys else None)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self._inline:
            return self._inline[key]
        if key in self._owners and self._owners[key] != self._rank:
            raise RuntimeError(f"the tensor of {key} is held by rank {self._owners[key]}, not {self._rank}")
        with safe_open(self._files[key], framework="pt") as f:  # KeyError if unknown
            return f.get_tensor(key)

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def joined(a: Mapping | None, b: Mapping | None) -> Mapping | None:
    """Two per-group results over disjoint group keys as one (e.g. the layer loop's and the MTP
    layers': tfcompile/draft/mtp_calibrate.py), lazy and owned as each was."""
    if a is None or b is None:
        return b if a is None else a
    if not isinstance(a, HeldTensors) and not isinstance(b, HeldTensors):
        return {**a, **b}
    parts = [x if isinstance(x, HeldTensors) else HeldTensors({}, x) for x in (a, b)]
    files = {k: f for p in parts for k, f in p._files.items()}
    inline = {k: t for p in parts for k, t in p._inline.items()}
    owners = {k: r for p in parts for k, r in p._owners.items()}
    return HeldTensors(files, inline, owners, parts[0]._rank, keep=tuple(p._keep for p in parts))


def held(result: Mapping, owners: Mapping[str, int], world=LOCAL, files: Mapping[str, Path] | None = None,
         keep: Any = None) -> Mapping:
    """A per-group result as handed on: under torchrun a `HeldTensors` of every rank's keys; with
    spilled `files` (key -> file, owned by `keep`) a `HeldTensors` that reads them when asked;
    else as it is."""
    if isinstance(result, HeldTensors):
        return result.with_files(files, keep) if files else result
    if not world.distributed and not files:
        return result
    return HeldTensors(files or {}, result, owners if world.distributed else {}, world.rank, keep)
