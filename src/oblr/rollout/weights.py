"""The trainer's weights named as in its checkpoint, for pushing into an inference engine (LoRA merged).

An engine that holds its own copy of the model (vLLM) takes ``(name, tensor)`` pairs in the checkpoint's
naming -- the names ``save_pretrained`` writes, e.g. ``model.layers.0.self_attn.q_proj.weight`` -- and
loads them with its own loader. A PEFT LoRA model is pushed as merged weights ``W + scaling * B @ A`` per
adapted layer, computed here without touching the trained model (no merge/unmerge round trip, which
would not give back the same floats).
"""

from __future__ import annotations

import torch

_UNSUPPORTED_PEFT = (".lora_magnitude_vector", ".modules_to_save.", ".original_module.")


def _lora_layers(base) -> dict[str, torch.nn.Module]:
    """Module name -> PEFT LoRA layer (a module with ``base_layer`` and ``get_delta_weight``)."""
    return {name: m for name, m in base.named_modules()
            if hasattr(m, "base_layer") and hasattr(m, "get_delta_weight") and hasattr(m, "active_adapters")}


def checkpoint_weights(model) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every entry of the model's state dict, named as in its checkpoint, detached.

    Plain model: ``model.state_dict()`` (tied weights appear under both names; loaders skip the tied one).
    PEFT LoRA model: the base model's entries with ``.base_layer.`` dropped from the names, adapter tensors
    left out, and each adapted weight replaced by ``W + sum_a get_delta_weight(a)`` over the active adapters
    (unless the adapter is already merged into ``W``). DoRA and ``modules_to_save`` raise: not supported.
    """
    if not hasattr(model, "peft_config"):
        return [(k, v.detach()) for k, v in model.state_dict().items()]
    base = model.get_base_model()
    layers = _lora_layers(base)
    out = []
    with torch.no_grad():
        for key, value in base.state_dict().items():
            if any(s in key for s in _UNSUPPORTED_PEFT):
                raise NotImplementedError(f"pushing PEFT weights: {key!r} (DoRA or modules_to_save) is not "
                                          f"supported; use plain LoRA adapters")
            if ".lora_" in key:
                continue
            mod_name, sep, leaf = key.rpartition(".base_layer.")
            if not sep:
                out.append((key, value.detach()))
                continue
            layer, name = layers[mod_name], f"{mod_name}.{leaf}"
            if leaf == "weight" and not getattr(layer, "merged", False):
                value = value.detach().clone()
                for a in layer.active_adapters:
                    if a in getattr(layer, "lora_A", {}):
                        value += layer.get_delta_weight(a).to(value.dtype)
            out.append((name, value.detach()))
    return out
