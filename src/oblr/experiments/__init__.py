"""Experiments over many runs: grids of runs, comparison tables and plots, reports, the proxy study.

- :mod:`oblr.experiments.grid` -- grid files (base config x variants x seeds) and the reuse/resume plan;
- :mod:`oblr.experiments.runner` -- :func:`run_grid` and the ``oblr compare | report | proxy-study`` CLI;
- :mod:`oblr.experiments.compare` -- per-run statistics and ``mean ± std`` over seeds, seed-band plots;
- :mod:`oblr.experiments.report` -- the figures of one run and ``oblr report`` from run folders;
- :mod:`oblr.experiments.stats` -- reading run folders and the statistics of one series;
- :mod:`oblr.experiments.proxy_study` -- exact w_i against the length and logit-energy proxies.
"""
