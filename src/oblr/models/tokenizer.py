"""The built-in character-level tokenizer, made with the ``tokenizers`` library.

Every character is one token, except the multi-character tokens ``"####"``, ``"Q:"`` and ``"A:"``
(matched first, longest first). Characters outside the vocabulary map to ``<unk>``. Decoding
concatenates tokens with no separator, so ``decode(encode(s)) == s`` for any text over the vocabulary.
No special token is added on encoding (like Qwen3's tokenizer); ``<eos>`` ends a response and ``<pad>``
pads a batch.

The tokenizer is wrapped as a ``PreTrainedTokenizerFast`` and saved with ``save_pretrained``, so
``AutoTokenizer.from_pretrained`` loads it like any Hugging Face tokenizer.
"""

from __future__ import annotations

import re

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, EOS, UNK]
MULTI_CHAR_TOKENS = ["####", "Q:", "A:"]
CHARS = list("0123456789") + list("+-*/()=# \n") + list("QA:")

#: the model's embedding size; the vocabulary is padded up to it (unused rows are never produced)
MODEL_VOCAB_SIZE = 32


def vocabulary(extra_chars: str = "", size: int = MODEL_VOCAB_SIZE) -> dict[str, int]:
    """Token -> id. Special tokens first (pad=0, eos=1, unk=2); ``extra_chars`` (one token each) after
    :data:`CHARS`, for a task whose text needs more characters (``size``: the model's vocabulary)."""
    tokens = SPECIAL_TOKENS + MULTI_CHAR_TOKENS + CHARS + list(extra_chars)
    if len(set(tokens)) != len(tokens):
        raise ValueError("duplicate token in the built-in vocabulary")
    if len(tokens) > size:
        raise ValueError(f"vocabulary of {len(tokens)} exceeds the model's vocabulary size {size}")
    return {t: i for i, t in enumerate(tokens)}


def build_tokenizer(extra_chars: str = "", size: int = MODEL_VOCAB_SIZE):
    """A ``PreTrainedTokenizerFast`` over :func:`vocabulary`, ``padding_side="left"``."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=vocabulary(extra_chars, size), unk_token=UNK))
    multi = "|".join(re.escape(t) for t in sorted(MULTI_CHAR_TOKENS, key=len, reverse=True))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{multi}|[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, padding_side="left",
        model_max_length=512, clean_up_tokenization_spaces=False,
    )
    return fast
