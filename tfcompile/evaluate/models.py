"""Build the models `tfcompile eval` compares, as transformers modules.

- the reference, and a plain checkpoint given as MODEL: transformers'
  `from_pretrained` (safetensors only, no remote code), after tfcompile's own
  checkpoint validation (headers parsed, pickle files refused);
- a tfcompile artifact: the architecture of its config.json (without
  `quantization_config`) built by transformers, every non-quantized tensor
  loaded from the artifact, every quantized Linear's weight replaced by
  `tfcompile.kernels.formats.dequantize` of the stored tensors, the
  scheme's activation quantization emulated by forward pre-hooks (fused MoE experts: expert by
  expert, each input with its expert's own scale, calibration/moe.py), and, for an
  artifact with a `kv_cache_scheme`, the FP8 KV cache emulated in attention
  (kvcache.py; `--kv-cache off` turns that off).

The multi-token-prediction layers an artifact keeps (families/mtp.py) are not part of the module
transformers builds: they are left out here and read by tfcompile.draft.mtp_load when `eval
--draft mtp` measures them.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tfcompile.artifact.manifest import MANIFEST, has_manifest, load_manifest
from tfcompile.artifact.naming import ct_outputs, layer_scheme, qtensor_of, static_input_scale
from tfcompile.calibration.moe import MoERecorder
from tfcompile.evaluate.actquant import ActFn, act_quantizer, pre_hook
from tfcompile.evaluate.errors import EvalError
from tfcompile.evaluate.kvcache import KINDS, KV_MODES, KVEmulator, KVScales, install, read_kv_scales
from tfcompile.families.experts import set_expert, set_expert_bias
from tfcompile.families.mtp import is_mtp, mtp_prefixes
from tfcompile.families.names import NameMap
from tfcompile.io.checkpoint import Checkpoint, open_checkpoint
from tfcompile.io.hf_config import load_hf_config, transformers_class
from tfcompile.io.jsonfile import JsonDict
from tfcompile.io.sources.model import is_published, load_decoded_model
from tfcompile.kernels.formats import dequantize
from tfcompile.rotate import online
from tfcompile.schemes import Scheme, get_scheme
_EXPERT = re.compile(r"^(?P<parent>.*experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")
_EXPERT_BIAS = re.compile(r"^(?P<parent>.*experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.bias$")


@dataclass
class QLinear:
    """One quantized Linear of the candidate: its module, dequantized weight and activation emulation."""
    name: str
    module: nn.Linear
    act: ActFn | None
    # equal keys = the same activation quantizer (kind and stored scale): Linears that read one
    # input (q/k/v, gate/up) then quantize it once for the per-layer SQNR (metrics.LayerSQNR)
    act_key: tuple | None = None


@dataclass
class Candidate:
    model: nn.Module
    kind: str  # "artifact" | "checkpoint"
    scheme: Scheme | None
    linears: dict[str, QLinear] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    kv_scales: KVScales | None = None  # the artifact's FP8 KV-cache scales (None: not quantized)
    kv: KVEmulator | None = None  # installed emulation (None: off, or nothing to emulate)
    experts: Any = None  # calibration.moe.MoERecorder emulating per-expert activation quantization


def _transformers():
    import transformers  # lazy: transformers (~2 s to import); only when a model is built

    transformers.utils.logging.disable_progress_bar()  # stderr belongs to our reporter
    transformers.utils.logging.set_verbosity_error()
    return transformers


def _arch_class(path: Path, cfg):
    arch = (getattr(cfg, "architectures", None) or [None])[0]
    _transformers()  # its logging set up
    cls = transformers_class(arch)
    if cls is None:
        raise EvalError(f"{path}/config.json: architecture {arch!r} is not in transformers",
                        hint="tfcompile eval builds models with transformers (no remote code); "
                             "evaluate a transformers architecture")
    return cls


def load_checkpoint_model(path: Path, dtype: torch.dtype, role: str) -> nn.Module:
    """A plain Hugging Face checkpoint via transformers (validated first by tfcompile.io)."""
    path = Path(path)
    what = ("the original Hugging Face checkpoint directory the artifact was quantized from"
            if role == "reference" else "a Hugging Face checkpoint directory or a tfcompile artifact")
    if not path.exists():
        raise EvalError(f"{role} {path} does not exist", hint=f"pass {what}")
    if role == "reference" and has_manifest(path):
        raise EvalError(f"reference {path} is a tfcompile artifact", hint=f"pass {what}")
    ckpt = open_checkpoint(path)  # CheckpointError (a UserError) for anything unusable
    ckpt.close()
    if role == "reference" and is_published(ckpt.config):  # DeepSeek FP8, GPT-OSS MXFP4, ... as published
        return load_decoded_model(path, dtype)
    if "quantization_config" in ckpt.config:
        raise EvalError(f"{role} {path} has a quantization_config but no {MANIFEST}: it is "
                        f"quantized, but not a tfcompile artifact",
                        hint="evaluate an artifact written by `tfcompile quantize`, or a "
                             "bf16/fp16/fp32 checkpoint")
    cfg = load_hf_config(path)  # CheckpointError for a config transformers cannot read
    cls = _arch_class(path, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls.from_pretrained(path, dtype=dtype, trust_remote_code=False, use_safetensors=True)
    return model.eval()


def load_candidate(path: Path, dtype: torch.dtype, kv_cache: str = "auto",
                   manifest: JsonDict | None = None, act_as: dict[str, str] | None = None) -> Candidate:
    """MODEL_OR_ARTIFACT: a tfcompile artifact (dequantized + emulated) or a checkpoint (as is).

    kv_cache: "auto" emulates the artifact's FP8 KV cache when it has one, "off" never does.
    act_as: {written format: format whose activation emulation runs instead} (what an engine serves:
    artifact/engines.py `served_activations`); the weights are always the artifact's.
    manifest: the artifact's manifest when it is not on disk yet (`quantize --eval` evaluates
    the staged artifact before the manifest is written); None reads it."""
    if kv_cache not in KV_MODES:
        raise EvalError(f"unknown --kv-cache {kv_cache!r}", hint="choose one of: " + ", ".join(KV_MODES))
    path = Path(path)
    if manifest is None and not has_manifest(path):
        return Candidate(load_checkpoint_model(path, dtype, "model"), "checkpoint", None)
    manifest = load_manifest(path) if manifest is None else manifest
    scheme = get_scheme(manifest["scheme"]["name"])
    ckpt = open_checkpoint(path)
    try:
        cand = _build_artifact(path, ckpt, manifest, scheme, dtype, act_as or {})
    finally:
        ckpt.close()
    if cand.kv_scales is not None and kv_cache == "auto":
        cand.kv = install(cand.model, cand.kv_scales)
    return cand


def _build_artifact(path: Path, ckpt: Checkpoint, manifest: dict, scheme: Scheme,
                    dtype: torch.dtype, act_as: dict[str, str]) -> Candidate:
    cfg = load_hf_config(path)  # CheckpointError for a config transformers cannot read
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    cls = _arch_class(path, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls._from_config(cfg, dtype=dtype).eval()
    cand = Candidate(model, "artifact", scheme)
    mtp = mtp_prefixes(ckpt.config)  # the MTP layers: no module of `model` (tfcompile.draft.mtp reads them)
    entries = [la for la in manifest.get("layers", []) if not is_mtp(la["module"], mtp)]
    layers = {la["module"]: tuple(la["shape"]) for la in entries}
    schemes = {la["module"]: layer_scheme(la, scheme) for la in entries}  # mixed precision
    qnames = {s.name for m, (n, k) in layers.items() for s in ct_outputs(schemes[m], m, n, k, torch.bfloat16)}
    missing = sorted(q for q in qnames if q not in set(ckpt.names()))
    if missing:
        raise EvalError(f"{path}: quantized tensor {missing[0]} is missing ({len(missing)} in all)",
                        hint=f"check the artifact with `tfcompile verify {path}`")
    kv_names = {f"{m}.{k}" for m in manifest.get("kv_modules", []) for k in KINDS}
    cand.kv_scales = read_kv_scales(path, ckpt, ckpt.config, list(manifest.get("kv_modules", [])))
    names = NameMap(model, ckpt.names())  # checkpoint -> in-memory names (Qwen2.5-VL's language_model.)
    plain = [n for n in ckpt.names() if n not in qnames | kv_names and not is_mtp(n, mtp)]
    loaded = _load_plain(path, ckpt, model, [n for n in plain if not _EXPERT_BIAS.match(n)], names)
    modules = dict(model.named_modules())
    loaded |= _load_expert_biases(ckpt, modules, [n for n in plain if _EXPERT_BIAS.match(n)], names)
    expert_acts: dict[str, ActFn] = {}  # per-expert Linear (model names) -> its input quantization
    transforms = _online_transforms(path, ckpt)  # the engine's x R before the activations' quantization
    for name, (n, k) in sorted(layers.items()):
        w = dequantize(qtensor_of(ckpt, schemes[name], name, n, k), torch.float32)
        served = get_scheme(act_as[schemes[name].name]) if schemes[name].name in act_as else schemes[name]
        act = _act_fn(ckpt, served, name)
        key = _act_key(ckpt, served, name) if act is not None else None
        act, key = _with_transform(act, key, online.module_order(transforms, name))
        name = names.to_model(name)
        mod = modules.get(name)
        if isinstance(mod, nn.Linear):
            if tuple(mod.weight.shape) != (n, k):
                raise EvalError(f"{path}: {name} is {n}x{k} in the artifact but "
                                f"{tuple(mod.weight.shape)} in the architecture",
                                hint=f"check the artifact with `tfcompile verify {path}`")
            with torch.no_grad():
                mod.weight.copy_(w)
            loaded.add(f"{name}.weight")
            if act is not None:
                mod.register_forward_pre_hook(pre_hook(act))
            cand.linears[name] = QLinear(name, mod, act, key)
        elif (m := _EXPERT.match(name)) and hasattr(modules.get(m["parent"]), "gate_up_proj"):
            set_expert(modules[m["parent"]], int(m["e"]), m["proj"], w)
            loaded.add(f"{m['parent']}.{'down_proj' if m['proj'] == 'down_proj' else 'gate_up_proj'}")
            if act is not None and m["proj"] != "up_proj":  # gate and up share one input (and scale)
                expert_acts[name] = act
        else:
            raise EvalError(f"{path}: quantized module {name} is not a Linear of {cls.__name__}",
                            hint="the artifact does not match its config.json architecture; rebuild it")
    if expert_acts:  # fused experts run expert by expert, each input quantized with its own scale
        cand.experts = MoERecorder(model, lambda name, x: None, impl="tfcompile_moe_act_emulation",
                                   transform=lambda name, x: expert_acts[name](x) if name in expert_acts else x)
    _check_complete(path, model, loaded)
    return cand


def _online_transforms(path: Path, ckpt: Checkpoint) -> list:
    """config.json's online input transforms (quantization_config.transform_config, what vLLM applies:
    tfcompile/rotate/online.py); EvalError for one this emulation does not reproduce."""
    try:
        return online.input_transforms(ckpt.config.get("quantization_config"))
    except online.UnsupportedTransform as e:
        raise EvalError(f"{path}: {e}", hint="tfcompile eval emulates the block-Hadamard transform tfcompile "
                                             "writes (quantize.online_hadamard); score this artifact in its engine") from None


def _with_transform(act: ActFn | None, key: tuple | None, order: int) -> tuple[ActFn | None, tuple | None]:
    """The Linear's input treatment with the online transform x R (order b) before it: Q_a(x R)."""
    if not order:
        return act, key
    if act is None:
        return (lambda x: online.transform_inputs(x, order)), ("online_hadamard", order)
    return (lambda x: act(online.transform_inputs(x, order))), (key, "online_hadamard", order)


def _act_fn(ckpt: Checkpoint, scheme: Scheme, m: str) -> ActFn | None:
    return act_quantizer(scheme.act, m, static_input_scale(ckpt, scheme, m))


def _act_key(ckpt: Checkpoint, scheme: Scheme, m: str) -> tuple:
    """(activation kind, the stored scale's values): what makes two Linears' emulations equal."""
    scale = static_input_scale(ckpt, scheme, m)
    return scheme.act, None if scale is None else tuple(scale.detach().float().flatten().tolist())


def _load_plain(path: Path, ckpt: Checkpoint, model: nn.Module, names: list[str], rename: NameMap) -> set[str]:
    """Copy the artifact's non-quantized tensors (embeddings, norms, lm_head...) into the model."""
    state = {rename.to_model(n): ckpt.get(n) for n in names}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = model.load_state_dict(state, strict=False)
    if result.unexpected_keys:
        extra = sorted(result.unexpected_keys)
        raise EvalError(f"{path}: tensor {extra[0]} is not a parameter of the architecture "
                        f"({len(extra)} such tensors)",
                        hint="the artifact's tensor names do not match config.json; rebuild it")
    return set(state)


def _load_expert_biases(ckpt: Checkpoint, modules: dict, names: list[str], rename: NameMap) -> set[str]:
    """Per-expert biases (GPT-OSS: `experts.{e}.gate_proj.bias` ...) into the fused bias parameters."""
    loaded = set()
    for n in names:
        m = _EXPERT_BIAS.match(rename.to_model(n))
        mod = modules[m["parent"]]
        fused = "down_proj_bias" if m["proj"] == "down_proj" else "gate_up_proj_bias"
        b = ckpt.get(n)
        set_expert_bias(mod, int(m["e"]), m["proj"], b)
        loaded.add(f"{m['parent']}.{fused}")
    return loaded


def _check_complete(path: Path, model: nn.Module, loaded: set[str]) -> None:
    """Every parameter/persistent buffer came from the artifact (tied aliases count once)."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    missing = sorted(names[0] for names in groups.values() if not loaded.intersection(names))
    state = set(model.state_dict())
    missing += sorted(n for n, _ in model.named_buffers() if n in state and n not in loaded)
    if missing:
        raise EvalError(f"{path}: the artifact has no tensor for {missing[0]} ({len(missing)} missing)",
                        hint=f"check the artifact with `tfcompile verify {path}`")
