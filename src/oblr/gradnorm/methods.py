"""The gradient-norm methods by name (registry :data:`NORMS_METHODS`, config key ``algorithm.norms_method``) and
the exact-norm engines for a model with activation checkpointing on (:data:`CHECKPOINTED_ENGINES`, config key
``algorithm.checkpointed_engine``).

Torch-free, so the config's choices load without the engine; :class:`oblr.gradnorm.onepass.BookKeeper`
implements each method, and :data:`oblr.gradnorm.engine.ENGINES` holds the engines themselves by name (its
checkpointed entries are exactly :data:`CHECKPOINTED_ENGINES`).
"""

from __future__ import annotations

from oblr.registry import Registry

# name -> what it does (the BookKeeper implements each)
NORMS_METHODS = Registry("gradient-norm method")
NORMS_METHODS.register("auto", "one backward; ghost norm or materialisation per parameter, whichever is cheaper")
NORMS_METHODS.register("ghost", "one backward; ghost norms wherever the rule allows")
NORMS_METHODS.register("materialize", "one backward; per-row gradients materialised")
NORMS_METHODS.register("loop", "slow exact reference: one backward per sequence")
METHODS = tuple(NORMS_METHODS.names())

# name -> what it does (:func:`oblr.gradnorm.make_book` builds ENGINES[name] when activation checkpointing is on)
CHECKPOINTED_ENGINES = Registry("checkpointed exact-norm engine")
CHECKPOINTED_ENGINES.register("two_pass", "TwoPassBookKeeper: a norm pass keeping per-prompt Grams only, then a "
                                          "second (ordinary) backward for the gradient")
CHECKPOINTED_ENGINES.register("recompute", "RecomputeBookKeeper: one backward; each recomputed layer's per-row "
                                           "contributions are kept (up to B x the trainable parameters in float32)")
