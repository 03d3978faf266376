"""Runs inside the vLLM venv (scripts/vllm_env.sh), never imports tfcompile: vLLM is the oracle.

    python vllm_driver.py inspect DIR [DIR ...]    -> one JSON object per artifact (a list)
    python vllm_driver.py generate PROMPTS.json DIR [DIR ...]
        -> one {"tokens": [[...]], "logprobs": [[{id: lp}]]} per artifact (a list)
    python vllm_driver.py nvfp4-qdq IN.pt OUT.pt   -> vLLM's NVFP4 activation QDQ of each input

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

from vllm_standins import STANDINS, install_standins, torchvision_standin  # noqa: E402


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
             "prefix": getattr(m, "prefix", None),
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


def _mtp_layers(path: str) -> int:
    """MTP layers the checkpoint's config.json declares (DeepSeek / GLM: num_nextn_predict_layers,
    Qwen3.5: mtp_num_hidden_layers, in text_config for the multimodal wrapper) and carries: the
    configs of checkpoints without them declare them too (transformers' default is 1), and serving
    one of those without speculative decoding is what a user does."""
    import glob

    from safetensors import safe_open

    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    text = cfg.get("text_config") or cfg
    n = int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0)
    prefix = "mtp." if text.get("mtp_num_hidden_layers") else f"model.layers.{text.get('num_hidden_layers')}."
    for f in glob.glob(os.path.join(path, "*.safetensors")):
        with safe_open(f, "pt") as st:
            if n and any(k.startswith(prefix) for k in st.keys()):
                return n
    return 0


def _mtp_name(name: str) -> str:
    """A draft (MTP) model's module as the checkpoint names it: DeepSeek / GLM nest the decoder block
    under `model.layers.L.mtp_block.` (deepseek_mtp.py `_rewrite_spec_layer_name`)."""
    return name.replace(".mtp_block.", ".")


def _hf_to_vllm(model, tensors) -> dict:
    """Checkpoint module -> the vLLM module its weight goes to, by the model's own `hf_to_vllm_mapper`
    (e.g. Qwen3.5-MoE's `model.language_model.` -> `language_model.model.`); names it drops (the MTP
    layers, loaded by the draft model) stay as they are."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is None:
        return {}
    out = {}
    for module in {t["name"].rsplit(".", 1)[0] for t in tensors}:
        mapped = mapper.map_name(module + ".weight")
        out[module] = mapped.removesuffix(".weight") if mapped else module
    return out


def _experts_name(m) -> str:
    """A draft's RoutedExperts under its quant-config prefix (`layer_name`, the FusedMoE's `...mlp.experts`)."""
    return f"{m.layer_name}.routed_experts"


def _load(loader, vc, mc, rep: dict, draft: bool) -> None:
    """Build `mc`'s model (the target, or the MTP draft), run its loaders, record into rep."""
    import torch

    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_default_torch_dtype(mc.dtype), torch.device("cpu"):
        model = loader.create_model(vllm_config=vc, model_config=mc)
        state = _record_loading(model, loader)
        loader.load_weights(model, mc)
        scales, errors = _pre_process_snapshot(model), _process(model, mc)
    # the draft's modules under the checkpoint's names: its Linears' quant-config prefix (Qwen3.5's
    # MTP module is `model.layers.0` in vLLM, `mtp.layers.0` in the checkpoint and the ignore list)
    rename = _mtp_name if draft else (lambda n: n)
    linears = {rename((v["prefix"] if draft else None) or n): v for n, v in _linears(model).items()}
    experts = {rename(_experts_name(m) if draft else n): type(m.quant_method).__name__
               for n, m in model.named_modules() if type(m).__name__ == "RoutedExperts" and hasattr(m, "quant_method")}
    served = {rename(n): v for n, v in _pre_process_snapshot(model).items()}
    if draft:  # the draft's own Linears, loader calls and errors join the target's
        rep["mtp"] = {"model_class": type(model).__name__, "linears": sorted(linears),
                      "tensors_loaded": sorted({c["tensor"] for c in state["calls"]})}
        rep["calls"] += state["calls"]
        rep["process_errors"].update({rename(n): e for n, e in errors.items()})
        for k, v in (("linears", linears), ("experts", experts), ("served_scales", served)):
            rep[k].update({n: x for n, x in v.items() if n not in rep[k]})
        return
    rep["hf_to_vllm"] = _hf_to_vllm(model, state["tensors"])
    rep.update(model_class=type(model).__name__, loaded=True, process_errors=errors, loaded_scales=scales,
               packed_modules_mapping=_packed(model),
               tensors=state["tensors"], calls=state["calls"], linears=linears, attention=_attention(model),
               experts=experts, served_scales=served)


def _packed(model) -> dict:
    """The fused layers of the model and of the models it wraps (Kimi K2.5's `language_model` is a
    DeepseekV2ForCausalLM with its own packed_modules_mapping; the wrapper declares none)."""
    out: dict = {}
    for m in model.modules():
        for k, v in (getattr(m, "packed_modules_mapping", None) or {}).items():
            out.setdefault(k, list(v))
    return out


def inspect_one(path: str, **engine_kw) -> dict:
    """One artifact; with MTP layers declared, the MTP draft model vLLM's `speculative_config`
    {"method": "mtp"} builds is loaded too (its model class, its loaders, its quant config)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    STANDINS.clear()
    rep: dict = {"path": path}
    try:
        mtp = _mtp_layers(path)
        if mtp:
            engine_kw.setdefault("speculative_config", {"method": "mtp", "num_speculative_tokens": mtp})
        vc = _engine_config(path, **engine_kw)
        with set_current_vllm_config(vc):
            _init_dist(vc)
            loader = get_model_loader(vc.load_config)
            qc = vc.quant_config
            rep["quant_config"] = type(qc).__name__ if qc is not None else None
            rep["kv_cache_scheme"] = getattr(qc, "kv_cache_scheme", None)
            _load(loader, vc, vc.model_config, rep, draft=False)
            if mtp:
                _load(loader, vc, vc.speculative_config.draft_model_config, rep, draft=True)
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
    """`req["engine"]`: extra LLM(...) arguments for every artifact, `req["engine_by_path"][path]` for one
    (e.g. speculative_config); with speculative decoding, vLLM's own spec-decode counters are returned."""
    engine = req.get("engine_by_path", {}).get(path, req.get("engine", {}))
    spec = bool(engine.get("speculative_config"))
    llm = LLM(model=path, dtype="bfloat16", max_model_len=req.get("max_model_len", 256), enforce_eager=True,
              seed=0, **({"disable_log_stats": False} if spec else {}), **engine)
    sp = SamplingParams(temperature=0.0, max_tokens=req["max_tokens"], logprobs=req.get("logprobs", 5),
                        ignore_eos=True)
    prompts = req["prompts"][path] if isinstance(req["prompts"], dict) else req["prompts"]
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], sp, use_tqdm=False)
    tokens, lps = [], []
    for o in outs:
        c = o.outputs[0]
        tokens.append(list(c.token_ids))
        lps.append([{str(t): float(v.logprob) for t, v in step.items()} for step in (c.logprobs or [])])
    out = {"path": path, "tokens": tokens, "logprobs": lps}
    if spec:  # vllm:spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens (counters)
        out["spec_decode"] = {m.name: m.value for m in llm.get_metrics()
                              if m.name.startswith("vllm:spec_decode") and hasattr(m, "value")}
    del llm
    return out


def nvfp4_qdq(src: str, dst: str) -> dict:
    """vLLM's own NVFP4 activation quantize-dequantize (nvfp4_emulation_utils.ref_nvfp4_quant_dequant,
    what its emulated W4A4 scheme runs on CPU) on each {"x": bf16 [M, K], "g": fp32 (1,)} of a
    torch.save'd dict; the results saved to dst under the same keys."""
    import torch

    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant

    cases = torch.load(src)
    torch.save({k: ref_nvfp4_quant_dequant(c["x"], c["g"].float(), 16) for k, c in cases.items()}, dst)
    return {"cases": sorted(cases)}


def _json_out(obj) -> None:
    os.write(_STDOUT, (json.dumps(obj) + "\n").encode())


def main(argv: list[str]) -> int:
    torchvision_standin()
    if len(argv) >= 2 and argv[0] == "inspect":
        install_standins()
        _json_out([inspect_one(p) for p in argv[1:]])
        return 0
    if len(argv) >= 3 and argv[0] == "generate":
        req = json.loads(open(argv[1]).read())
        _json_out([generate(p, req) for p in argv[2:]])
        return 0
    if len(argv) == 3 and argv[0] == "nvfp4-qdq":
        _json_out(nvfp4_qdq(argv[1], argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


# vLLM logs on stdout: the JSON result goes to the real stdout, everything else to stderr
_STDOUT = os.dup(1)
os.dup2(2, 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
