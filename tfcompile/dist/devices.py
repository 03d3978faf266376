"""`--device auto|cpu|cuda|cuda:N`: where a pass's heavy math runs.

`auto` is CUDA when torch sees a GPU, else the CPU. Under torchrun `cuda` (and `auto` on a GPU
machine) means this rank's GPU, `cuda:LOCAL_RANK`. What runs there, per pass: calibration's
decoder layer, its activations, observers and fp32 Hessians; the GPTQ solve; the AWQ loss
search; distillation; evaluation. The packed bytes are always encoded by the formats reference
on values brought back to the CPU (tfcompile.kernels.formats), so a weight and its scales give
the same bytes whichever device did the math before (docs/distributed.md).
"""

from __future__ import annotations

import contextlib
import re

import torch

from tfcompile.errors import RecipeError, UserError

DEVICE_RE = re.compile(r"auto|cpu|cuda(:\d+)?")


def check_device(spec: str, where: str) -> None:
    """Recipe-time check of a `device` setting (no CUDA needed)."""
    if not DEVICE_RE.fullmatch(spec):
        raise RecipeError(f"{where} {spec!r} is not auto, cpu, cuda or cuda:N",
                          hint="--device auto (GPU when present), cpu, cuda or cuda:0")


def resolve_device(spec: str, world=None) -> torch.device:
    """The torch.device for `spec` on this rank; a clear error when CUDA is asked for and absent."""
    index = cuda_index(spec, world)
    if index is None:
        return torch.device("cpu")
    torch.cuda.set_device(index)
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 statistics stay fp32 (Hessians, GPTQ)
    return torch.device("cuda", index)


def cuda_index(spec: str, world=None) -> int | None:
    """The CUDA device `spec` means on this rank (None: the CPU); UserError when it names a device
    this machine does not have. Run for every pass's `device` at the start of a run, so `--device
    cuda:99` is refused even when no pass ends up using the device."""
    check_device(spec, "--device")
    local = world.local_rank if world is not None and world.distributed else 0
    if spec == "cpu" or (spec == "auto" and not torch.cuda.is_available()):
        return None
    if not torch.cuda.is_available():
        raise UserError(f"--device {spec}: torch sees no CUDA device (torch {torch.__version__}, "
                        f"CUDA build: {torch.version.cuda or 'no'})",
                        hint="use --device cpu (or auto), or install a CUDA build of torch on a GPU machine")
    index = int(spec.split(":")[1]) if ":" in spec else local
    if index >= torch.cuda.device_count():
        raise UserError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) visible",
                        hint="check CUDA_VISIBLE_DEVICES and --nproc-per-node")
    return index


@contextlib.contextmanager
def one_torch_thread(on: bool = True):
    """One torch intra-op thread inside the block when `on` (the old count restored after): for
    CPU work made of many small ops, where an OpenMP team spinning on a busy core costs more than
    it gives, and for math whose bits depend on the thread count (the callers say which)."""
    old = torch.get_num_threads()
    if on:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)
