"""The rollout engine seam: the registry, the hf engine against the generate loop, the sampler's log-probs
against the distribution that sampled (temperature and top-p), and generate_and_score's row alignment."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_qwen3

from oblr.logprobs import forward_logits
from oblr.models.tokenizer import MODEL_VOCAB_SIZE, build_tokenizer
from oblr.rollout import ENGINES, RolloutEngine, generate, generate_and_score, make_engine, register_engine
from oblr.tasks import Example

PROMPTS = ["Q: 1+2\nA:", "Q: (17+5)*3-8\nA:", "Q: 9\nA:"]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model():
    m = tiny_qwen3(vocab_size=MODEL_VOCAB_SIZE, hidden=32, layers=2, seed=2)
    with torch.no_grad():
        m.get_input_embeddings().weight[1] *= 4.0  # id 1 is <eos>: some rows stop early
    return m


def test_registry_and_protocol(model, tok):
    assert "hf" in ENGINES.names()
    engine = make_engine("hf", model, tok, batch_size=4)
    assert isinstance(engine, RolloutEngine)
    with pytest.raises(ValueError, match="unknown rollout engine 'nope'; registered: hf"):
        make_engine("nope", model, tok)
    with pytest.raises(ValueError, match="already registered"):
        register_engine("hf")(object)
    engine.sync_weights(model)
    engine.close()


def test_hf_engine_is_the_generate_loop(model, tok):
    engine = make_engine("hf", model, tok, batch_size=4)
    a = engine.generate(PROMPTS, num_samples=3, max_new_tokens=8, seed=5)
    b = generate(model, tok, PROMPTS, num_samples=3, max_new_tokens=8, batch_size=4, generator_seed=5)
    assert torch.equal(a.input_ids, b.input_ids) and a.responses == b.responses
    torch.manual_seed(9)
    c = engine.generate(PROMPTS, num_samples=2, max_new_tokens=6)  # seed=None: the global RNG
    torch.manual_seed(9)
    d = generate(model, tok, PROMPTS, num_samples=2, max_new_tokens=6, batch_size=4)
    assert torch.equal(c.input_ids, d.input_ids)


def _sampler_reference(model, batch, temperature: float, top_p: float) -> torch.Tensor:
    """log q(token) from a full forward: softmax(logits / T) restricted to the top-p set, renormalised."""
    with torch.no_grad():
        logits = forward_logits(model, batch.input_ids, batch.attention_mask)[:, :-1].float()
    probs = torch.softmax(logits / temperature, -1)
    if top_p < 1:
        sp, idx = probs.sort(-1, descending=True)
        sp = sp.masked_fill(sp.cumsum(-1) - sp >= top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, idx, sp)
    probs = probs / probs.sum(-1, keepdim=True)
    lq = probs.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1).log()
    return torch.nn.functional.pad(lq, (1, 0)) * batch.response_mask


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_sampler_logprobs_are_those_of_the_sampling_distribution(model, tok, temperature, top_p):
    engine = make_engine("hf", model, tok, batch_size=5)
    b = engine.generate(PROMPTS, num_samples=3, max_new_tokens=10, temperature=temperature, top_p=top_p, seed=3)
    assert b.sampler_logprobs.shape == b.input_ids.shape and b.sampler_logprobs.dtype == torch.float32
    assert (b.sampler_logprobs[b.response_mask == 0] == 0).all()
    assert (b.sampler_logprobs[b.response_mask.bool()] <= 0).all()
    ref = _sampler_reference(model, b, temperature, top_p)
    m = b.response_mask.bool()
    torch.testing.assert_close(b.sampler_logprobs[m], ref[m], atol=2e-4, rtol=1e-4)


def test_greedy_has_no_sampler_logprobs(model, tok):
    b = make_engine("hf", model, tok).generate(PROMPTS, num_samples=1, max_new_tokens=5, greedy=True)
    assert b.sampler_logprobs is None


def test_generate_and_score_aligns_rows_with_examples(model, tok):
    examples = [Example(prompt=p, answer=str(k)) for k, p in enumerate(PROMPTS)]
    seen = {}

    def score(responses, rows):
        seen["rows"] = rows
        return torch.tensor([float(len(r)) for r in responses])

    batch, scores = generate_and_score(make_engine("hf", model, tok), examples, score, num_samples=2,
                                       max_new_tokens=4, seed=0)
    assert [r.answer for r in seen["rows"]] == ["0", "0", "1", "1", "2", "2"]
    assert scores.tolist() == [float(len(r)) for r in batch.responses]


def test_a_registered_engine_is_built_by_name(model, tok):
    class Echo:
        def __init__(self, model, tokenizer, *, batch_size=None, prefix="x"):
            self.inner = make_engine("hf", model, tokenizer, batch_size=batch_size)
            self.synced = 0

        def generate(self, prompts, **kw):
            return self.inner.generate(prompts, **kw)

        def sync_weights(self, model):
            self.synced += 1

        def close(self):
            pass

    register_engine("test_echo")(Echo)
    try:
        engine = make_engine("test_echo", model, tok, batch_size=2, prefix="y")
        assert isinstance(engine, Echo) and engine.generate(PROMPTS, num_samples=1, max_new_tokens=2, seed=0)
    finally:
        ENGINES.unregister("test_echo")
