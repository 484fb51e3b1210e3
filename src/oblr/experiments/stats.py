"""Numbers from run folders: the statistics of a metric series that reports use.

Pure numpy, no plotting; :mod:`oblr.experiments.report` and :mod:`oblr.experiments.compare` build on it.
Reading a run folder (merged per-step records, a key's series, config.yaml, the run's label) is
:mod:`oblr.tracking.runs`; its names are exported here too.

Definitions (all over the *finite* values of a series, ordered by step):
- final: the last value;  best: the maximum and the first step reaching it;
- normalised AUC: ``trapz(values, steps) / (steps[-1] - steps[0])``, i.e. the time-average of the
  curve over the logged range (the single value when only one point exists);
- steps to target: the first step whose value is ``>= target`` (None when never reached);
- spikes: values ``v_t > factor * median(v_{t-window} .. v_{t-1})`` once at least ``min_history``
  earlier values exist (the running median of the *previous* values, so a spike does not hide itself).

Across seeds, two rows' final accuracies are compared by Welch's t-test (:func:`welch`): the difference of means,
its standard error ``sqrt(s_a^2 / n_a + s_b^2 / n_b)``, the Welch-Satterthwaite degrees of freedom and the
two-sided critical value of Student's t (:func:`t_quantile`, pure Python: the regularized incomplete beta by its
continued fraction, inverted by bisection). With 3 seeds a side the 5 % critical value is 2.8 (equal spreads) to
4.3 (one side's spread dominating), with 5 seeds 2.3 to 2.8, not 2. The paired test on the seeds two rows
share (:func:`paired`) and the correlation a seed induces between them (:func:`seed_correlation`) check it.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

import numpy as np

from oblr.tracking.runs import config_value, load_run, merge_by_step, run_config, run_label, series

__all__ = [
    "Welch",
    "auc_normalized",
    "best",
    "config_value",
    "finite_series",
    "last_finite",
    "load_run",
    "merge_by_step",
    "paired",
    "run_config",
    "run_label",
    "seed_correlation",
    "series",
    "spike_count",
    "split_by_settings",
    "steps_to_target",
    "t_cdf",
    "t_quantile",
    "welch",
]


def finite_series(rows: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """:func:`series` without NaN/Inf entries."""
    s, v = series(rows, key)
    ok = np.isfinite(v)
    return s[ok], v[ok]


def last_finite(values: np.ndarray) -> float:
    v = values[np.isfinite(values)]
    return float(v[-1]) if v.size else math.nan


def best(steps: np.ndarray, values: np.ndarray) -> tuple[float, int | None]:
    """(max finite value, first step reaching it); (nan, None) when there is none."""
    ok = np.isfinite(values)
    if not ok.any():
        return math.nan, None
    v, s = values[ok], steps[ok]
    i = int(np.argmax(v))
    return float(v[i]), int(s[i])


def auc_normalized(steps: np.ndarray, values: np.ndarray) -> float:
    """Time-averaged value ``trapz(values, steps) / (steps[-1] - steps[0])`` over finite points."""
    ok = np.isfinite(values)
    s, v = steps[ok].astype(np.float64), values[ok]
    if v.size == 0:
        return math.nan
    if v.size == 1 or s[-1] == s[0]:
        return float(v.mean())
    area = float(np.sum((v[1:] + v[:-1]) * np.diff(s)) / 2.0)
    return area / float(s[-1] - s[0])


def steps_to_target(steps: np.ndarray, values: np.ndarray, target: float) -> int | None:
    """First step with ``value >= target``; None when never reached (or target is NaN)."""
    if target is None or not math.isfinite(target):
        return None
    hit = np.nonzero(np.isfinite(values) & (values >= target))[0]
    return int(steps[hit[0]]) if hit.size else None


def spike_count(values: np.ndarray, factor: float = 3.0, window: int = 20, min_history: int = 5) -> int:
    """Number of finite values above ``factor`` x the median of up to ``window`` previous finite values."""
    if window < 1 or min_history < 1:
        raise ValueError(f"window and min_history must be >= 1, got {window}, {min_history}")
    v = values[np.isfinite(values)]
    count = 0
    for t in range(min_history, v.size):
        if v[t] > factor * float(np.median(v[max(0, t - window):t])):
            count += 1
    return count


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def split_by_settings(labels: dict, settings: dict) -> tuple[dict, dict[str, list[str]]]:
    """Keep runs that share a row label but differ in settings in separate rows.

    ``labels``: run -> row label; ``settings``: run -> flat ``{dotted key: value}`` of what the run was asked to
    do (the seed and output paths left out), or None when unknown (no config.yaml). Returns ``(rows, differ)``:
    ``rows`` maps each run to its row label -- the label itself where all runs of the label share their
    settings, else ``"<label> [k=v, ...]"`` over the keys that differ (a key a run lacks counts as a value of
    its own; ``[no config.yaml]`` for runs of unknown settings) -- and ``differ`` maps each label whose runs
    differ to those keys, sorted (``"config.yaml"`` among them when only some runs have one).
    """
    missing = "<unset>"
    by_label: dict[str, list] = {}
    for run, label in labels.items():
        by_label.setdefault(label, []).append(run)
    rows, differ = {}, {}
    for label, runs in by_label.items():
        known = [r for r in runs if settings.get(r) is not None]
        keys = sorted({k for r in known for k in settings[r]})
        keys = [k for k in keys if len({_canon(settings[r].get(k, missing)) for r in known}) > 1]
        unknown = len(known) < len(runs)
        if not keys and not (unknown and known):
            rows.update((r, label) for r in runs)
            continue
        differ[label] = sorted([*keys, *(["config.yaml"] if unknown and known else [])])
        used: dict[str, str] = {}  # row label -> the settings it stands for (two settings never share a label)
        for r in runs:
            if settings.get(r) is None:
                fingerprint, name = "", f"{label} [no config.yaml]"
            else:
                values = [(k, settings[r].get(k, missing)) for k in keys]
                fingerprint = _canon(values)
                name = f"{label} [" + ", ".join(f"{k}={_short_value(v)}" for k, v in values) + "]" if keys else label
            base, i = name, 2
            while used.setdefault(name, fingerprint) != fingerprint:
                name, i = f"{base} #{i}", i + 1
            rows[r] = name
    return rows, differ


def _short_value(value: Any, limit: int = 40) -> str:
    text = value if isinstance(value, str) else _canon(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz; converges for
    ``x < (a + 1) / (a + b + 2)``)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


#: above this many degrees of freedom t is the standard normal to better than 1e-7 (and the beta function's
#: log-gamma terms would cancel badly)
NORMAL_DF = 1e7


def _normal_cdf(t: float) -> float:
    return 0.5 * math.erfc(-t / math.sqrt(2.0))


def _upper_tail(t: float, df: float) -> float:
    """``P(T > t)`` for ``t >= 0``, computed directly (not as ``1 - cdf``, which loses the far tail)."""
    if df > NORMAL_DF:
        return 0.5 * math.erfc(t / math.sqrt(2.0))
    x = df / (df + t * t) if t < 1e150 else (df / t) / t  # t * t would overflow
    return 0.5 * _betainc(df / 2.0, 0.5, x)


def t_cdf(t: float, df: float) -> float:
    """Student's t distribution function with ``df > 0`` degrees of freedom (not necessarily whole; ``inf`` and
    anything above :data:`NORMAL_DF` is the standard normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    tail = _upper_tail(abs(t), df)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (``0 < p < 1``): bisection on the upper
    tail ``min(p, 1 - p)`` (so a far tail keeps its precision) to about 1e-10 relative."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if p == 0.5:
        return 0.0
    q = min(p, 1.0 - p)
    lo, hi = 0.0, 1.0
    while _upper_tail(hi, df) > q:
        lo, hi = hi, 2.0 * hi
    for _ in range(400):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _upper_tail(mid, df) > q else (lo, mid)
        if hi - lo < 1e-11 * hi:
            break
    t = 0.5 * (lo + hi)
    return t if p > 0.5 else -t


class Welch(NamedTuple):
    """A t comparison of means: ``diff = mean(a) - mean(b)``, its standard error ``se``, the degrees of freedom
    ``df`` and the two-sided critical value ``critical`` at the test's level (``|diff| > critical * se``: the means
    differ beyond seed noise). :func:`welch` makes one from two samples (Welch-Satterthwaite ``df``),
    :func:`paired` from the seeds two rows share (``df = n - 1``)."""

    diff: float
    se: float
    df: float
    critical: float

    @property
    def interval(self) -> tuple[float, float]:
        """The difference's confidence interval at the test's level, ``diff ± critical x se``: the differences
        the seeds do not rule out (a "within noise" row can still be this far ahead or behind)."""
        return self.diff - self.critical * self.se, self.diff + self.critical * self.se

    @property
    def word(self) -> str:
        """``"beats"`` / ``"behind"`` beyond noise, else ``"within noise"``."""
        if self.diff > self.critical * self.se:
            return "beats"
        return "behind" if self.diff < -self.critical * self.se else "within noise"


def welch(a: list[float], b: list[float], alpha: float = 0.05) -> Welch:
    """Welch's t-test of ``a`` against ``b`` (two seeds or more each, all finite), two-sided at level ``alpha``.

    Two rows whose seeds all agree (both standard deviations 0) have ``se = 0`` and ``df = inf``: a difference
    is then beyond noise unless it is rounding (below 1e-12 of the means' size)."""
    na, nb = len(a), len(b)
    if na < 2 or nb < 2:
        raise ValueError(f"Welch's test needs two values or more a side, got {na} and {nb}")
    if not all(math.isfinite(x) for x in (*a, *b)):
        raise ValueError(f"Welch's test needs finite values, got {list(a)} and {list(b)}")
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1) / na  # the squared standard error of each mean
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1) / nb
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1)) if va + vb > 0 else math.inf
    critical = t_quantile(1.0 - alpha / 2.0, df) if math.isfinite(df) else _normal_quantile(1.0 - alpha / 2.0)
    diff = ma - mb
    if se == 0.0 and abs(diff) <= 1e-12 * max(abs(ma), abs(mb), 1.0):
        diff = 0.0  # the same values summed in another order: no difference at all
    return Welch(diff, se, df, critical)


def paired(a: dict, b: dict, alpha: float = 0.05) -> Welch:
    """The paired t-test of ``a`` against ``b`` (``{seed: value}``) on the seeds both have (two or more, all finite):
    the mean of the per-seed differences ``a[s] - b[s]``, its standard error ``sd / sqrt(n)``, ``df = n - 1`` and
    the two-sided critical value at level ``alpha``. More powerful than :func:`welch` only where a seed moves both
    rows the same way (:func:`seed_correlation` positive); with ``n - 1`` degrees of freedom it is less powerful
    where it does not. All differences equal (no spread): beyond noise unless they are rounding."""
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        raise ValueError(f"a paired test needs two seeds or more in common, got {len(common)} ({common})")
    d = [a[k] - b[k] for k in common]
    if not all(math.isfinite(x) for x in d):
        raise ValueError(f"a paired test needs finite values, got differences {d} on seeds {common}")
    n = len(d)
    mean = sum(d) / n
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1) / n)
    if se == 0.0 and abs(mean) <= 1e-12 * max(1.0, *(max(abs(a[k]), abs(b[k])) for k in common)):
        mean = 0.0  # the same values summed in another order: no difference at all
    return Welch(mean, se, n - 1, t_quantile(1.0 - alpha / 2.0, n - 1))


def seed_correlation(a: dict, b: dict) -> float:
    """Pearson's correlation of ``a[s]`` and ``b[s]`` over the seeds both have (``{seed: value}``): how much a seed
    moves two rows together, which is what pairing by seed can remove. NaN with fewer than 3 seeds in common or
    no spread on a side."""
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return math.nan
    x, y = [a[k] for k in common], [b[k] for k in common]
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((u - mx) * (v - my) for u, v in zip(x, y))
    sxx, syy = sum((u - mx) ** 2 for u in x), sum((v - my) ** 2 for v in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def _normal_quantile(p: float) -> float:
    """The standard normal's ``p`` quantile (the limit of t as df grows), by bisection on erf."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if _normal_cdf(mid) < p else (lo, mid)
    return 0.5 * (lo + hi)
