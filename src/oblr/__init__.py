"""oblr: OBLR-PO (Optimal Baseline and Learning-Rate Policy Optimization) for RL post-training of LLMs.

Public entry points live in submodules so that importing :mod:`oblr` stays cheap:

- :mod:`oblr.estimators` -- baselines and advantages for every method, by name.
- :mod:`oblr.gradnorm`   -- exact per-sequence gradient norms in one batched backward pass.
- :mod:`oblr.snr`        -- signal/noise statistics and the SNR learning-rate controller.
"""

__version__ = "0.1.0"
