"""The ``hf`` rollout engine: batched sampling from a Hugging Face causal LM with a KV cache, stop at EOS.

:class:`HFEngine` (registered as ``"hf"``) samples with the live policy module of the trainer, so
``sync_weights`` has nothing to do; :func:`generate` is the same loop as a function.

Our own decoding loop over ``model(...)`` with a KV cache (``cache``, ``past_key_values`` before transformers 5.24) (not ``model.generate``): for tiny
models on CPU the cost is per-token Python overhead, and this loop measured faster than ``generate``
(see docs/builtin.md). Positions are derived from the attention mask exactly as in
:func:`oblr.logprobs.position_ids_from_mask`, so left padding gives the same log-probs as the unpadded
sequence.

Output layout (see docs/architecture.md): ``[pad pad prompt | response pad]``, prompts left-padded to a
common length ``P``, responses right-padded to the longest response ``L`` of the whole call, ``T = P + L``.
Rows are prompt-major: row ``k * num_samples + j`` is sample ``j`` of prompt ``k``. ``sampler_logprobs``
holds log q(token), q = softmax(logits / temperature) restricted to the top-p set and renormalised
(None for greedy decoding).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from oblr.checks import INT_MAX, Range
from oblr.rollout.base import RolloutBatch, register_engine

if TYPE_CHECKING:  # annotations only: importing this module does not import torch
    import torch


def _sample(logits: torch.Tensor, *, temperature: float, top_p: float, greedy: bool,
            generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tokens [B], log q(tokens) [B] float32 or None when greedy)``; see :func:`sample_next_token`."""
    import torch

    from oblr.logprobs import sampling_log_probs

    if greedy:
        return logits.argmax(-1), None
    logq_all = sampling_log_probs(logits, temperature=temperature, top_p=top_p)
    tok = torch.multinomial(logq_all.exp(), 1, generator=generator).squeeze(-1)
    return tok, logq_all.gather(-1, tok[:, None]).squeeze(-1)


def sample_next_token(logits: torch.Tensor, *, temperature: float, top_p: float, greedy: bool,
                      generator: torch.Generator | None) -> torch.Tensor:
    """Next token ids [B] from logits [B, V].

    Greedy: argmax. Otherwise softmax(logits / temperature), restricted to the smallest set of most likely
    tokens whose probability reaches ``top_p`` (the top token is always kept), renormalised
    (:func:`oblr.logprobs.sampling_log_probs`), sampled with ``torch.multinomial`` (the global RNG, or
    ``generator``).
    """
    return _sample(logits, temperature=temperature, top_p=top_p, greedy=greedy, generator=generator)[0]


def _generate_chunk(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, *, eos_id: int, pad_id: int,
                    max_new_tokens: int, temperature: float, top_p: float, greedy: bool,
                    generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Responses [b, L'] for one chunk (pad after EOS), L' <= max_new_tokens (stops when all finished), and
    the sampler's log-probs of those tokens [b, L'] (None when greedy)."""
    import torch
    from transformers import DynamicCache

    from oblr.logprobs import position_ids_from_mask

    with torch.no_grad():
        # drop pad columns that every row of this chunk has (exact: they are masked out anyway)
        keep = int(prompt_mask.sum(-1).max())
        ids, mask = prompt_ids[:, -keep:], prompt_mask[:, -keep:]
        b = ids.shape[0]
        device = ids.device
        cache = {_kv_keyword(model): DynamicCache()}  # updated in place by every forward
        pos = position_ids_from_mask(mask)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **cache)
        next_pos = pos[:, -1:] + 1
        done = torch.zeros(b, dtype=torch.bool, device=device)
        tokens, logqs = [], []
        ones = torch.ones(b, 1, dtype=mask.dtype, device=device)
        for step in range(max_new_tokens):
            logits = out.logits[:, -1, :]
            tok, logq = _sample(logits, temperature=temperature, top_p=top_p, greedy=greedy,
                                generator=generator)
            tok = tok.masked_fill(done, pad_id)
            tokens.append(tok)
            logqs.append(logq)
            done = done | (tok == eos_id)
            # one host sync per token to stop early; cheap next to a forward pass
            if step + 1 == max_new_tokens or bool(done.all()):
                break
            mask = torch.cat([mask, ones], dim=1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, use_cache=True,
                        **cache)
            next_pos = next_pos + 1
        return torch.stack(tokens, dim=1), None if greedy else torch.stack(logqs, dim=1)


def _kv_keyword(model) -> str:
    """The forward keyword of the KV cache: ``cache`` where transformers renamed it (5.24 warns on
    ``past_key_values``), else ``past_key_values``. Looks through DDP (``.module``) and peft wrappers."""
    m = model
    for _ in range(4):
        m = getattr(m, "module", m)
        if hasattr(m, "get_base_model"):
            m = m.get_base_model()
    try:
        params = inspect.signature(m.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def check_generate_args(prompts, num_samples, max_new_tokens, temperature, top_p, batch_size) -> None:
    if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, str) for p in prompts):
        raise TypeError("generate: prompts must be a list of strings")
    if len(prompts) == 0:
        raise ValueError("generate: prompts is empty")
    if num_samples < 1:
        raise ValueError(f"generate: num_samples must be >= 1, got {num_samples}")
    if max_new_tokens < 1:
        raise ValueError(f"generate: max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature > 0:
        raise ValueError(f"generate: temperature must be > 0 (use greedy=True for argmax), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"generate: top_p must be in (0, 1], got {top_p}")
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"generate: batch_size must be >= 1 or None, got {batch_size}")


def special_ids(tokenizer) -> tuple[int, int]:
    """``(eos_id, pad_id)``; pad falls back to eos. Raises when the tokenizer has no EOS."""
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    if eos_id is None:
        raise ValueError("generate: the tokenizer has no eos_token_id")
    return eos_id, (eos_id if pad_id is None else pad_id)


def encode_prompts(tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask, [n, P] long each (no special tokens added; pad = :func:`special_ids`)."""
    import torch

    _, pad_id = special_ids(tokenizer)
    enc = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    for k, e in enumerate(enc):
        if len(e) == 0:
            raise ValueError(f"generate: prompt {k} encodes to no tokens: {prompts[k]!r}")
    n, p_len = len(enc), max(len(e) for e in enc)
    prompt_ids = torch.full((n, p_len), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p_len), dtype=torch.long)
    for k, e in enumerate(enc):
        prompt_ids[k, p_len - len(e):] = torch.tensor(e, dtype=torch.long)
        prompt_mask[k, p_len - len(e):] = 1
    return prompt_ids, prompt_mask


def generate(model, tokenizer, prompts: list[str], *, num_samples: int = 1, max_new_tokens: int = 64,
             temperature: float = 1.0, top_p: float = 1.0, greedy: bool = False, batch_size: int | None = None,
             generator_seed: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> RolloutBatch:
    """Sample ``num_samples`` responses per prompt; see :class:`RolloutBatch` for the layout.

    Rows are processed in chunks of ``batch_size`` (all rows at once when None). Sampling draws from
    torch's global RNG unless ``generator_seed`` is given (then from a private generator seeded with it,
    leaving the global RNG untouched). ``progress(rows_done, rows_total)`` is called after each chunk.
    The model is put in eval mode for the call and its previous mode restored.
    """
    import torch

    check_generate_args(prompts, num_samples, max_new_tokens, temperature, top_p, batch_size)
    eos_id, pad_id = special_ids(tokenizer)
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts)
    n, g = len(prompts), num_samples
    rows_ids = prompt_ids.repeat_interleave(g, dim=0).to(device)
    rows_mask = prompt_mask.repeat_interleave(g, dim=0).to(device)
    total = n * g
    bs = total if batch_size is None else batch_size
    gen = None
    if generator_seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(int(generator_seed))

    was_training = model.training
    model.eval()
    chunks = []
    try:
        for start in range(0, total, bs):
            sl = slice(start, min(start + bs, total))
            chunks.append(_generate_chunk(
                model, rows_ids[sl], rows_mask[sl], eos_id=eos_id, pad_id=pad_id,
                max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, greedy=greedy,
                generator=gen))
            if progress is not None:
                progress(sl.stop, total)
    finally:
        model.train(was_training)

    return assemble_batch(chunks, rows_ids, rows_mask, tokenizer, eos_id=eos_id, pad_id=pad_id, num_samples=g)


def assemble_batch(chunks: list[tuple[torch.Tensor, torch.Tensor | None]], rows_ids: torch.Tensor,
                   rows_mask: torch.Tensor, tokenizer, *, eos_id: int, pad_id: int,
                   num_samples: int) -> RolloutBatch:
    """The :class:`RolloutBatch` of sampled token ids, for any engine. ``chunks``: ``(responses [b, L'],
    sampler log-probs [b, L'] float32 or None)`` per chunk, rows in order; they are padded to a common length,
    each row cut after its first EOS, the masks built and the texts decoded. ``rows_ids``/``rows_mask``
    [B, P]: the left-padded prompt of every row."""
    import torch

    total, device = rows_ids.shape[0], rows_ids.device
    width = max(c.shape[1] for c, _ in chunks)
    resp = torch.full((total, width), pad_id, dtype=torch.long, device=device)
    logq = None if chunks[0][1] is None else torch.zeros((total, width), dtype=torch.float32, device=device)
    row = 0
    for c, lq in chunks:
        resp[row:row + c.shape[0], :c.shape[1]] = c
        if logq is not None:
            logq[row:row + c.shape[0], :c.shape[1]] = lq
        row += c.shape[0]
    is_eos = resp == eos_id
    finished = is_eos.any(-1)
    cols = torch.arange(width, device=device)
    first_eos = torch.where(finished, is_eos.long().argmax(-1), torch.full_like(finished, width, dtype=torch.long))
    # length counts tokens up to and including the first EOS; unfinished rows use every column
    lengths = torch.where(finished, first_eos + 1, torch.full_like(first_eos, width))
    resp_mask = (cols[None, :] < lengths[:, None]).long()
    resp = torch.where(resp_mask.bool(), resp, torch.full_like(resp, pad_id))
    texts = tokenizer.batch_decode([r[:int(n_)].tolist() for r, n_ in zip(resp.cpu(), lengths.cpu())],
                                   skip_special_tokens=True)
    p_len = rows_ids.shape[1]
    sampler_logprobs = None
    if logq is not None:
        sampler_logprobs = torch.cat([torch.zeros_like(rows_mask, dtype=torch.float32),
                                      torch.where(resp_mask.bool(), logq, torch.zeros_like(logq))], dim=1)
    batch = RolloutBatch(
        input_ids=torch.cat([rows_ids, resp], dim=1),
        attention_mask=torch.cat([rows_mask, resp_mask], dim=1),
        response_mask=torch.cat([torch.zeros_like(rows_mask), resp_mask], dim=1),
        group_ids=torch.arange(total, device=device) // num_samples,
        responses=list(texts),
        response_lengths=lengths,
        finished=finished,
        prompt_length=p_len,
        sampler_logprobs=sampler_logprobs,
    )
    return batch


@register_engine("hf")
class HFEngine:
    """The in-process engine: :func:`generate` with the live policy module (``batch_size``: rows per
    decoding chunk, None = all at once). ``sync_weights`` only records which module to sample with."""

    def __init__(self, model, tokenizer, *, batch_size: Annotated[int | None, Range(ge=1, le=INT_MAX)] = None):
        # the annotation is checked by make_engine and the config (and generate checks it again)
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    def generate(self, prompts: list[str], *, num_samples: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, greedy: bool = False, seed: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> RolloutBatch:
        import torch

        with torch.no_grad():
            return generate(self.model, self.tokenizer, prompts, num_samples=num_samples,
                            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, greedy=greedy,
                            batch_size=self.batch_size, generator_seed=seed, progress=progress)

    def sync_weights(self, model) -> None:
        self.model = model  # the same module object in the trainer: nothing to copy

    def close(self) -> None:
        pass
