"""An independent reference for one training step (shared by core/test_update_reference.py and
train/test_train_signal.py).

Written from the definitions in docs/spec.md and docs/algorithm.md, sharing no code with :mod:`oblr.update`,
:mod:`oblr.estimators`, :mod:`oblr.losses`, :mod:`oblr.snr` or :mod:`oblr.schedules`: per-sequence gradients
from one autograd backward per sequence (:func:`oblr.gradnorm.loop_per_sequence_grads`), then by hand the
aggregation factors c_i, the weights w_i = c_i^2 ||s_i||^2, the advantages, the gradient
sum_i -A_i c_i s_i, the per-prompt estimates g_k, S and V, the SNR learning rate (EMA, warm-up, floor),
gradient clipping and the later-epoch clipped loss. Tensors are flattened over the trainable parameters
(``model.parameters()`` order) and kept in float64.
"""

from __future__ import annotations

import torch

from oblr.gradnorm import loop_per_sequence_grads
from oblr.logprobs import token_logprobs

# c_i from the definitions; L = response lengths [B] (float64)
SCALE = {
    "seq_sum_const": lambda L, max_len: torch.full_like(L, 1.0 / (L.numel() * max_len)),
    "token_mean": lambda L, max_len: torch.full_like(L, 1.0 / float(L.sum())),
    "seq_mean": lambda L, max_len: 1.0 / (L.numel() * L),
}


def _loo_weighted(F: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """oblr: A_i = F_i - sum_{j != i} w_j F_j / sum_{j != i} w_j, by explicit loops."""
    A = torch.empty_like(F)
    for k in range(F.shape[0]):
        for i in range(F.shape[1]):
            others = [j for j in range(F.shape[1]) if j != i]
            A[k, i] = F[k, i] - sum(w[k, j] * F[k, j] for j in others) / sum(w[k, j] for j in others)
    return A


def _loo_mean(F: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """rloo: A_i = F_i - mean_{j != i} F_j."""
    A = torch.empty_like(F)
    for k in range(F.shape[0]):
        for i in range(F.shape[1]):
            A[k, i] = F[k, i] - sum(F[k, j] for j in range(F.shape[1]) if j != i) / (F.shape[1] - 1)
    return A


ADVANTAGES = {"oblr": _loo_weighted, "rloo": _loo_mean}


def trainable(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def flat_params(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in trainable(model)]).double()


def flat_grad(model) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in trainable(model)]).double()


def set_flat_params(model, flat: torch.Tensor) -> None:
    with torch.no_grad():
        i = 0
        for p in trainable(model):
            p.copy_(flat[i:i + p.numel()].view_as(p))
            i += p.numel()


def reference(model, batch, rewards: torch.Tensor, aggregation: str, baseline: str, max_len: int) -> dict:
    """The on-policy update's numbers for ``batch`` (rows prompt-major) and ``rewards`` [N, G]:
    ``grad`` [D], ``gk_sq`` [N], ``adv`` [N, G], ``w`` [B], ``S``, ``V`` (float64)."""
    N, G = rewards.shape
    per_seq = loop_per_sequence_grads(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    s = torch.stack([torch.cat([g.reshape(-1) for g in row]) for row in per_seq]).double()  # [B, D]
    c = SCALE[aggregation](batch.response_mask.sum(-1).double(), max_len)  # [B]
    w = c.pow(2) * s.pow(2).sum(-1)  # squared norm of the per-sequence gradient the loss produces
    A = ADVANTAGES[baseline](rewards.double(), w.view(N, G))
    coeff = -A.reshape(-1) * c  # d loss / d l_i
    grad = coeff @ s
    g_k = N * (coeff.view(N, G, 1) * s.view(N, G, -1)).sum(1)  # per-prompt estimates, mean_k g_k = grad
    gk_sq = g_k.pow(2).sum(-1)
    grad_sq = grad.pow(2).sum()
    V = (gk_sq.sum() - N * grad_sq) / (N - 1)
    S = (grad_sq - V / N).clamp(min=0)
    return {"grad": grad, "gk_sq": gk_sq, "adv": A, "w": w, "S": S, "V": V}


def later_epoch_grad(model, batch, rollout_logprobs: torch.Tensor, adv: torch.Tensor, aggregation: str,
                     max_len: int, clip_eps: float) -> torch.Tensor:
    """Gradient [D] of -sum_i c_i sum_t m_it min(r_it A_i, clip(r_it) A_i), r = exp(logp - logp_rollout)."""
    for p in trainable(model):
        p.grad = None
    new = token_logprobs(model, batch.input_ids, batch.attention_mask)
    mask = batch.response_mask.float()
    c = SCALE[aggregation](mask.sum(-1).double(), max_len).float()
    A = adv.reshape(-1, 1).float()
    ratio = torch.where(mask > 0, (new - rollout_logprobs).exp(), torch.ones_like(new))
    obj = torch.minimum(ratio * A, ratio.clamp(1 - clip_eps, 1 + clip_eps) * A)
    (-(c * (obj * mask).sum(-1)).sum()).backward()
    return flat_grad(model)


def clip_grad(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Global-norm clipping as documented by torch: scale by min(1, max_norm / (||g|| + 1e-6)); 0 = off."""
    if max_norm <= 0:
        return grad
    return grad * min(1.0, max_norm / (float(grad.norm()) + 1e-6))


class SNRRate:
    """eta = warm(k) * max(eta_min, eta_max * S / (S + V/N)) with S, V optionally EMA-smoothed
    (bias-corrected by 1 - ema^k, S clamped at 0 before averaging, both clamped after)."""

    def __init__(self, eta_max: float, *, ema: float = 0.0, warmup_steps: int = 0, eta_min: float = 0.0):
        self.eta_max, self.ema, self.warmup, self.eta_min = eta_max, ema, warmup_steps, eta_min
        self.k, self.s_avg, self.v_avg = 0, 0.0, 0.0

    def step(self, S: float, V: float, N: int) -> dict:
        self.k += 1
        S = max(S, 0.0)
        if self.ema > 0:
            self.s_avg = self.ema * self.s_avg + (1 - self.ema) * S
            self.v_avg = self.ema * self.v_avg + (1 - self.ema) * V
            S, V = self.s_avg / (1 - self.ema ** self.k), self.v_avg / (1 - self.ema ** self.k)
        S, V = max(S, 0.0), max(V, 0.0)
        factor = S / (S + V / N)
        warm = min(1.0, self.k / self.warmup) if self.warmup else 1.0
        return {"S": S, "V": V, "factor": factor, "lr": warm * max(self.eta_min, self.eta_max * factor)}
