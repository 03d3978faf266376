"""The MTP layer computed by hand from a checkpoint's raw tensors, for tests/draft: the decoder
layer as transformers builds it, the fusing projection and norms as matmuls (vLLM 0.32
deepseek_mtp.py / qwen3_5_mtp.py), independent of tfcompile.draft."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F


def mtp_block(src, cfg: dict, raw: dict, qwen: bool):
    """The MTP decoder layer as transformers builds it, with its tensors, and the rotary embedding."""
    from transformers import AutoModelForCausalLM

    n = cfg["num_hidden_layers"]
    if qwen:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding

        c = Qwen3_5TextConfig(**{**cfg, "layer_types": cfg["layer_types"] + ["full_attention"],
                                 "num_hidden_layers": n + 1})
        block = Qwen3_5DecoderLayer(c, n)
        block.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in raw.items() if k.startswith("mtp.layers.0.")},
                              strict=True)
        return block.eval(), Qwen3_5TextRotaryEmbedding(c)
    extra = {"mlp_layer_types": cfg["mlp_layer_types"] + ["sparse"]}
    if "indexer_types" in cfg:
        extra["indexer_types"] = cfg["indexer_types"] + ["full"]
    wide = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, num_hidden_layers=n + 1, **extra).eval()
    return wide.model.layers[n], wide.model.rotary_emb


class ByHand:
    """The MTP layer of checkpoint `src` (float32): `fuse`, `run` (the decoder layer, causal, no
    cache), `rms` by the checkpoint's norm weights; `prefix` and `block_prefix` name its tensors."""

    def __init__(self, src):
        from safetensors.torch import load_file

        self.cfg = cfg = json.loads((src / "config.json").read_text())
        self.qwen = "mtp_num_hidden_layers" in cfg
        self.raw = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
        self.prefix = "mtp." if self.qwen else f"model.layers.{cfg['num_hidden_layers']}."
        self.block_prefix = self.prefix + ("layers.0." if self.qwen else "")
        self.w = {k[len(self.prefix):]: v for k, v in self.raw.items() if k.startswith(self.prefix)}
        self.block, self.rotary = mtp_block(src, cfg, self.raw, self.qwen)

    def rms(self, h, name):  # Qwen3.5's RMSNorm scales by 1 + weight
        return F.rms_norm(h, (self.cfg["hidden_size"],), self.w[name] + (1.0 if self.qwen else 0.0),
                          self.cfg["rms_norm_eps"])

    def fuse(self, tokens, hidden, zero_first):
        """[T] token ids, [T, H] hidden states -> [T, H] decoder-layer input."""
        e = self.raw["model.embed_tokens.weight"][tokens].clone()  # the target's: vLLM's EagleProposer shares it
        if self.qwen:
            return torch.cat([self.rms(e, "pre_fc_norm_embedding.weight"), self.rms(hidden, "pre_fc_norm_hidden.weight")],
                             -1) @ self.w["fc.weight"].T
        if zero_first:
            e[0] = 0.0  # deepseek_mtp.py: position 0 masked
        return torch.cat([self.rms(e, "enorm.weight"), self.rms(hidden, "hnorm.weight")], -1) @ self.w["eh_proj.weight"].T

    def run(self, z):
        """The decoder layer over positions 0..T-1 of z [T, H], causal, no cache; Qwen3.5: normed."""
        t = z.shape[0]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        pos = torch.arange(t)[None]
        out = self.block(z[None], attention_mask=mask, position_ids=pos, position_embeddings=self.rotary(z[None], pos))
        out = (out[0] if isinstance(out, tuple) else out)[0]
        return self.rms(out, "norm.weight") if self.qwen else out


def mtp_linear_amax(src, ids: torch.Tensor) -> dict[str, float]:
    """{checkpoint name of each nn.Linear of the MTP decoder layer: max |input|} over step 0 of every
    sequence of ids [S, T] (index i: token x[i+1], the target's final normed state i, position i), the
    target run by transformers in float32. Fused experts have no nn.Linear and are left out."""
    from transformers import AutoModelForCausalLM

    mtp = ByHand(src)
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    amax: dict[str, float] = {}

    def hook(name):
        def record(mod, args):
            amax[name] = max(amax.get(name, 0.0), float(args[0].abs().max()))
        return record

    hooks = [m.register_forward_pre_hook(hook(mtp.block_prefix + n)) for n, m in mtp.block.named_modules()
             if isinstance(m, torch.nn.Linear)]
    try:
        with torch.no_grad():
            for seq in ids:
                g = target(input_ids=seq[None], output_hidden_states=True).hidden_states[-1][0]  # [T, H]
                mtp.run(mtp.fuse(seq[1:], g[:-1], True))
    finally:
        for h in hooks:
            h.remove()
    return amax
