"""The student: the teacher's architecture with every quantized Linear fake-quantized.

Each Linear the plan quantizes becomes a `FakeQuantLinear` whose forward is

    y = A(x) @ Q(round_dtype(W_eff))^T + b

- W_eff, what trains (`distill.train`):
  - "weights": W itself, an fp32 master copy of the checkpoint weight;
  - "scales": W frozen, clipped per quantization block to alpha * max|w_block|,
    alpha in [0.3, 1] trained (one per 16/32-element block). Clipping is how a
    learned scale survives re-quantization: pack recomputes each block scale from
    the stored (clipped) weights with the usual rule and gets the learned one.
    Gradients reach alpha through the clip and, LSQ-style (Esser et al. 2019),
    through the block scale: d Q(w) / d alpha = (Q(w) - w) / alpha;
  - "lora": W frozen plus (lora_alpha / r) * B @ A, A [r, K], B [N, r] (B = 0 at
    start), trained and merged into W before packing (QA-LoRA style: the adapter
    sits inside the quantizer, so the merged weight is what was trained).
- round_dtype: the checkpoint dtype (bf16), straight-through, because the
  distilled checkpoint pack reads is stored in that dtype.
- Q: fakequant.fake_quant_weight (NVFP4 global scale shared by the fusion group).
- A: the scheme's activation quantization (W4A4/W8A8 schemes), straight-through.

`export()` yields, per quantized Linear, round_dtype(W_eff): exactly the tensor
the student quantized in its last forward, so pack's artifact dequantizes to the
student's weights bit for bit.
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn.utils import parametrize

from tfcompile.distill.fakequant import (act_fake_quant_fn, fake_quant_weight,
                                         group_global_scale, ste, to_storage)
from tfcompile.errors import UserError

ALPHA_MIN = 0.3  # scales mode: never clip a block below 30% of its max (as the mse observer's range)


@dataclass(frozen=True)
class QuantSpec:
    """How one Linear is quantized: the scheme, its weight quantizer, MX rule and checkpoint dtype."""
    scheme: object  # tfcompile.schemes.Scheme
    weights: object  # WeightQuantizer: Program.weights, the one pack uses (4/6 under nvfp4_scales=four_over_six)
    rule: str
    dtype: torch.dtype
    impl: str = "auto"  # tfcompile.kernels.formats impl: "auto" (fused kernels) | "reference"


class GroupState:
    """What a fusion group's members share: the NVFP4 global scale (recomputed when a
    member's weights change) and the quantized input (q/k/v, gate/up read one x)."""

    def __init__(self, spec: QuantSpec, act):
        self.spec, self.act = spec, act
        self.members: list[FakeQuantLinear] = []
        self._key: tuple | None = None
        self._value: torch.Tensor | None = None
        self._x: torch.Tensor | None = None  # the last input (held, so its identity is unique)
        self._xq: torch.Tensor | None = None

    def quantized_input(self, x: torch.Tensor) -> torch.Tensor:
        """A(x), straight-through; computed once when the members get the same tensor."""
        if self.act is None:
            return x
        if x is not self._x:
            self._x, self._xq = x, ste(x, self.act)
        return self._xq

    def release(self) -> None:
        """After each forward: the input, and the global scale (recomputed by the next forward:
        under FSDP2 a unit's unsharded parameters keep their `_version` while the optimizer
        changes their shards, so the version key alone would keep a stale scale)."""
        self._x = self._xq = self._value = None

    def global_scale(self) -> torch.Tensor | None:
        if not self.spec.scheme.shares_global_scale:  # NVFP4's group global scale, recomputed as weights train
            return None
        key = tuple(p._version for m in self.members for p in m.trainable())  # bumped by optimizer steps
        if key != self._key or self._value is None:
            with torch.no_grad():
                self._value = group_global_scale(self.spec.weights, [m.effective_weight() for m in self.members])
            self._key = key
        return self._value


class FakeQuantLinear(nn.Module):
    def __init__(self, linear: nn.Linear, name: str, spec: QuantSpec, train: str,
                 lora_rank: int, lora_alpha: float, gen: torch.Generator):
        super().__init__()
        self.name, self.spec, self.mode = name, spec, train
        w = linear.weight.detach().float().clone()  # [N, K], exact upcast of the checkpoint dtype
        self.weight = nn.Parameter(w, requires_grad=train == "weights")
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.group: GroupState | None = None  # set by build_student (shared by the fusion group)
        n, k = w.shape
        if train == "scales":
            self.block = spec.scheme.block[0]  # 16 (NVFP4) or 32 (MX) elements along K
            amax = w.reshape(n, k // self.block, self.block).abs().amax(-1)
            self.register_buffer("block_amax", amax, persistent=False)
            self.alpha = nn.Parameter(torch.ones_like(amax))  # [N, K/block]
        elif train == "lora":
            bound = 1.0 / math.sqrt(k)  # kaiming-uniform(a=sqrt(5)) bound, as peft initialises A
            self.lora_a = nn.Parameter(torch.empty(lora_rank, k).uniform_(-bound, bound, generator=gen))
            self.lora_b = nn.Parameter(torch.zeros(n, lora_rank))
            self.lora_scale = lora_alpha / lora_rank

    def trainable(self) -> list[nn.Parameter]:
        if self.mode == "scales":
            return [self.alpha]
        if self.mode == "lora":
            return [self.lora_a, self.lora_b]
        return [self.weight]

    def _alpha(self) -> torch.Tensor:
        return self.alpha.clamp(ALPHA_MIN, 1.0)

    def effective_weight(self) -> torch.Tensor:
        """round_dtype(W_eff), float32 [N, K]: what the distilled checkpoint stores."""
        w = self.weight
        if self.mode == "lora":
            w = w + self.lora_scale * (self.lora_b @ self.lora_a)
        elif self.mode == "scales":
            n, k = w.shape
            c = (self._alpha() * self.block_amax)[..., None]  # [N, K/block, 1] clip per block
            wb = w.reshape(n, k // self.block, self.block)
            w = torch.minimum(torch.maximum(wb, -c), c).reshape(n, k)
        return to_storage(w, self.spec.dtype)

    def quantized_weight(self) -> torch.Tensor:
        w = self.effective_weight()
        s = self.spec
        wq = fake_quant_weight(w, s.weights, self.group.global_scale(), s.rule, s.dtype, s.impl)
        if self.mode == "scales":  # LSQ path: adds exactly 0 forward, (Q(w) - w) / alpha backward
            a = self._alpha()
            n, k = w.shape
            lsq = ((wq.detach() - w.detach()) / a.detach().repeat_interleave(self.block, -1))
            wq = wq + lsq * (a - a.detach()).repeat_interleave(self.block, -1)
        return wq

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.group.quantized_input(x), self.quantized_weight(), self.bias)


class _Storage(nn.Module):
    """Parametrization: the parameter as the checkpoint stores it (rounded, straight-through)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return to_storage(w, self.dtype)


@dataclass
class Student:
    model: nn.Module
    linears: dict[str, FakeQuantLinear]  # module name -> its fake-quantized Linear
    sources: dict[str, str] = field(default_factory=dict)  # module name -> checkpoint tensor name
    # unquantized tensors trained too (train_unquantized): checkpoint name -> (module, attribute)
    extra: dict[str, tuple[nn.Module, str]] = field(default_factory=dict)

    @classmethod
    def frozen(cls, model: nn.Module) -> "Student":
        """`model` with every parameter frozen and no Linear converted yet (build_student(into=))."""
        for p in model.parameters():
            p.requires_grad_(False)
        return cls(model, {}, {})

    def parameters(self, prefix: str | None = None) -> list[tuple[str, nn.Parameter]]:
        """Trainable parameters (name, param) in a fixed order; only modules under `prefix`."""
        out = []
        for name, lin in self.linears.items():
            if prefix is None or name.startswith(prefix):
                out += [(f"{name}.{n}", p) for n, p in lin.named_parameters() if p.requires_grad]
        for name, (module, attr) in sorted(self.extra.items()):
            if prefix is None or name.startswith(prefix):
                out.append((name, module.parametrizations[attr].original))
        return out

    def release(self) -> None:
        """Drop the inputs the fusion groups keep between members (after each forward)."""
        for lin in self.linears.values():
            lin.group.release()

    @torch.no_grad()
    def export(self, hold: Callable[[nn.Module], None] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """(checkpoint tensor name, distilled weight in the checkpoint dtype), sorted by name.
        `hold(module)` is called before a module's tensor is computed (FSDP2: unshard its unit)."""
        out = {self.sources[m]: (lin, lin.effective_weight, lin.spec.dtype) for m, lin in self.linears.items()}
        out.update({n: (mod, functools.partial(getattr, mod, attr), self.dtype) for n, (mod, attr) in self.extra.items()})
        for name in sorted(out):  # each tensor is computed when the writer asks for it
            module, value, dtype = out[name]
            if hold is None:
                yield name, value().to(dtype)
                continue
            hold(module)  # the copy outlives the unit's unsharded storage (freed by the next hold)
            yield name, value().to(dtype).cpu().clone()

    def tensor_names(self) -> tuple[str, ...]:
        """The checkpoint tensors `export` yields, in its order."""
        return tuple(sorted([*self.sources.values(), *self.extra]))

    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.linears.values())).spec.dtype

    def train_unquantized(self, names: set[str], dtype: torch.dtype) -> None:
        """Also train the parameters named in `names` (the checkpoint tensors the artifact keeps as
        they are: norms, embeddings, an untied lm_head), in fp32, seen by the model rounded to the
        checkpoint dtype (straight-through), which is what the distilled checkpoint stores.
        Parameters shared by several modules (tied embeddings) stay frozen."""
        uses: dict[int, int] = {}
        for _, p in self.model.named_parameters(remove_duplicate=False):
            uses[id(p)] = uses.get(id(p), 0) + 1
        linear_params = {f"{m}.{n}" for m, lin in self.linears.items() for n, _ in lin.named_parameters()}
        for name, p in list(self.model.named_parameters()):
            if name not in names or name in linear_params or uses[id(p)] > 1 or not p.is_floating_point():
                continue
            *path, attr = name.split(".")
            module = self.model.get_submodule(".".join(path))
            parametrize.register_parametrization(module, attr, _Storage(dtype), unsafe=True)
            module.parametrizations[attr].original.requires_grad_(True)
            self.extra[name] = (module, attr)


def build_student(model: nn.Module, plan, program, *, train: str, lora_rank: int, lora_alpha: float,
                  seed: int, dtype: torch.dtype, impl: str = "auto", only: str | None = None,
                  into: Student | None = None) -> Student:
    """`model` (a fresh copy of the teacher; changed in place, frozen) with the plan's Linears
    fake-quantized. `program` gives the MX rule and the calibrated activation amax.

    `only`: convert just the groups under this module prefix (block-wise distillation converts
    one decoder layer at a time; FSDP2's lazy build one unit at a time, the root's last with
    prefix ""), adding them to `into`; groups `into` holds already are skipped."""
    student = into or Student.frozen(model)
    scheme = plan.scheme
    spec = QuantSpec(scheme, program.weights, program.mx_rule, dtype, impl)
    modules = dict(model.named_modules())
    for group in plan.groups:
        if only is not None and (not group.key.startswith(only) or group.members[0].module in student.linears):
            continue
        amax = max(program.act_amax[t.module] for t in group.members) if scheme.act_static else None
        shared = GroupState(spec, act_fake_quant_fn(scheme.act, amax, group.key, dtype, impl))
        for t in group.members:
            lin = modules.get(t.module)
            _check_target(t, lin)
            gen = torch.Generator().manual_seed(seed * 1_000_003 + _stable_hash(t.module))  # LoRA A init
            fq = FakeQuantLinear(lin, t.module, spec, train, lora_rank, lora_alpha, gen)
            fq.group = shared
            shared.members.append(fq)
            parent, _, leaf = t.module.rpartition(".")
            setattr(modules[parent] if parent else model, leaf, fq)
            student.linears[t.module], student.sources[t.module] = fq, t.source
    return student


def _stable_hash(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16)


def _check_target(t, lin) -> None:
    if t.expert is not None or t.rows is not None or (".experts." in t.module and not isinstance(lin, nn.Linear)):
        raise UserError(f"distill: {t.module} is an MoE expert that transformers holds fused; "
                        "distilling fused experts is not supported yet",
                        hint="leave the experts in high precision with --ignore '*experts*', or use "
                             "tfcompile quantize")
    if not isinstance(lin, nn.Linear) or tuple(lin.weight.shape) != tuple(t.shape):
        raise UserError(f"distill: {t.module} is not a Linear of shape {list(t.shape)} in the model "
                        "transformers builds from config.json",
                        hint="distillation needs the checkpoint's tensor names to match the model's modules")
