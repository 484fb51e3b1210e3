"""A third-party plugin as a user would write it: registers an estimator (tests load it with --plugin)."""

import torch

from oblr.estimators import register_estimator

NAME = "test_plugin_zero"


@register_estimator(NAME)
def zero_baseline(rewards, weights=None):
    """b = 0, under a name oblr does not know."""
    return torch.zeros_like(rewards)
