"""OBLRGRPOTrainer with a KL term (beta > 0, full fine-tuning and LoRA) and a nucleus (top_p < 1): w_i, the
advantages and the folded gradient against a one-sequence-at-a-time reference that scores with transformers'
own top-p warper and adds ``beta c_i grad KL_i`` (sequence k3 to an independently built reference model)."""

import pytest
import torch

pytest.importorskip("trl")

from transformers.generation.logits_process import TopPLogitsWarper  # noqa: E402

from oblr.estimators import compute_advantages  # noqa: E402
from oblr.models import load_model_and_tokenizer  # noqa: E402

from .trl_helpers import GradSnapshot, KeepRounds, frozen_copy, make_trainer, rel_err  # noqa: E402

BETA = 0.5


def _token_logprobs(model, ids, temperature, top_p):
    """[T-1] log-probs of ids[1:] under softmax(logits / T) truncated by transformers' TopPLogitsWarper."""
    logits = model(input_ids=ids[None]).logits[0, :-1].float() / temperature
    if top_p < 1.0:
        logits = TopPLogitsWarper(top_p)(ids[None, :-1], logits)
    return torch.log_softmax(logits, -1).gather(-1, ids[1:, None]).squeeze(-1)


def _reference(policy, ref_forward, batch, temperature, top_p, beta):
    """Per row alone: s_i (score), grad KL_i (k3 to ref_forward's log-probs), KL_i. [B, P], [B, P], [B]."""
    params = [p for p in policy.parameters() if p.requires_grad]
    flat = lambda g: torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1).double()  # noqa: E731
                                for x, p in zip(g, params)])
    S, K, kls = [], [], []
    for i in range(batch.input_ids.shape[0]):
        keep = batch.attention_mask[i].bool()
        ids, m = batch.input_ids[i][keep], batch.response_mask[i][keep][1:].float()
        with torch.no_grad():
            ref_lp = ref_forward(ids, temperature, top_p)
        with torch.enable_grad():
            lp = _token_logprobs(policy, ids, temperature, top_p)
            assert torch.isfinite(lp[m > 0]).all()  # every sampled token lies in the nucleus
            d = torch.where(m > 0, ref_lp - lp, torch.zeros_like(lp))
            kl = ((d.exp() - d - 1) * m).sum()
            S.append(flat(torch.autograd.grad((lp * m).sum(), params, retain_graph=True, allow_unused=True)))
            K.append(flat(torch.autograd.grad(kl, params, allow_unused=True)))
        kls.append(float(kl))
    return torch.stack(S), torch.stack(K), torch.tensor(kls, dtype=torch.float64)


def _run(trainer):
    keep, snap = KeepRounds(trainer), GradSnapshot(lambda: trainer.model)
    trainer.add_callback(snap)
    trainer.train()
    return keep.rounds[0], snap.grads[0]


def _check(trainer, policy, ref_forward, temperature, top_p, beta):
    (batch, res), grad = _run(trainer)
    G = trainer.num_generations
    s, k, kl = _reference(policy, ref_forward, batch, temperature, top_p, beta)
    c = batch.seq_scale.double()
    w_ref = s.pow(2).sum(-1) * c * c
    assert rel_err(res.estimate.weights.reshape(-1), w_ref) < 1e-4
    adv = compute_advantages("oblr", batch.rewards.double(), weights=w_ref.view(-1, G))
    assert adv.abs().max() > 0 and rel_err(res.advantages, adv) < 1e-4
    pg = (-adv.reshape(-1, 1) * c[:, None] * s).sum(0)
    kl_part = beta * (c[:, None] * k).sum(0)
    assert rel_err(grad, pg + kl_part) < 1e-4
    if beta:  # the KL term is large enough here that leaving it out would fail the comparison
        assert kl.min() > 0 and rel_err(pg, pg + kl_part) > 1e-2
        n_tok = batch.response_mask.double().sum()
        assert trainer.state.log_history[0]["oblr/kl"] == pytest.approx(float(kl.sum() / n_tok), rel=1e-4)
    return s, c


def _perturb(params, std=0.05):
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * std)


def test_kl_and_top_p_full_finetuning(trl_model, tmp_path):
    """beta > 0 against TRL's ref_model (the initial weights: checked against a fresh load) and top_p = 0.5
    at temperature 0.7; the policy is moved off its initial weights first so that KL_i and its gradient are not 0."""
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, temperature=0.7, top_p=0.5, beta=BETA)
    initial = load_model_and_tokenizer(trl_model)[0].eval()
    for a, b in zip(trainer.ref_model.state_dict().values(), initial.state_dict().values()):
        assert torch.equal(a, b)
    _perturb([p for p in trainer.model.parameters() if p.requires_grad])
    policy = frozen_copy(trainer, lambda: load_model_and_tokenizer(trl_model)[0])
    s, c = _check(trainer, policy, lambda ids, t, p: _token_logprobs(initial, ids, t, p), 0.7, 0.5, BETA)
    # the nucleus matters at these settings: untruncated scores give other weights
    batch = trainer.oblr_last_round[0]
    full = torch.stack([_token_logprobs(policy, batch.input_ids[i][batch.attention_mask[i].bool()], 0.7, 1.0).sum()
                        for i in range(2)])
    nuc = torch.stack([_token_logprobs(policy, batch.input_ids[i][batch.attention_mask[i].bool()], 0.7, 0.5).sum()
                       for i in range(2)])
    assert (full - nuc).abs().max() > 1e-2


@pytest.mark.parametrize("chunk", [0, 3])
def test_kl_lora_reference_is_the_base_model(trl_model, tmp_path, chunk):
    """With a peft model the reference is the same model with its adapters off (as in TRL); also with the
    output layer in chunks (the adapters-off reference then runs the chunked forward too)."""
    peft = pytest.importorskip("peft")
    model, tok = load_model_and_tokenizer(trl_model)
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    extra = dict(oblr_logit_chunk_tokens=chunk, activation_checkpointing=True) if chunk else {}
    trainer = make_trainer(model, tok, tmp_path, beta=BETA, peft_config=cfg, **extra)
    assert trainer.ref_model is None
    with torch.no_grad():  # B = 0 at init: the adapter would be the identity and KL 0
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    policy = frozen_copy(trainer, lambda: peft.get_peft_model(load_model_and_tokenizer(trl_model)[0], cfg))
    base = load_model_and_tokenizer(trl_model)[0].eval()  # an independent copy of the base weights
    _check(trainer, policy, lambda ids, t, p: _token_logprobs(base, ids, t, p), 1.0, 1.0, BETA)


def test_beta_refused_on_the_deepspeed_path(trl_model, tmp_path):
    model, tok = load_model_and_tokenizer(trl_model)
    trainer = make_trainer(model, tok, tmp_path, beta=BETA)
    trainer._oblr_fold = False  # what DeepSpeed selects (TRL's own loss and backward)
    with pytest.raises(ValueError, match=r"^OBLRGRPOTrainer: beta=0.5 is not supported under DeepSpeed") as e:
        trainer.train()
    assert "\n" not in str(e.value)
