"""Stand-ins for what vLLM 0.32's CPU build lacks, installed by vllm_driver.py (runs in vLLM's venv,
never imports tfcompile). Each replaces something that computes (a GEMM kernel, an attention backend,
an image transform), never a loader, a parameter or a shape, and records why it was needed (STANDINS,
reported per artifact), so that vLLM's own model classes, quantization config and weight loaders
still run on every artifact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

STANDINS: list[str] = []  # why each stand-in was needed (the kernel factory's message, first line)


class StandInKernel:
    """Replaces a GEMM kernel vLLM's CPU build lacks: loads nothing, transforms nothing, never runs."""

    def __init__(self, kind: str, reason: str):
        self.kind, self.reason = kind, reason

    def input_quant_key(self):
        return None

    def process_weights_after_loading(self, layer):
        return None

    def apply_weights(self, *a, **k):
        raise RuntimeError(f"stand-in {self.kind} kernel: vLLM's CPU build has none ({self.reason})")


_REFUSALS = (ValueError, NotImplementedError, RuntimeError, AssertionError)


def _wrap(module, name: str, fallback) -> None:
    """module.name(...) as vLLM calls it; where it raises (no kernel for this platform), the reason is
    recorded and fallback(reason) is returned instead."""
    real = getattr(module, name)
    if getattr(real, "_tfcompile_standin", False):
        return

    def wrapped(*args, **kwargs):
        try:
            out = real(*args, **kwargs)
        except _REFUSALS as e:
            reason = str(e).strip().splitlines()[0][:200]
            STANDINS.append(f"{name}: {reason}")
            out = fallback(reason)
        try:  # what the scheme asked of the kernel (e.g. the MXFP4 activation key): reported per layer
            out._tfcompile_args = {k: str(v) for k, v in kwargs.items() if "quant_key" in k or k == "use_a16"}
        except AttributeError:
            pass
        return out

    wrapped._tfcompile_standin = True
    setattr(module, name, wrapped)


def _static_fp8_quant_standin() -> None:
    """`_C::static_scaled_fp8_quant` is a placeholder in the CPU build; vLLM calls it to requantize
    fused per-tensor FP8 shards to the group's largest scale (w8a8_utils.requantize_with_max_scale).
    Plain torch, the CUDA kernel's arithmetic: x / scale in fp32, clamped to +-448, cast to E4M3."""
    import torch
    from vllm import _custom_ops as ops

    real = ops.scaled_fp8_quant
    if getattr(real, "_tfcompile_standin", False):
        return

    def scaled_fp8_quant(input, scale=None, *args, **kwargs):
        if scale is None or scale.numel() != 1 or input.device.type != "cpu":
            return real(input, scale, *args, **kwargs)
        STANDINS.append("scaled_fp8_quant: static per-tensor FP8 quantize in plain torch (CPU build has none)")
        q = (input.float() / scale.float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        return q, scale

    scaled_fp8_quant._tfcompile_standin = True
    ops.scaled_fp8_quant = scaled_fp8_quant


class StandInMoeBackend:
    """What a `select_*_moe_backend` returns when the CPU build has no fused-MoE kernel for a scheme:
    equal to no real backend, so create_weights takes its generic path; processing it fails (recorded)."""

    value = "STAND-IN"

    def __repr__(self):
        return "StandInMoeBackend"


def install_standins() -> None:
    import importlib

    _static_fp8_quant_standin()
    _sparse_attention_standin()
    moe = "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    for mod in ("compressed_tensors_moe_w4a4_nvfp4", "compressed_tensors_moe_w4a4_mxfp4",
                "compressed_tensors_moe_w8a8_mxfp8", "compressed_tensors_moe_w8a8_fp8"):
        m = importlib.import_module(moe + mod)
        for name in [n for n in dir(m) if n.startswith("select_") and n.endswith("_moe_backend")]:
            _wrap(m, name, lambda reason: (StandInMoeBackend(), None))

    base = "vllm.model_executor.layers.quantization.compressed_tensors.schemes."
    for mod, fn in (("compressed_tensors_w4a4_nvfp4", "init_nvfp4_linear_kernel"),
                    ("compressed_tensors_w4a4_mxfp4", "init_mxfp4_linear_kernel"),
                    ("compressed_tensors_w8a8_mxfp8", "init_mxfp8_linear_kernel"),
                    ("compressed_tensors_w8a8_fp8", "init_fp8_linear_kernel")):
        _wrap(importlib.import_module(base + mod), fn, lambda reason, fn=fn: StandInKernel(fn, reason))


def _sparse_attention_standin() -> None:
    """DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-5): the CPU platform refuses any sparse attention
    backend ("Sparse Attention is not supported on CPU.", platforms/cpu.py get_attn_backend_cls)
    before the model is built. The stand-in asks for the dense MLA backend in its place: the MLA and
    indexer modules, their parameters and loaders are built as on a GPU; the backend never runs.
    The stand-in names CPU_MLA: on a CPU with AMX tiles the platform otherwise picks AMX_MLA, whose
    impl passes the sparse layer's `topk_indices_buffer` on to MLACommonImpl.__init__, which refuses
    it (vllm/v1/attention/backends/mla/amx_mla.py; cpu_mla.py takes it in **mla_args)."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    real = CpuPlatform.get_attn_backend_cls.__func__
    if getattr(real, "_tfcompile_standin", False):
        return

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, *args, **kwargs):
        if attn_selector_config.use_sparse:
            STANDINS.append("attention backend: sparse (DSA) MLA has no CPU backend; the dense CPU MLA "
                            "backend stands in (never run)")
            attn_selector_config = attn_selector_config._replace(use_sparse=False)
            selected_backend = AttentionBackendEnum.CPU_MLA
        return real(cls, selected_backend, attn_selector_config, *args, **kwargs)

    get_attn_backend_cls._tfcompile_standin = True
    CpuPlatform.get_attn_backend_cls = classmethod(get_attn_backend_cls)


_TV_HOOK = """
import importlib.abc, importlib.util, sys

_NAME = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


class _PilQwen2VL(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # tests/engines/vllm_standins.py: the torchvision image processor module, served by the PIL one
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname == _NAME else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

        module.__dict__.update({k: v for k, v in vars(pil).items() if not k.startswith("__")})
        module.Qwen2VLImageProcessor = pil.Qwen2VLImageProcessorPil
        module.__all__ = ["Qwen2VLImageProcessor"]


try:
    import torchvision  # noqa: F401
except Exception:
    sys.meta_path.insert(0, _PilQwen2VL())
"""


def torchvision_standin() -> None:
    """vLLM's Qwen3-VL / Qwen3.5 model files import transformers' Qwen2-VL image processor module,
    which imports torchvision at module level; no torchvision build runs beside torch 2.13.0+cpu
    (scripts/vllm_env.sh removes it). Where torchvision does not import, that one module is served by
    transformers' own PIL image processor (`Qwen2VLImageProcessorPil`, same preprocessing, no
    torchvision), in this process and, through a sitecustomize on PYTHONPATH, in the subprocess vLLM
    inspects model classes in. Nothing else changes: the model classes, layers and loaders are vLLM's."""
    root = Path(tempfile.mkdtemp(prefix="tfcompile-vllm-standin-"))
    (root / "sitecustomize.py").write_text(_TV_HOOK)
    exec(compile(_TV_HOOK, str(root / "sitecustomize.py"), "exec"), {"__name__": "tfcompile_tv_standin"})
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
