"""Tracking a run: metric sinks, the live progress display, and the figure helpers.

- :mod:`oblr.tracking.metrics` -- ``metrics.jsonl`` (always), TensorBoard and W&B (when asked):
  :class:`MetricsLogger`, :func:`read_metrics`;
- :mod:`oblr.tracking.progress` -- progress lines for training and long loops: :class:`ProgressDisplay`,
  :func:`progress`;
- :mod:`oblr.tracking.plots` -- matplotlib helpers (Agg canvas, no pyplot) shared by the run and
  comparison figures of :mod:`oblr.experiments`.
"""

from oblr.tracking.metrics import METRICS_FILE, MetricsLogger, metrics_path, read_metrics, to_json_record
from oblr.tracking.progress import ProgressDisplay, format_duration, progress

__all__ = ["METRICS_FILE", "MetricsLogger", "ProgressDisplay", "format_duration", "metrics_path", "progress",
           "read_metrics", "to_json_record"]
