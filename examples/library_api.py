"""The README's library example, runnable: one OBLR-PO step on a tiny random Qwen3 model, by hand.

    python examples/library_api.py
"""

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from oblr.estimators import compute_advantages
from oblr.gradnorm import BookKeeper, sequence_grad_sq_norms
from oblr.logprobs import forward_logits, gather_logprobs, sequence_logprobs
from oblr.snr import SNRLearningRate, snr_statistics

torch.manual_seed(0)
model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, head_dim=8))
N, G, T, max_len = 3, 4, 10, 6                               # 3 prompts, 4 outputs each, 6 response tokens
B = N * G
input_ids = torch.randint(0, 64, (B, T))
attention_mask = torch.ones(B, T, dtype=torch.long)
response_mask = torch.zeros(B, T, dtype=torch.long)
response_mask[:, T - max_len:] = 1
group_ids = torch.arange(N).repeat_interleave(G)
rewards = torch.tensor([[1., 0., 0., 1.], [0., 0., 1., 0.], [1., 1., 1., 0.]])   # [N, G]

# exact ||s_i||^2 for every sequence, one backward pass
w = sequence_grad_sq_norms(model, input_ids, attention_mask, response_mask)
print("w_i:", [f"{x:.3g}" for x in w.tolist()])

# the book-keeping step: one forward + one backward gives weights, the weighted gradient and the SNR inputs
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
lr_ctrl = SNRLearningRate(optimizer, eta_max=1e-3)
book = BookKeeper(model)
with book.record():
    logits = forward_logits(model, input_ids, attention_mask)
    seq_lp = sequence_logprobs(gather_logprobs(logits, input_ids), response_mask)   # [B]
    book.backward(seq_lp)
c = 1.0 / (B * max_len)                                      # unbiased constant-normalised aggregation
weights = (book.sq_norms() * c**2).view(N, G)
adv, metrics = compute_advantages("oblr", rewards, weights=weights, return_metrics=True)
coeffs = -adv.reshape(-1) * c                                # d loss / d l_i
optimizer.zero_grad(set_to_none=True)
book.accumulate_grad(coeffs)                                 # .grad = sum_i coeffs_i s_i
per_prompt = book.group_sq_norms(coeffs * N, group_ids)      # ||g_k||^2 with mean_k g_k = .grad
book.clear()
grad_sq = sum(p.grad.pow(2).sum() for p in model.parameters() if p.grad is not None)
st = snr_statistics(per_prompt, grad_sq, N)                 # S, V, SNR and the unclamped signal
lr_ctrl.step(st.signal, st.V, N)                             # the unclamped signal (what an EMA averages)
S, V, snr = st.S, st.V, st.snr
optimizer.step()
print("advantages:\n", adv)
print(f"S={float(S):.3g} V={float(V):.3g} SNR={float(snr):.3g} lr={lr_ctrl.get_last_lr()[0]:.3g} "
      f"fallbacks={int(metrics['baseline/fallback_count'])}")
