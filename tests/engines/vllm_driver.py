"""Runs inside the vLLM venv (scripts/vllm_env.sh), never imports tfcompile: vLLM is the oracle.

    python vllm_driver.py inspect DIR [DIR ...]    -> one JSON object per artifact (a list)
    python vllm_driver.py generate PROMPTS.json DIR [DIR ...]
        -> one {"tokens": [[...]], "logprobs": [[{id: lp}]]} per artifact (a list)

`inspect` builds each artifact's model the way vLLM's engine does (EngineArgs ->
VllmConfig -> DefaultModelLoader.load_model: vLLM's CompressedTensorsConfig, its model
class, its fused layers, create_weights and weight loaders, process_weights_after_loading),
without the engine around it, and reports per Linear the scheme vLLM chose, every
checkpoint tensor and the vLLM parameter each loader call wrote it into. Where the CPU
build has no kernel for a scheme (NVFP4, MXFP4, MXFP8, some FP8), the kernel factory's
ValueError is recorded and a stand-in that cannot run takes its place, so the loaders
still run: the stand-in only replaces the GEMM, never a loader or a shape.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

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


_DIST = {"ready": False}


def _engine_config(path: str, **kw):
    from vllm.engine.arg_utils import EngineArgs

    args = dict(model=path, dtype="bfloat16", max_model_len=256, enforce_eager=True, seed=0,
                trust_remote_code=False)
    args.update(kw)
    return EngineArgs(**args).create_engine_config()


def _init_dist(vc) -> None:
    """One gloo world of 1 for the process; the model-parallel groups per artifact (vLLM creates the
    expert-parallel group only for the MoE config current at initialize_model_parallel)."""
    import tempfile

    from vllm.distributed import (destroy_model_parallel, init_distributed_environment,
                                  initialize_model_parallel)

    if not _DIST["ready"]:
        init = "file://" + tempfile.mktemp(prefix="vllm-dist-")
        init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=init,
                                     backend="gloo")
        _DIST["ready"] = True
    else:
        destroy_model_parallel()
    initialize_model_parallel(1, 1)


def _dtype(t) -> str:
    return str(t).removeprefix("torch.")


def _record_loading(model, loader):
    """Wrap the checkpoint iterator and every parameter's weight loader: who wrote what."""
    import functools

    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    names = {id(p): n for n, p in model.named_parameters()}
    state = {"current": None, "tensors": [], "calls": []}

    def wrap(loader_fn):
        @functools.wraps(loader_fn)
        def recorded(*args, **kwargs):
            param = args[0] if args else kwargs["param"]
            loaded = args[1] if len(args) > 1 else kwargs["loaded_weight"]
            shard = kwargs.get("shard_id", kwargs.get("loaded_shard_id"))
            if shard is None and len(args) > 2 and "expert_id" not in kwargs:
                shard = args[2]
            if "expert_id" in kwargs:
                shard = f"{kwargs['expert_id']}.{shard}"
            state["calls"].append({"tensor": state["current"], "param": names.get(id(param), "?"),
                                   "param_dtype": _dtype(param.dtype), "dtype": _dtype(loaded.dtype),
                                   "shape": list(loaded.shape), "shard": None if shard is None else str(shard)})
            return loader_fn(*args, **kwargs)
        return recorded

    for p in model.parameters():
        if hasattr(p, "_weight_loader"):  # BasevLLMParameter: the property reads _weight_loader
            p._weight_loader = wrap(p._weight_loader)
        else:
            p.weight_loader = wrap(getattr(p, "weight_loader", default_weight_loader))
    real = loader.get_all_weights

    def weights(*a, **k):
        for name, t in real(*a, **k):
            state["current"] = name
            state["tensors"].append({"name": name, "dtype": _dtype(t.dtype), "shape": list(t.shape)})
            yield name, t
        state["current"] = None

    loader.get_all_weights = weights
    return state


def _linears(model) -> dict:
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    out = {}
    for name, m in model.named_modules():
        if not isinstance(m, (LinearBase, ParallelLMHead)) and type(m).__name__ != "Linear":
            continue
        scheme = getattr(m, "scheme", None)
        d = {"class": type(m).__name__, "method": type(getattr(m, "quant_method", None)).__name__,
             "scheme": type(scheme).__name__ if scheme is not None else None,
             "shards": list(getattr(m, "output_sizes", []) or [])}
        if scheme is not None:
            d["a16"] = getattr(scheme, "use_a16", None)
            d["static_input"] = getattr(scheme, "is_static_input_scheme", None)
            wq = getattr(scheme, "weight_quant", None)
            d["strategy"] = str(getattr(wq, "strategy", None)) if wq is not None else None
            kern = getattr(scheme, "kernel", None) or getattr(scheme, "fp8_linear", None)
            d["kernel"] = type(kern).__name__ if kern is not None else None
            d["kernel_args"] = getattr(kern, "_tfcompile_args", {})
        out[name] = d
    return out


def _pre_process_snapshot(model) -> dict:
    """Per-shard scales as loaded, before process_weights_after_loading merges them (fused groups)."""
    import torch

    snap = {}
    for name, m in model.named_modules():
        if getattr(m, "scheme", None) is None:
            continue
        for p in ("weight_scale", "input_scale", "weight_global_scale", "input_global_scale"):
            t = getattr(m, p, None)
            if isinstance(t, torch.Tensor) and t.numel() <= 8:
                snap[f"{name}.{p}"] = [float(x) for x in t.detach().float().flatten()]
    return snap


def _attention(model) -> dict:
    out = {}
    for name, m in model.named_modules():
        if type(m).__name__ in ("Attention", "MLAAttention") and hasattr(m, "kv_cache_dtype"):
            qm = getattr(m, "quant_method", None)
            out[name] = {"class": type(m).__name__, "method": type(qm).__name__ if qm else None,
                         "kv_cache_dtype": str(m.kv_cache_dtype),
                         "k_scale": float(getattr(m, "_k_scale_float", 1.0)),
                         "v_scale": float(getattr(m, "_v_scale_float", 1.0))}
    return out


def _process(model, mc) -> dict:
    """vLLM's process_weights_after_loading (model_loader/utils.py), module by module, so that one
    module without a CPU kernel (e.g. "Unsupported FP8 MoE backend: NONE") does not hide the rest."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
    from vllm.model_executor.model_loader.utils import is_deferred_attention_layer

    errors = {}
    for name, module in model.named_modules():
        qm = getattr(module, "quant_method", None)
        try:
            if isinstance(qm, QuantizeMethodBase):
                qm.process_weights_after_loading(module)
        except Exception as e:  # noqa: BLE001 - recorded, per module
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    for name, module in model.named_modules():
        try:
            if is_deferred_attention_layer(module):
                module.process_weights_after_loading(mc.dtype)
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return errors


def inspect_one(path: str, **engine_kw) -> dict:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    STANDINS.clear()
    rep: dict = {"path": path}
    try:
        vc = _engine_config(path, **engine_kw)
        with set_current_vllm_config(vc):
            _init_dist(vc)
            import torch

            from vllm.utils.torch_utils import set_default_torch_dtype

            loader = get_model_loader(vc.load_config)
            mc = vc.model_config
            qc = vc.quant_config
            rep["quant_config"] = type(qc).__name__ if qc is not None else None
            rep["kv_cache_scheme"] = getattr(qc, "kv_cache_scheme", None)
            with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
                model = loader.create_model(vllm_config=vc, model_config=mc)
                rep["model_class"] = type(model).__name__
                rep["packed_modules_mapping"] = {k: list(v) for k, v in
                                                 getattr(model, "packed_modules_mapping", {}).items()}
                state = _record_loading(model, loader)
                loader.load_weights(model, mc)
                rep["loaded_scales"] = _pre_process_snapshot(model)
                rep["tensors"], rep["calls"] = state["tensors"], state["calls"]
                rep["loaded"] = True
                rep["process_errors"] = _process(model, mc)
            rep["linears"] = _linears(model)
            rep["attention"] = _attention(model)
            rep["experts"] = {n: type(m.quant_method).__name__ for n, m in model.named_modules()
                              if type(m).__name__ == "RoutedExperts" and hasattr(m, "quant_method")}
            rep["served_scales"] = _pre_process_snapshot(model)
    except Exception as e:  # the engine's refusal is a result, reported with its message
        rep["error"] = f"{type(e).__name__}: {e}"
        rep["traceback"] = traceback.format_exc()[-4000:]
    rep["standins"] = sorted(set(STANDINS))
    return rep


def generate(path: str, req: dict) -> dict:
    """LLM(...) as a user runs it (the issue's settings), greedy, top-k logprobs per step."""
    import gc

    from vllm import LLM, SamplingParams

    try:
        return _generate(LLM, SamplingParams, path, req)
    except Exception as e:  # the engine's refusal is a result
        return {"path": path, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
    finally:
        gc.collect()


def _generate(LLM, SamplingParams, path: str, req: dict) -> dict:
    llm = LLM(model=path, dtype="bfloat16", max_model_len=req.get("max_model_len", 256), enforce_eager=True,
              seed=0, **req.get("engine", {}))
    sp = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], logprobs=req.get("logprobs", 5),
                        ignore_eos=True)
    prompts = req["prompts"][path] if isinstance(req["prompts"], dict) else req["prompts"]
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], sp, use_tqdm=False)
    tokens, lps = [], []
    for o in outs:
        c = o.outputs[0]
        tokens.append(list(c.token_ids))
        lps.append([{str(t): float(v.logprob) for t, v in step.items()} for step in (c.logprobs or [])])
    del llm
    return {"path": path, "tokens": tokens, "logprobs": lps}


def _json_out(obj) -> None:
    os.write(_STDOUT, (json.dumps(obj) + "\n").encode())


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "inspect":
        install_standins()
        _json_out([inspect_one(p) for p in argv[1:]])
        return 0
    if len(argv) >= 3 and argv[0] == "generate":
        req = json.loads(open(argv[1]).read())
        _json_out([generate(p, req) for p in argv[2:]])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


# vLLM logs on stdout: the JSON result goes to the real stdout, everything else to stderr
_STDOUT = os.dup(1)
os.dup2(2, 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
