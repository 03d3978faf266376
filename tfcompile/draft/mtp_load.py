"""A model's MTP layer (draft/mtp.py) with its weights: from a checkpoint, or from an artifact as served.

The tensors are the checkpoint's (families/mtp.py): DeepSeek layout `model.layers.{N}.*` (N =
num_hidden_layers; DeepSeek-V3/V3.2, GLM-4.5/5): enorm, hnorm, eh_proj, shared_head.{norm,head}
and the decoder layer, whose names go under `block.` (vLLM deepseek_mtp.py
`_rewrite_spec_layer_name` puts them under `mtp_block.`); Qwen3.5 layout `mtp.*`: fc,
pre_fc_norm_embedding, pre_fc_norm_hidden, norm and `layers.0.*` (the decoder layer, under
`block.`), the logits from the target's own lm_head (vLLM qwen3_5_mtp.py loads the checkpoint's
`lm_head`). The token embedding is the target's own `embed_tokens`, not the layer's copy: vLLM's
vllm/v1/spec_decode/eagle.py `EagleProposer.load_model` replaces an MTP model's embed_tokens by the
target's ("Detected MTP model. Sharing target model embedding weights"); DeepSeek-V3's two copies
are equal, and quantize keeps both unquantized.
Routed experts, stored per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), are written into
the fused parameters of transformers' experts module (families/experts.set_expert).

From a tfcompile artifact: every MTP Linear the manifest lists is dequantized by tfcompile's own
decoder (`kernels.formats.dequantize`, as `tfcompile eval` builds the target), and the scheme's
activation quantization emulated (forward pre-hooks; routed experts expert by expert through
calibration.moe.MoERecorder, each with its own input scale), what the engine computes with the
quant config it builds `mtp_block` with. The FP8 KV cache of an artifact is not emulated in the
MTP layer (its k/v scales are read past).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from tfcompile.artifact.manifest import has_manifest, load_manifest
from tfcompile.artifact.naming import ct_outputs, layer_scheme, qtensor_of, static_input_scale
from tfcompile.calibration.moe import MoERecorder
from tfcompile.draft.mtp import DEEPSEEK, QWEN3_5, MTPLayer
from tfcompile.errors import UserError
from tfcompile.evaluate.actquant import act_quantizer, pre_hook
from tfcompile.families.experts import set_expert
from tfcompile.io.checkpoint import Checkpoint, open_checkpoint
from tfcompile.kernels.formats import dequantize
from tfcompile.schemes import get_scheme

# the MTP layer's own modules (DeepSeek layout, then Qwen3.5's); everything else is the decoder layer's
OWN = ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head", "fc", "pre_fc_norm_embedding",
       "pre_fc_norm_hidden", "norm")
QWEN_BLOCK = "layers.0."  # Qwen3.5's decoder layer under `mtp.`
_EXPERT = re.compile(r"^(?P<parent>.*experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)$")
_KV_SCALES = (".k_scale", ".v_scale")
_NO_MTP_HINT = ("--draft mtp measures a model's own multi-token-prediction layers (DeepSeek-V3/V3.2, "
                "GLM-4.5/5 ship one); for this model use --draft ngram or an EAGLE-3 draft (`tfcompile draft`)")


def mtp_layout(path: Path, config: dict) -> tuple[int, str, str]:
    """(N, layout, tensor prefix) of the (one) MTP layer config.json declares; UserError when there is none.
    N is the decoder-layer index the layer is built at (num_hidden_layers, as vLLM numbers it)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    k, q = text.get("num_nextn_predict_layers"), int(text.get("mtp_num_hidden_layers") or 0)
    if q:
        if q != 1:
            raise UserError(f"{path}/config.json: mtp_num_hidden_layers is {q}; --draft mtp measures one MTP layer",
                            hint="the published Qwen3.5 / Qwen3-Next checkpoints have one; measure those")
        return int(text["num_hidden_layers"]), QWEN3_5, "mtp."
    if not k:
        raise UserError(f"{path}/config.json declares no MTP layers (num_nextn_predict_layers is "
                        f"{'absent' if k is None else k})", hint=_NO_MTP_HINT)
    if int(k) != 1:
        raise UserError(f"{path}/config.json: num_nextn_predict_layers is {k}; --draft mtp measures one MTP layer",
                        hint="the published DeepSeek and GLM checkpoints have one; measure those")
    n = int(text["num_hidden_layers"])
    return n, DEEPSEEK, f"model.layers.{n}."


def mtp_index(path: Path, config: dict) -> int:
    """N, the index of the (one) MTP layer config.json declares; UserError when there is none."""
    return mtp_layout(path, config)[0]


def _names(path: Path, ckpt: Checkpoint) -> tuple[int, str, str, list[str]]:
    """(N, layout, prefix, the tensor names under the prefix); UserError when there are none."""
    n, layout, prefix = mtp_layout(path, ckpt.config)
    qc = ckpt.config.get("quantization_config")
    if qc is not None and not has_manifest(path):  # e.g. DeepSeek-V3's published FP8 release
        method = qc.get("quant_method", "?") if isinstance(qc, dict) else "?"
        raise UserError(f"{path}: the MTP layer of a checkpoint quantized outside tfcompile ({method}) is not decoded",
                        hint="--draft mtp reads bf16/fp16/fp32 checkpoints and tfcompile artifacts; pass the "
                             "bf16 model as --reference")
    names = [x for x in ckpt.names() if x.startswith(prefix)]
    if not names:
        raise UserError(f"{path}: config.json declares an MTP layer but no tensor is named {prefix}*",
                        hint="the checkpoint or artifact dropped its MTP layer; quantize the source with "
                             "this tfcompile (it keeps them, families/mtp.py) or measure the source checkpoint")
    return n, layout, prefix, names


def check_mtp(path: Path) -> None:
    """UserError unless `path` declares and holds one MTP layer (headers only: before any model is built)."""
    with open_checkpoint(Path(path)) as ckpt:
        _names(Path(path), ckpt)


def load_mtp(path: Path, target: nn.Module) -> MTPLayer:
    """The MTP layer of checkpoint or artifact `path` (float32, eval mode), built beside `target`
    (the transformers model of the same config: its decoder-layer, norm and rotary classes)."""
    path = Path(path)
    with open_checkpoint(path) as ckpt:
        n, layout, prefix, names = _names(path, ckpt)
        layer = MTPLayer(target, n, layout).float().eval()
        quantized = _quantized(path, prefix)
        _load(path, ckpt, layer, prefix, names, quantized, target.get_input_embeddings().weight.detach())
    return layer


def _quantized(path: Path, prefix: str) -> dict:
    """{Linear name: (shape, scheme)} of the artifact's MTP Linears ({} for a checkpoint)."""
    if not has_manifest(path):
        return {}
    manifest = load_manifest(path)
    scheme = get_scheme(manifest["scheme"]["name"])
    return {la["module"]: (tuple(la["shape"]), layer_scheme(la, scheme))
            for la in manifest.get("layers", []) if la["module"].startswith(prefix)}


def local(name: str) -> str:
    """`self_attn.q_a_proj.weight` (DeepSeek) or `layers.0.self_attn.q_proj.weight` (Qwen3.5) ->
    `block.self_attn...`; the layer's own modules stay."""
    if name.startswith(QWEN_BLOCK):
        return f"block.{name[len(QWEN_BLOCK):]}"
    return name if name.split(".", 1)[0] in OWN else f"block.{name}"


def _load(path: Path, ckpt: Checkpoint, layer: MTPLayer, prefix: str, names: list[str], quantized: dict,
          embedding: torch.Tensor) -> None:
    """Fill `layer` from the checkpoint's tensors under `prefix` and the target's `embedding` [V, H]."""
    state, modules = layer.state_dict(), dict(layer.named_modules())
    stored = {s.name for m, ((rows, cols), sch) in quantized.items()
              for s in ct_outputs(sch, m, rows, cols, torch.bfloat16)}
    loaded: set[str] = set()
    for name in names:
        if name in stored or name.endswith(_KV_SCALES) or name == f"{prefix}embed_tokens.weight":
            continue
        loaded.add(_put(path, layer, state, modules, local(name[len(prefix):]), ckpt.get(name)))
    loaded.add(_put(path, layer, state, modules, "embed_tokens.weight", embedding))  # vLLM shares the target's
    acts: dict[str, object] = {}  # per-expert Linear (local name) -> its input quantization
    for m, ((rows, cols), sch) in sorted(quantized.items()):
        w = dequantize(qtensor_of(ckpt, sch, m, rows, cols), torch.float32)
        name = local(m[len(prefix):])
        loaded.add(_put(path, layer, state, modules, f"{name}.weight", w))
        act = act_quantizer(sch.act, m, static_input_scale(ckpt, sch, m))
        if act is None:
            continue
        if isinstance(modules.get(name), nn.Linear):
            modules[name].register_forward_pre_hook(pre_hook(act))
        elif not name.endswith("up_proj"):  # experts: gate and up read one input (and scale)
            acts[name] = act
    if acts:  # per-expert activation quantization, as evaluate/models.py emulates it in the target
        layer.experts = MoERecorder(layer, lambda name, x: None, impl="tfcompile_mtp_act_emulation",
                                    transform=lambda name, x: acts[name](x) if name in acts else x)
    missing = sorted(set(state) - loaded)
    if missing:
        raise UserError(f"{path}: the MTP layer {prefix}* has no tensor for {missing[0]} ({len(missing)} missing)",
                        hint=f"check the artifact or checkpoint with `tfcompile verify {path}`")


@torch.no_grad()
def _put(path: Path, layer: MTPLayer, state: dict, modules: dict, name: str, t: torch.Tensor) -> str:
    """Copy tensor t into the layer's parameter `name` (local); returns the state_dict key filled."""
    m = _EXPERT.match(name.removesuffix(".weight"))
    if m and name.endswith(".weight") and hasattr(modules.get(m["parent"]), "gate_up_proj"):
        set_expert(modules[m["parent"]], int(m["e"]), m["proj"], t.float())
        return f"{m['parent']}.{'down_proj' if m['proj'] == 'down_proj' else 'gate_up_proj'}"
    if name not in state or tuple(state[name].shape) != tuple(t.shape):
        what = "is not a parameter of" if name not in state else f"is {tuple(t.shape)}, not {tuple(state[name].shape)} in"
        raise UserError(f"{path}: MTP tensor {name} {what} the MTP layer transformers builds from config.json",
                        hint="the MTP layer does not match config.json; check it with `tfcompile verify`")
    state[name].copy_(t.to(state[name].dtype))
    return name
