"""The rules between config keys that need no model: an optional metric sink's package
(:func:`sink_problems`), the memory plan's keys (:func:`plan_problems`; the plan itself is
:mod:`oblr.train.plan`) and ``model.logit_chunk_tokens`` (:func:`chunk_problems`). Each returns
``[(key, problem)]``; :func:`oblr.config_validate.validate` reports them."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oblr.config_schema import TrainConfig


# the optional metric sinks of a run: config key of TrainConfig -> the package it needs (oblr's extra of that name)
SINK_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def sink_problems(train: TrainConfig) -> list[tuple[str, str]]:
    """``[(key, why)]`` for each optional sink that ``train`` turns on whose package is not installed here;
    checked with ``importlib.util.find_spec`` (no import), so a refusal costs nothing and ``--help`` stays light."""
    out = []
    for name, package in SINK_PACKAGES.items():
        if getattr(train, name) and importlib.util.find_spec(package) is None:
            out.append((f"train.{name}", f"needs the '{package}' package, which this environment lacks: "
                                         f"pip install 'oblr[{package}]' (or leave train.{name}=false)"))
    return out


# ------------------------------ the memory plan's keys, between them (the plan itself: oblr.train.plan)
def uses_exact_norms(cfg) -> bool:
    """Whether a step of ``cfg`` takes the book-keeping path (exact weights, or S and V for the schedule or
    ``algorithm.track_snr``) -- the one the exact-norm engines serve (:mod:`oblr.update`)."""
    from oblr.estimators import get_estimator
    from oblr.schedules import SCHEDULES

    a = cfg.algorithm
    return (get_estimator(a.baseline).weights == "exact" or a.track_snr
            or bool(getattr(SCHEDULES.get(a.lr_schedule), "needs_snr", False)))


def plan_problems(cfg) -> list[tuple[str, str]]:
    """``[(key, problem)]`` of the planning keys that need no model (called by :func:`validate` once
    ``algorithm.memory_plan`` is a registered name; the plan itself is :mod:`oblr.train.plan`)."""
    a, out = cfg.algorithm, []
    plan, budget = a.memory_plan, a.memory_budget_gb
    if a.checkpointed_engine == "recompute" and a.norms_method == "loop":
        out.append(("algorithm.checkpointed_engine", "'recompute' is not used with algorithm.norms_method=loop: the "
                    "loop reference runs one backward per sequence on the one-pass engine; set norms_method=auto "
                    "(or ghost / materialize), or leave this key at two_pass"))
    if plan == "none":
        if budget is not None and budget > 0:  # a budget out of range is reported by its range
            out.append(("algorithm.memory_budget_gb", f"a budget ({budget:g} GB) is set but algorithm.memory_plan is "
                        "'none'; set algorithm.memory_plan=auto (or one_pass / recompute / two_pass) to plan under "
                        "it"))
        if a.checkpointed_engine != "two_pass" and not cfg.model.activation_checkpointing:
            out.append(("algorithm.checkpointed_engine", f"{a.checkpointed_engine!r} is the engine used with "
                        "activation checkpointing, but model.activation_checkpointing is false; set it true (or "
                        f"algorithm.memory_plan={a.checkpointed_engine}), or leave this key at two_pass"))
        return out + chunk_problems(cfg)
    if plan in ("one_pass", "recompute", "two_pass"):
        try:
            exact = uses_exact_norms(cfg)
        except (KeyError, ValueError):  # an unknown baseline or schedule is reported on its own
            exact = True
        if not exact:
            out.append(("algorithm.memory_plan", f"{plan!r} chooses an exact-norm engine, but baseline "
                        f"{a.baseline!r} with lr_schedule {a.lr_schedule!r} computes no exact norms; use "
                        "memory_plan=auto (it then chooses the micro-batch) and set model.activation_checkpointing"))
    if plan == "one_pass" and cfg.model.activation_checkpointing:
        out.append(("algorithm.memory_plan", "'one_pass' keeps every layer's activations, but "
                    "model.activation_checkpointing is true; use recompute, two_pass or auto, or turn checkpointing "
                    "off"))
    if plan == "recompute" and a.norms_method != "auto":
        out.append(("algorithm.memory_plan", f"'recompute' is priced for algorithm.norms_method=auto (which keeps "
                    f"per-row gradients where they are smaller than their factors); with {a.norms_method!r} it "
                    "keeps every weight's factors, which the memory model does not price; use norms_method=auto, "
                    "or memory_plan two_pass"))
    if plan in ("auto", "one_pass", "recompute", "two_pass") and a.checkpointed_engine not in ("two_pass", plan):
        out.append(("algorithm.checkpointed_engine", f"{a.checkpointed_engine!r} contradicts algorithm.memory_plan "
                    f"{plan!r}, which sets the engine itself; leave this key at two_pass"
                    + (f" (or set memory_plan={a.checkpointed_engine} to use that engine)" if plan == "auto" else "")))
    return out + chunk_problems(cfg)


def chunk_problems(cfg) -> list[tuple[str, str]]:
    """``[(key, problem)]`` of ``model.logit_chunk_tokens`` against the other keys (no model needed)."""
    from oblr.estimators import get_estimator

    a, m = cfg.algorithm, cfg.model
    if not m.logit_chunk_tokens:
        return []
    key = "model.logit_chunk_tokens"
    try:
        exact, weights = uses_exact_norms(cfg), get_estimator(a.baseline).weights
    except (KeyError, ValueError):  # an unknown baseline or schedule is reported on its own
        return []
    if weights == "logit_energy":
        return [(key, f"baseline {a.baseline!r} weighs outputs by their whole logits, which chunking never "
                 "holds; set it to 0")]
    if exact and a.norms_method == "loop":
        return [(key, "the loop reference (algorithm.norms_method=loop) runs on the one-pass engine, and chunked "
                 "logits need the two-pass engine; use another norms_method, or set it to 0")]
    if exact and a.memory_plan == "one_pass":
        return [(key, "chunked logits need a checkpointed engine (the one-pass engine keeps every chunk's logit "
                 "gradients anyway); use algorithm.memory_plan recompute, two_pass or auto, or set it to 0")]
    if exact and not m.activation_checkpointing and a.memory_plan not in ("recompute", "two_pass", "auto"):
        return [(key, "with exact norms chunked logits need a checkpointed engine: set "
                 "model.activation_checkpointing=true (or algorithm.memory_plan recompute / two_pass / auto), or set "
                 "it to 0")]
    return []
