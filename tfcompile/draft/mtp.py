"""A model's own multi-token-prediction (MTP) layer as a drafter, in plain torch, as vLLM runs it.

DeepSeek-V3/V3.2 and GLM-4.5/5 ship `num_nextn_predict_layers` MTP layers at `model.layers.{N}`
(N = num_hidden_layers; families/mtp.py); this runs DeepSeek-V3's and GLM-4.5's (the DSA layers of
V3.2 / GLM-5 are refused by mtp_load). vLLM serves them as the speculative draft
(`--speculative-config '{"method": "mtp"}'`); this module follows its code:

- vllm/model_executor/models/deepseek_mtp.py, `DeepSeekMultiTokenPredictorLayer.forward`: the
  token embedding (the target's `embed_tokens`, which vllm/v1/spec_decode/eagle.py
  `EagleProposer.load_model` gives MTP models; mtp_load.py) is zeroed at position 0 ("masking
  inputs at position 0, as not needed by MTP"), then
  `x = eh_proj(cat([enorm(embed(token)), hnorm(previous_hidden)], -1))` ([T, 2H] -> [T, H]), then
  the decoder layer `mtp_block` (a full DeepseekV2DecoderLayer, its own attention KV cache), whose
  output (residual included, before any norm) is the layer's hidden state;
  `DeepSeekMultiTokenPredictor.compute_logits`: `shared_head.head(shared_head.norm(h))`;
- vllm/v1/spec_decode/eagle.py, `EagleProposer.propose` (method "mtp"): the target's hidden
  states (its final, normed output, what DeepseekV2Model.forward returns) of positions 0..n-2 are
  paired with the input ids shifted by one (index i reads token x[i+1] at position i and
  predicts x[i+2]); the first draft is the argmax at the last index; each further draft runs the
  MTP layer again on the previous draft token, at position + 1, with the MTP layer's *own* output
  hidden state as `previous_hidden` (chained), spec step j using layer j % num_nextn_predict_layers.

Attention of the MTP layer: causal over the step-0 entries of the verified sequence, plus the
chained entries of the current proposal (dropped after it: the next proposal recomputes step 0
from the target's own hidden states of the newly verified positions, as vLLM overwrites them).

The decoder layer is the target architecture's own transformers class (DeepseekV3DecoderLayer,
Glm4MoeDecoderLayer) built at layer index N, so it is MoE or dense as the config says. Shapes: T
positions, H hidden, V vocabulary. Everything runs in float32.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


class KV:
    """The MTP layer's KV cache: what transformers' attention calls `cache.update` on, growing along
    the sequence (dim -2), with `keep(n)` to drop the chained entries of the last proposal."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.k = k if self.k is None else torch.cat([self.k, k], -2)
        self.v = v if self.v is None else torch.cat([self.v, v], -2)
        return self.k, self.v

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def keep(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[..., :n, :], self.v[..., :n, :]


class MTPLayer(nn.Module):
    """One MTP layer; parameter names are the checkpoint's under `model.layers.{N}.`, except the
    decoder layer's, which live under `block.` (vLLM's `mtp_block`)."""

    def __init__(self, target: nn.Module, layer_idx: int):
        super().__init__()
        base = target.model  # e.g. DeepseekV3ForCausalLM: .model = DeepseekV3Model
        # A copy of the config: the experts function is chosen by config._experts_implementation, and
        # the target's may be eval's per-expert emulation, which knows only the target's experts.
        self.config = cfg = copy.deepcopy(target.config)
        cfg._experts_implementation = "eager"
        h, v, norm = cfg.hidden_size, cfg.vocab_size, type(base.norm)
        self.layer_idx = layer_idx
        self.embed_tokens = nn.Embedding(v, h)
        self.enorm, self.hnorm = norm(h, eps=cfg.rms_norm_eps), norm(h, eps=cfg.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = norm(h, eps=cfg.rms_norm_eps)
        self.shared_head.head = nn.Linear(h, v, bias=False)
        self.block = type(base.layers[-1])(cfg, layer_idx)  # MoE or dense as first_k_dense_replace says
        self.rotary = type(base.rotary_emb)(config=cfg)

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, kv: KV | None) -> torch.Tensor:
        """The layer on T new positions: tokens [B, T] ids, hidden [B, T, H] (the target's or the
        previous MTP output), pos [T] position ids, consecutive after the len(kv) cached ones (kv
        None: no cache, T positions from pos[0]). Returns the layer's output hidden states [B, T, H]."""
        e = self.embed_tokens(tokens).masked_fill((pos == 0)[None, :, None], 0.0)  # vLLM: position 0 zeroed
        x = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], -1))  # [B, T, 2H] -> [B, T, H]
        c, t = (0 if kv is None else len(kv)), tokens.shape[1]
        allowed = torch.cat([torch.ones(t, c, dtype=torch.bool, device=x.device),
                             torch.ones(t, t, dtype=torch.bool, device=x.device).tril()], 1)  # [T, c + T]
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]  # additive [1, 1, T, c + T]
        return self.block(x, attention_mask=mask, position_ids=pos[None], cache=kv, use_cache=kv is not None,
                          position_embeddings=self.rotary(x, pos[None]))

    def set_experts_implementation(self, impl: str) -> None:
        """What calibration.moe.MoERecorder calls to route this layer's experts through its function."""
        self.config._experts_implementation = impl

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of MTP output hidden states [..., H] (shared_head: norm, then head)."""
        return self.shared_head.head(self.shared_head.norm(hidden))


class MTPDrafter:
    """The Drafter (spec.py) of a model's MTP layer. `aux` handed over by the target (spec.Target
    with aux_layers=TARGET_HIDDEN): its final normed hidden state [n, H] per verified position.
    One MTP layer, as DeepSeek-V3/V3.2 and GLM-4.5/5 ship (vLLM chains it for every spec step:
    step j uses layer j % num_nextn_predict_layers = 0)."""

    def __init__(self, layer: MTPLayer):
        self.layer = layer
        self.g: list[torch.Tensor] = []  # target hidden state [H] per verified position
        self.kv, self.done = KV(), 0  # step-0 entries of indices 0..done-1
        self.logits: list[torch.Tensor] = []  # the last proposal's logits [V] per draft position

    def begin(self, prompt, aux) -> None:
        self.g, self.kv, self.done = [], KV(), 0
        self.verified(aux)

    def verified(self, aux) -> None:
        self.g.extend(aux.to(torch.float32).unbind(0))

    @torch.no_grad()
    def propose(self, seq: list[int], k: int) -> list[int]:
        """k token ids after seq (its last token, the target's latest, has no hidden state yet)."""
        if k <= 0:
            return []
        m, dev = self.layer, self.layer.eh_proj.weight.device
        n, c = len(seq), self.done
        idx = torch.arange(c, n - 1, device=dev)  # indices i: hidden g[i], token seq[i + 1], position i
        h = m.step(torch.tensor([seq[c + 1:n]], device=dev), torch.stack(self.g[c:n - 1]).to(dev)[None], idx,
                   self.kv)[:, -1:]  # the last index's output [1, 1, H]
        self.done = n - 1
        self.logits = [m.logits(h[0, 0])]
        for j in range(1, k):  # chained: the previous draft at position + 1, on the MTP output
            pos = torch.tensor([n - 2 + j], device=dev)
            h = m.step(self.logits[-1].argmax().view(1, 1), h, pos, self.kv)
            self.logits.append(m.logits(h[0, 0]))
        drafted = [int(x.argmax()) for x in self.logits]
        self.kv.keep(self.done)  # drop the chain: step 0 is recomputed from the target's states
        return drafted


# The target's hidden states an MTP layer reads: transformers' hidden_states[-1], the final
# (normed) output, which is what vLLM's DeepseekV2Model.forward hands the proposer.
TARGET_HIDDEN = (-1,)
