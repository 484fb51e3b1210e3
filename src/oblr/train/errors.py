""":class:`TrainingError`: a run that stopped for a reason the CLI reports in one line (a full disk, non-finite
steps, a damaged metrics record with nothing to re-run it from), with what is still intact."""


class TrainingError(RuntimeError):
    pass
