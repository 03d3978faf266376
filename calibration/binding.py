"""A transformers model bound to a checkpoint's tensors without loading it whole.

`skeleton` builds the model with every parameter on the meta device (buffers such as the RoPE
tables are real); `bind` points a module's parameters at the memory-mapped checkpoint's tensors
(views on the CPU in the model dtype: no copy), tied parameters (lm_head and the embeddings)
bound together; `unbind` puts them back on meta. The layer loop (calibration/sequential.py)
binds one decoder layer at a time; distillation's FSDP2 build (tfcompile/distill/lazy.py) one
unit at a time, through the same tied-group helpers.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from pathlib import Path

import torch
from torch import nn

from tfcompile.calibration.forward import model_class
from tfcompile.families import V5
from tfcompile.families.experts import PROJS, fuse_bias, fuse_weight, module_layout
from tfcompile.io.hf_config import load_hf_config
from tfcompile.machine import MMAP_THRESHOLD, mmap_threshold


class Unsupported(Exception):
    """The checkpoint's tensors do not map onto the model's parameters one to one."""


def fixed_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> None:
    """Serve every allocation >= 128 KiB from its own mmap, returned to the OS on free.

    glibc raises its mmap threshold after the first large free (up to 32 MiB),
    after which activation-sized buffers come from the heap and fragment it:
    measured +20 MB of RSS per decoder layer on a 16-layer model (466 MB ->
    881 MB); with the threshold fixed, RSS stays flat. Setting it explicitly
    turns glibc's dynamic adjustment off for the process. No-op off glibc."""
    mmap_threshold(nbytes)


def skeleton(model_dir: Path) -> nn.Module:
    """config.json's transformers model (never remote code) with parameters on the meta device and
    real buffers (the RoPE tables); the layer loop and distillation's lazy build bind the weights."""
    cfg = load_hf_config(model_dir)  # CheckpointError for a config transformers cannot read
    with warnings.catch_warnings(), params_on_meta():
        warnings.simplefilter("ignore")
        model = model_class(model_dir, cfg)(cfg)
    return model.eval()


@contextlib.contextmanager
def params_on_meta():
    """Create every nn.Parameter on the meta device (no memory, no init cost)."""
    real = nn.Module.register_parameter

    def register(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        real(self, name, param)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = real


def tensor_for(ckpt, name: str, names: set[str], owner: nn.Module | None = None) -> torch.Tensor | None:
    """The checkpoint tensor for parameter `name`, fusing per-expert tensors when the model
    holds experts fused (transformers 5) in the layout of its experts module `owner`
    (tfcompile/families/experts.py: v5 [E, 2I, H] halves, GPT-OSS [E, H, 2I] interleaved)."""
    if name in names:
        return ckpt.get(name)
    m = re.fullmatch(r"(.*\.experts)\.(gate_up_proj|down_proj)(_bias)?", name)
    if not m:
        return None
    base, kind, bias = m.groups()
    n = sum(1 for x in names if re.fullmatch(re.escape(base) + r"\.\d+\.down_proj\.weight", x))
    if n == 0 or (bias and f"{base}.0.down_proj.bias" not in names):
        return None
    leaf = "bias" if bias else "weight"
    parts = {p: [ckpt.get(f"{base}.{e}.{p}.{leaf}") for e in range(n)] for p in PROJS}
    layout = module_layout(owner) if owner is not None else V5
    fused = fuse_bias(parts, layout) if bias else fuse_weight(parts, layout)
    return fused[kind]


def bind(module: nn.Module, ckpt, dtype: torch.dtype, prefix: str = "", skip: str | None = None,
         device: torch.device | str = "cpu") -> None:
    """Point `module`'s parameters at checkpoint views (copies when the dtype differs, or on
    another device than the CPU).

    Tied parameters (one Parameter under several names, e.g. lm_head and the
    embeddings) are bound together from whichever name the checkpoint has."""
    names = set(ckpt.names())
    for group in tied_groups(module):
        if skip and all((prefix + n).startswith(skip) for n in group):
            continue
        found = group_tensor(module, group, ckpt, names, prefix)
        if found is None:
            continue  # not in the checkpoint: stays on meta; using it raises (-> Unsupported)
        name, t = found
        want = parameter(module, name).shape
        if tuple(t.shape) != tuple(want):
            raise Unsupported(f"{prefix + name}: checkpoint shape {list(t.shape)}, model {list(want)}")
        # no copy when dtype and device already match: the parameter is the checkpoint's view
        set_parameter(module, group, nn.Parameter(t.to(device=device, dtype=dtype), requires_grad=False))


def tied_groups(module: nn.Module, meta_only: bool = False) -> list[list[str]]:
    """`module`'s parameter names grouped by Parameter: tied ones (lm_head and the embeddings) in
    one group; `meta_only`: only the parameters still on the meta device."""
    tied: dict[int, list[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if not meta_only or p.is_meta:
            tied.setdefault(id(p), []).append(name)
    return list(tied.values())


def group_tensor(module: nn.Module, group: list[str], ckpt, names: set[str], prefix: str = ""):
    """(name, checkpoint tensor) for the first of a tied group's names the checkpoint has, or None."""
    return next(((n, t) for n in group
                 if (t := tensor_for(ckpt, prefix + n, names, param_owner(module, n)[0])) is not None), None)


def parameter(module: nn.Module, name: str) -> nn.Parameter:
    owner, attr = param_owner(module, name)
    return owner._parameters[attr]


def set_parameter(module: nn.Module, group: list[str], param: nn.Parameter) -> None:
    """Bind every name of a tied group to one Parameter."""
    for n in group:
        owner, attr = param_owner(module, n)
        owner._parameters[attr] = param


def unbind(module: nn.Module) -> None:
    """Every parameter of `module` back on the meta device (its memory, or mapped pages, let go)."""
    for name, p in list(module.named_parameters()):
        owner, attr = param_owner(module, name)
        owner._parameters[attr] = nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                               requires_grad=False)


def param_owner(module: nn.Module, name: str) -> tuple[nn.Module, str]:
    *path, attr = name.split(".")
    for part in path:
        module = getattr(module, part)
    return module, attr
