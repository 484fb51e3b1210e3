"""What fits a per-GPU budget: the resident state under FSDP2 (``resident_bytes``), what one more sequence
costs, and the largest micro-batch under a budget (``max_micro_batch``; pure functions)."""

from __future__ import annotations

from .activations import activation_bytes
from .assembly import assembly_bytes
from .phases import phase_bytes
from .shapes import Shape, layer_params, n_params

GIB = 2**30


def per_sequence_bytes(s: Shape, plan: str, tokens: int, act_bytes: int = 2, logit_chunk: int = 0) -> int:
    """What one more sequence in the micro-batch costs: activations (``act_bytes``) + float32 logits. The
    exact-norm assembly's working set is a cost of the micro-batch, not of a sequence: :func:`max_micro_batch`
    sets it aside."""
    return activation_bytes(s, plan, 1, tokens, act_bytes) + max(
        v for k, v in phase_bytes(s, plan, 1, tokens, act_bytes, grad_bytes=0, logit_chunk=logit_chunk,
                                  assembly_work=False).items())


def resident_bytes(s: Shape, world: int = 8, param_bytes: int = 2, grad_bytes: int = 2, optim_bytes: int = 12) -> int:
    """FSDP2 over ``world`` GPUs: sharded bf16 parameters and gradients, fp32 AdamW state (``optim_bytes`` per
    parameter: master copy and two moments, 12 bytes), plus two gathered layers (one computing, one prefetched)
    and the gathered embedding (and ``lm_head`` if untied) in ``param_bytes``."""
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    sharded = n_params(s) * (param_bytes + grad_bytes + optim_bytes) // world
    gathered = (2 * layer_params(s) + s.vocab * s.hidden * (1 if s.tied else 2)) * param_bytes
    return sharded + gathered


def max_micro_batch(s: Shape, plan: str, tokens: int, budget_bytes: float, world: int = 8,
                    logit_chunk: int = 0) -> int:
    """Largest micro-batch (sequences) whose predicted peak fits ``budget_bytes`` per GPU (0 if none): the
    budget less the resident state and, for the one-pass and recompute plans, one group's assembly working set
    (:func:`assembly_bytes` of its largest entry), divided by :func:`per_sequence_bytes`."""
    free = budget_bytes - resident_bytes(s, world)
    if plan in ("oblr", "oblr_recompute"):
        free -= assembly_bytes(s, 1, tokens, 1, 2, grad_bytes=0, logit_chunk=logit_chunk)
    return max(0, int(free // per_sequence_bytes(s, plan, tokens, logit_chunk=logit_chunk)))
