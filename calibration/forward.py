"""Run the model over calibration tokens and observe Linear inputs.

This is the simple, whole-model loop: the model is instantiated by
transformers from the checkpoint directory (no remote code, `trust_remote_code`
never set) and run in its dtype on CPU, with forward pre-hooks recording
max |x| per observed module. Tokens come from `calibration.datasets`: by
default sequences the model samples itself (seeded), so it needs no data set.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch
from torch import nn

from tfcompile.calibration.stats import CalibStats
from tfcompile.errors import CheckpointError


def load_hf_model(model_dir: Path, dtype: torch.dtype):
    """The transformers model for config.json's architecture, weights loaded."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # stderr belongs to our reporter
    cfg = transformers.AutoConfig.from_pretrained(model_dir, trust_remote_code=False)
    arch = (cfg.architectures or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    if cls is None:
        raise CheckpointError(f"{model_dir}/config.json: architecture {arch!r} is not in transformers",
                              hint="calibration needs a transformers architecture; use a weight-only "
                                   "or dynamic-activation format (e.g. nvfp4a16, fp8-dynamic)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = cls.from_pretrained(model_dir, dtype=dtype, trust_remote_code=False)
    return model.eval()


def load_tokenizer(model_dir: Path):
    """The checkpoint's own tokenizer (local files only), or None if it has none."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False, local_files_only=True)
    except (OSError, ValueError):
        return None


def observe_input_amax(model_dir: Path, modules: set[str], *, data: str, samples: int, seq_len: int,
                       seed: int, dtype: torch.dtype, kv: bool = False,
                       hessian_groups: dict[str, str] | None = None) -> CalibStats:
    """max |input| per module name in `modules` (and, with `kv`, max |K|, |V| per attention
    module and KV head), over `samples` x `seq_len` calibration tokens."""
    from tfcompile.calibration.datasets import calibration_tokens

    model = load_hf_model(model_dir, dtype)
    kv_obs = None
    if kv:
        from tfcompile.calibration.kv import KVObserver, install

        kv_obs = KVObserver(model)
        model.set_attn_implementation(install(kv_obs))
    tokenizer = load_tokenizer(model_dir)
    if tokenizer is None and data not in ("self", "random"):
        raise CheckpointError(f"{model_dir}: no tokenizer files, so calibration text cannot be tokenized",
                              hint="add the tokenizer to the checkpoint, or use --calib self / random")
    vocab = int(getattr(model.config, "vocab_size", None) or model.get_input_embeddings().num_embeddings)
    ids = calibration_tokens(data, tokenizer, samples=samples, seq_len=seq_len, seed=seed,
                             model=model, vocab=vocab)
    amax: dict[str, float] = {}
    hooks = [mod.register_forward_pre_hook(_recorder(name, amax))
             for name, mod in model.named_modules() if name in modules or _expert_parent(name, modules)]
    hess = HessianRecorder(model, hessian_groups or {})
    try:
        with torch.inference_mode():
            for row in ids:
                model(input_ids=row[None])
    finally:
        for h in hooks + hess.hooks:
            h.remove()
    resolved, fallback = _resolve(modules, amax)
    kv_amax = {} if kv_obs is None else {n: (kv_obs.k[n], kv_obs.v[n]) for n in sorted(kv_obs.k)}
    if kv and not kv_amax:
        raise CheckpointError(f"{model_dir}: no attention call went through transformers' "
                              "AttentionInterface, so KV-cache scales cannot be calibrated",
                              hint="this architecture is not supported for --kv-cache yet")
    return CalibStats(resolved, int(ids.numel()), f"{data}(seed={seed})", tuple(fallback), kv_amax,
                      hessians=hess.result())


class HessianRecorder:
    """H = X^T X / n of each fusion group's input, recorded on one member (they share X).

    Memory: one float32 [K, K] per group (the whole-model loop; the sequential
    layer-by-layer loop of issue #4 holds one decoder layer's at a time)."""

    def __init__(self, model: nn.Module, groups: dict[str, str]):
        self._h: dict[str, torch.Tensor] = {}
        self._n: dict[str, int] = {}
        self.hooks = [mod.register_forward_pre_hook(self._hook(groups[name]))
                      for name, mod in model.named_modules() if name in groups]

    def _hook(self, key: str):
        def hook(mod: nn.Module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
            h = x.T @ x
            self._h[key] = h if key not in self._h else self._h[key] + h
            self._n[key] = self._n.get(key, 0) + x.shape[0]

        return hook

    def result(self) -> dict[str, torch.Tensor]:
        return {k: self._h[k] / self._n[k] for k in sorted(self._h)}


def _recorder(name: str, amax: dict):
    def hook(mod: nn.Module, args):
        x = args[0] if args else None
        if isinstance(x, torch.Tensor) and x.numel():
            v = float(x.detach().abs().amax().float())
            amax[name] = max(v, amax.get(name, 0.0))

    return hook


def _expert_parent(name: str, modules: set[str]) -> bool:
    """A fused experts module (transformers v5) whose per-expert Linears we quantize."""
    return name.endswith("experts") and any(m.startswith(name + ".") for m in modules)


def _resolve(modules: set[str], amax: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Give every module a positive amax; modules no token reached get a fallback.

    Fallback (documented in docs/design.md): a fused expert's gate/up input is
    the experts module's input; anything else takes the largest amax observed
    in the same decoder layer, else the model-wide largest. Never zero.
    """
    out, fallback = {}, []
    top = max(amax.values(), default=1.0) or 1.0
    for m in sorted(modules):
        v = amax.get(m)
        if v is None and re.search(r"\.experts\.\d+\.(gate_proj|up_proj)$", m):
            v = amax.get(m.rsplit(".", 2)[0])
        if not v:
            layer = re.match(r"(.*?\.\d+)\.", m)
            same = [a for k, a in amax.items() if layer and k.startswith(layer.group(1) + ".")]
            v = max(same, default=0.0) or top
            fallback.append(m)
        out[m] = v
    return out, fallback
