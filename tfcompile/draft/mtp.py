"""A model's own multi-token-prediction (MTP) layer as a drafter, in plain torch, as vLLM runs it.

Two layouts (families/mtp.py), one layer each, as the published checkpoints ship:

- DeepSeek (`model.layers.{N}`, N = num_hidden_layers): DeepSeek-V3, DeepSeek-V3.2 and GLM-5
  (DSA: the decoder layer carries the lightning indexer), GLM-4.5/4.6. vLLM 0.32
  vllm/model_executor/models/deepseek_mtp.py `DeepSeekMultiTokenPredictorLayer.forward` (V3; on
  CPU also V3.2 and GLM-5: vllm/models/deepseek_v32/__init__.py serves both with `DeepSeekMTP`),
  glm4_moe_mtp.py `Glm4MoeMultiTokenPredictorLayer.forward` (GLM-4.5): the token embedding (the
  target's `embed_tokens`, which vllm/v1/spec_decode/eagle.py `EagleProposer.load_model` gives MTP
  models; mtp_load.py) is zeroed at position 0 ("masking inputs at position 0, as not needed by
  MTP"), `x = eh_proj(cat([enorm(embed(token)), hnorm(previous_hidden)], -1))` ([T, 2H] -> [T, H]),
  then the decoder layer `mtp_block` (residual included, before any norm) gives h;
  logits = `shared_head.head(shared_head.norm(h))`. What the next chained step reads as
  previous_hidden: DeepSeek-V3 / V3.2 / GLM-5 return `(h, shared_head(h))` and recycle the normed
  state (vllm/v1/spec_decode/llm_base_proposer.py `model_returns_tuple`: DeepSeekMTPModel,
  DeepseekV32MTPModel), GLM-4.5 returns h alone and recycles it.
- Qwen3.5 / Qwen3-Next (`mtp.`): vllm/model_executor/models/qwen3_5_mtp.py
  `Qwen3_5MultiTokenPredictor.forward`: `x = fc(cat([pre_fc_norm_embedding(embed(token)),
  pre_fc_norm_hidden(previous_hidden)], -1))` (no position-0 masking), the decoder layer
  `layers.0` (a full-attention Qwen3_5DecoderLayer), then `norm`: that normed state is both what
  `Qwen3_5MTP.compute_logits` feeds the target's `lm_head` (the checkpoint's own lm_head) and what
  the next chained step reads. The norms are Qwen3.5's (1 + weight) RMSNorm (transformers' class).

vllm/v1/spec_decode/eagle.py `EagleProposer.propose` (method "mtp"): the target's hidden states
(its final, normed output, what DeepseekV2Model / Qwen3_5Model.forward return) of positions
0..n-2 are paired with the input ids shifted by one (index i reads token x[i+1] at position i and
predicts x[i+2]); the first draft is the argmax at the last index; each further draft runs the
MTP layer again on the previous draft token, at position + 1, on the recycled state above
(chained), spec step j using layer j % num_mtp_layers = 0.

Attention of the MTP layer: causal over the step-0 entries of the verified sequence, plus the
chained entries of the current proposal (dropped after it: the next proposal recomputes step 0
from the target's own hidden states of the newly verified positions, as vLLM overwrites them).
The DSA indexer of V3.2 / GLM-5 keeps its own key cache (KV.update_indexer) and selects the
top `index_topk` keys at every step (vLLM's default: `index_share_for_mtp_iteration` off); over
fewer keys than index_topk (2048 in the published configs) it selects them all.

The decoder layer is the target architecture's own transformers class (DeepseekV3DecoderLayer,
DeepseekV32DecoderLayer, Glm4MoeDecoderLayer, Qwen3_5DecoderLayer, ...) built at layer index N,
so it is MoE or dense as the config says. Shapes: T positions, H hidden, V vocabulary. Everything
runs in float32.
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
        self.ik: torch.Tensor | None = None  # DSA indexer keys [B, S, D] (DeepSeek-V3.2, GLM-5)

    def update(self, k: torch.Tensor, v: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.k = k if self.k is None else torch.cat([self.k, k], -2)
        self.v = v if self.v is None else torch.cat([self.v, v], -2)
        return self.k, self.v

    def update_indexer(self, k: torch.Tensor, layer_idx: int) -> torch.Tensor:
        self.ik = k if self.ik is None else torch.cat([self.ik, k], 1)
        return self.ik

    def __len__(self) -> int:
        return 0 if self.k is None else int(self.k.shape[-2])

    def keep(self, n: int) -> None:
        if self.k is not None:
            self.k, self.v = self.k[..., :n, :], self.v[..., :n, :]
        if self.ik is not None:
            self.ik = self.ik[:, :n]


DEEPSEEK, QWEN3_5 = "deepseek", "qwen3_5"  # the two layouts (module docstring)
_RECYCLE_RAW = ("glm4_moe",)  # vLLM glm4_moe_mtp.py: the MTP output itself is chained (not normed)


def _extend_layer_lists(cfg, layer_idx: int) -> None:
    """Per-layer config lists reach index layer_idx (= num_hidden_layers) so transformers builds the
    MTP layer's decoder class there: `layer_types` "full_attention" (vLLM qwen3_5_mtp.py builds it with
    layer_type="full_attention"), `mlp_layer_types` (DeepSeek-V3.2 / GLM-5) as the last layer's, MoE
    in the published configs (vLLM DeepseekV2DecoderLayer: MoE from first_k_dense_replace on),
    GLM-5's `indexer_types` "full" (the MTP layer runs its own indexer: vLLM deepseek_mtp.py gives
    its DeepseekV2DecoderLayer a topk_indices_buffer of its own)."""
    for attr, value in (("layer_types", "full_attention"), ("mlp_layer_types", None), ("indexer_types", "full")):
        have = getattr(cfg, attr, None)
        if have is not None and len(have) <= layer_idx:
            setattr(cfg, attr, list(have) + [value or have[-1]] * (layer_idx + 1 - len(have)))


class MTPLayer(nn.Module):
    """One MTP layer; parameter names are the checkpoint's under its prefix (`model.layers.{N}.`,
    `mtp.`), except the decoder layer's, which live under `block.` (vLLM's `mtp_block`, `layers.0`)."""

    def __init__(self, target: nn.Module, layer_idx: int, layout: str = DEEPSEEK):
        super().__init__()
        base = target.get_decoder()  # e.g. DeepseekV3Model, Qwen3_5TextModel
        # A copy of the config: the experts function is chosen by config._experts_implementation, and
        # the target's may be eval's per-expert emulation, which knows only the target's experts.
        self.config = cfg = copy.deepcopy(base.config)
        cfg._experts_implementation = "eager"
        _extend_layer_lists(cfg, layer_idx)
        h, v, norm = cfg.hidden_size, cfg.vocab_size, type(base.norm)
        self.layer_idx, self.layout = layer_idx, layout
        self.recycle_normed = layout == QWEN3_5 or cfg.model_type not in _RECYCLE_RAW
        self.embed_tokens = nn.Embedding(v, h)
        if layout == QWEN3_5:
            self.pre_fc_norm_embedding = norm(h, eps=cfg.rms_norm_eps)
            self.pre_fc_norm_hidden = norm(h, eps=cfg.rms_norm_eps)
            self.fc = nn.Linear(2 * h, h, bias=False)
            self.norm = norm(h, eps=cfg.rms_norm_eps)
            self._head = (target.get_output_embeddings(),)  # the target's lm_head, as served (not a submodule)
        else:
            self.enorm, self.hnorm = norm(h, eps=cfg.rms_norm_eps), norm(h, eps=cfg.rms_norm_eps)
            self.eh_proj = nn.Linear(2 * h, h, bias=False)
            self.shared_head = nn.Module()
            self.shared_head.norm = norm(h, eps=cfg.rms_norm_eps)
            self.shared_head.head = nn.Linear(h, v, bias=False)
        self.block = type(base.layers[-1])(cfg, layer_idx)  # MoE or dense as the config says
        self.rotary = type(base.rotary_emb)(config=cfg)

    @property
    def proj(self) -> nn.Linear:
        """The [H, 2H] fusing projection (eh_proj / fc)."""
        return self.fc if self.layout == QWEN3_5 else self.eh_proj

    def _fuse(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        e = self.embed_tokens(tokens)
        if self.layout == QWEN3_5:
            return self.fc(torch.cat([self.pre_fc_norm_embedding(e), self.pre_fc_norm_hidden(hidden)], -1))
        e = e.masked_fill((pos == 0)[None, :, None], 0.0)  # vLLM deepseek_mtp.py: position 0 zeroed
        return self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], -1))  # [B, T, 2H] -> [B, T, H]

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, pos: torch.Tensor, kv: KV | None) -> torch.Tensor:
        """The layer on T new positions: tokens [B, T] ids, hidden [B, T, H] (the target's or the
        recycled MTP state), pos [T] position ids, consecutive after the len(kv) cached ones (kv
        None: no cache, T positions from pos[0]). Returns the states logits() reads [B, T, H]
        (DeepSeek: the decoder layer's output; Qwen3.5: that, normed)."""
        x = self._fuse(tokens, hidden, pos)
        c, t = (0 if kv is None else len(kv)), tokens.shape[1]
        allowed = torch.cat([torch.ones(t, c, dtype=torch.bool, device=x.device),
                             torch.ones(t, t, dtype=torch.bool, device=x.device).tril()], 1)  # [T, c + T]
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
        mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]  # additive [1, 1, T, c + T]
        out = self.block(x, attention_mask=mask, position_ids=pos[None], cache=kv, use_cache=kv is not None,
                         position_embeddings=self.rotary(x, pos[None]))
        out = out[0] if isinstance(out, tuple) else out  # GlmMoeDsaDecoderLayer: (hidden, top-k indices)
        return self.norm(out) if self.layout == QWEN3_5 else out

    def recycle(self, h: torch.Tensor) -> torch.Tensor:
        """What the next chained step reads as its previous hidden state, from step()'s output h."""
        if self.layout == QWEN3_5 or not self.recycle_normed:
            return h
        return self.shared_head.norm(h)

    def set_experts_implementation(self, impl: str) -> None:
        """What calibration.moe.MoERecorder calls to route this layer's experts through its function."""
        self.config._experts_implementation = impl

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., V] logits of step() outputs [..., H] (DeepSeek: shared_head, norm then head;
        Qwen3.5: the target's lm_head on the already normed state)."""
        if self.layout == QWEN3_5:
            head = self._head[0]
            return head(hidden.to(head.weight.dtype)).float()
        return self.shared_head.head(self.shared_head.norm(hidden))


class MTPDrafter:
    """The Drafter (spec.py) of a model's MTP layer. `aux` handed over by the target (spec.Target
    with aux_layers=TARGET_HIDDEN): its final normed hidden state [n, H] per verified position.
    One MTP layer, as DeepSeek-V3/V3.2, GLM-4.5/5 and Qwen3.5 ship (vLLM chains it for every spec
    step: step j uses layer j % num_mtp_layers = 0)."""

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
        m, dev = self.layer, self.layer.proj.weight.device
        n, c = len(seq), self.done
        idx = torch.arange(c, n - 1, device=dev)  # indices i: hidden g[i], token seq[i + 1], position i
        h = m.step(torch.tensor([seq[c + 1:n]], device=dev), torch.stack(self.g[c:n - 1]).to(dev)[None], idx,
                   self.kv)[:, -1:]  # the last index's output [1, 1, H]
        self.done = n - 1
        self.logits = [m.logits(h[0, 0])]
        for j in range(1, k):  # chained: the previous draft at position + 1, on the recycled MTP state
            pos = torch.tensor([n - 2 + j], device=dev)
            h = m.step(self.logits[-1].argmax().view(1, 1), m.recycle(h), pos, self.kv)
            self.logits.append(m.logits(h[0, 0]))
        drafted = [int(x.argmax()) for x in self.logits]
        self.kv.keep(self.done)  # drop the chain: step 0 is recomputed from the target's states
        return drafted


# The target's hidden states an MTP layer reads: transformers' hidden_states[-1], the final
# (normed) output, which is what vLLM's DeepseekV2Model / Qwen3_5Model.forward hand the proposer.
TARGET_HIDDEN = (-1,)
