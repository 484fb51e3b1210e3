"""Tracking a run: metric sinks, the live progress display, and the figure helpers.

- :mod:`oblr.tracking.metrics` -- ``metrics.jsonl`` (always), TensorBoard and W&B (when asked):
  :class:`MetricsLogger` (:class:`NullLogger` on ranks other than 0), :func:`read_metrics`;
- :mod:`oblr.tracking.progress` -- progress lines for training and long loops: :class:`ProgressDisplay`,
  :func:`progress`;
- :mod:`oblr.tracking.sinks` -- a training run's logger and progress display, opened and closed together;
- :mod:`oblr.tracking.plots` -- matplotlib helpers (Agg canvas, no pyplot) shared by the run and
  comparison figures of :mod:`oblr.experiments`.
"""

from oblr.tracking.metrics import (
           METRICS_FILE,
           MetricsLogger,
           NullLogger,
           metrics_path,
           read_metrics,
           to_json_record,
)
from oblr.tracking.progress import ProgressDisplay, format_duration, progress

__all__ = ["METRICS_FILE", "MetricsLogger", "NullLogger", "ProgressDisplay", "format_duration", "metrics_path",
           "progress", "read_metrics", "to_json_record"]
