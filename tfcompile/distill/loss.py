"""Distillation losses. Shapes: logits [B, L, V]; ids [B, L]; hidden states [B, L, H].

- KL(teacher_T || student_T) of the next-token distributions at temperature T,
  times T^2 (Hinton et al. 2015: keeps gradient magnitudes comparable across T),
  summed over the vocabulary and averaged over positions (nats/token at T = 1).
- Top-k teacher (a disk cache of the k largest teacher logits per position):
  the teacher distribution is renormalised over its top k tokens,
  p~_T(i) = softmax_i(z_topk / T), and the loss is sum_i p~_T(i) (log p~_T(i) -
  log p_S(i)) with log p_S the student's full log-softmax gathered at those k
  tokens. That is the KL against the truncated teacher: it ignores the
  teacher's tail mass (1 - sum of the top-k probabilities) and so pushes the
  student's mass into the teacher's top k a little harder than the full KL.
  It equals the full KL when k = V.
- CE: the next-token cross-entropy on the data (the usual language-model loss),
  for `distill.ce_weight` > 0.
- Hidden MSE: per decoder layer output, ||h_S - h_T||^2 / ||h_T||^2 averaged over
  layers (scale-free, so the weight means the same for every model).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class TopK:
    """The teacher's k largest logits per position: values float32 [B, L, k], indices int64 [B, L, k]."""
    values: torch.Tensor
    indices: torch.Tensor


def kl_loss(student: torch.Tensor, teacher: torch.Tensor | TopK, temperature: float) -> torch.Tensor:
    """T^2 * mean over positions of KL(teacher_T || student_T)."""
    t = temperature
    log_s = F.log_softmax(student.float() / t, dim=-1)  # [B, L, V]
    if isinstance(teacher, TopK):
        log_t = F.log_softmax(teacher.values.float() / t, dim=-1)  # [B, L, k], renormalised over k
        log_s = log_s.gather(-1, teacher.indices)
    else:
        log_t = F.log_softmax(teacher.float() / t, dim=-1)
    kl = (log_t.exp() * (log_t - log_s)).sum(-1)  # [B, L]
    return kl.mean() * (t * t)


def ce_loss(student: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy: logits at position p predict ids[p + 1]."""
    logits = student[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def hidden_mse(student: tuple[torch.Tensor, ...], teacher: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Mean over decoder layers of ||h_S - h_T||^2 / ||h_T||^2 (embeddings, index 0, left out)."""
    terms = [(s.float() - t.float()).square().sum() / t.float().square().sum().clamp_min(1e-12)
             for s, t in zip(student[1:], teacher[1:])]
    return torch.stack(terms).mean()


def topk_logits(logits: torch.Tensor, k: int) -> TopK:
    """The k largest logits per position (k >= V keeps all of them, in index order)."""
    v = logits.shape[-1]
    if k <= 0 or k >= v:
        idx = torch.arange(v).expand(*logits.shape[:-1], v)
        return TopK(logits.float(), idx)
    vals, idx = logits.float().topk(k, dim=-1)
    return TopK(vals, idx)
