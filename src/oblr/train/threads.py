"""How many torch CPU threads a run uses (``train.threads``).

``train.threads = N > 0`` is N. The default ``0`` takes the cores that other work leaves free:
``max(1, min(torch's default, cores - round(busy)))`` (:func:`auto_threads`), where ``busy`` is the number of
cores other processes keep busy, estimated at the start of a run (:func:`other_load`) as the smaller of the
1-minute load average (scaled to the cores this process may use) and the CPU time the other processes used
over a short window (``/proc/stat``, Linux). The smaller of the two: a run that has just ended still weighs on
the load average but not on the window, and a momentary burst fills the window but not the average. Why: torch's
OpenMP threads spin while they wait for each other, so with as many threads as cores on a machine whose cores
are busy with other work, every step waits for a preempted thread (85 s/step with 2 threads against 4.7 s
with 1 on a loaded 2-core machine: ``benchmarks/results/threads/threads.md``). With ``OMP_NUM_THREADS`` set (``oblr train --nproc``
and torchrun set it to 1) torch's own count is kept.
"""

from __future__ import annotations

import os
import time

WINDOW_S = 0.5  # how long other processes' CPU use is sampled at the start of a run


def auto_threads(cores: int, default: int, busy: float | None) -> int:
    """Threads for ``train.threads=0``: ``max(1, min(default, cores - round(busy)))`` (half rounds up);
    ``default`` (torch's own count) when ``busy`` is unknown. Pure."""
    if busy is None:
        return max(1, default)
    return max(1, min(default, cores - int(busy + 0.5)))


def busy_cores(before: dict[str, list[int]], after: dict[str, list[int]], cpus: list[str]) -> float | None:
    """Cores busy between two ``/proc/stat`` snapshots (:func:`read_proc_stat`), summed over ``cpus``
    (``["cpu0", "cpu3"]``): per cpu, 1 - (idle + iowait time) / all time. None when no listed cpu advanced."""
    total = 0.0
    seen = False
    for cpu in cpus:
        if cpu not in before or cpu not in after:
            continue
        delta = [b - a for a, b in zip(before[cpu], after[cpu])]
        elapsed = sum(delta[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
        if elapsed <= 0:
            continue
        idle = delta[3] + (delta[4] if len(delta) > 4 else 0)
        total += 1.0 - idle / elapsed
        seen = True
    return total if seen else None


def read_proc_stat(text: str) -> dict[str, list[int]]:
    """``{"cpu0": [user, nice, system, idle, iowait, ...], ...}`` of the text of ``/proc/stat``. Pure."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0].startswith("cpu") and parts[0] != "cpu":
            out[parts[0]] = [int(x) for x in parts[1:]]
    return out


def usable_cpus() -> list[int]:
    """The CPU numbers this process may run on (all of them where affinity is unknown)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def other_load(cpus: list[int], window_s: float = WINDOW_S) -> float | None:
    """Cores of ``cpus`` that other processes keep busy now: the smaller of the 1-minute load average (times
    ``len(cpus) / cpu_count``: the share that falls on these cpus) and the busy time of these cpus over
    ``window_s`` less this process's own CPU time. None when neither can be read (not Linux)."""
    estimates = []
    try:
        estimates.append(os.getloadavg()[0] * len(cpus) / max(os.cpu_count() or 1, len(cpus)))
    except (AttributeError, OSError):
        pass
    try:
        with open("/proc/stat", encoding="ascii") as f:
            before = read_proc_stat(f.read())
        own0, t0 = time.process_time(), time.monotonic()
        time.sleep(window_s)
        with open("/proc/stat", encoding="ascii") as f:
            after = read_proc_stat(f.read())
        own = (time.process_time() - own0) / max(time.monotonic() - t0, 1e-9)
        busy = busy_cores(before, after, [f"cpu{c}" for c in cpus])
        if busy is not None:
            estimates.append(max(0.0, busy - own))
    except (OSError, ValueError):
        pass
    return min(estimates) if estimates else None


_last: dict[str, int] = {}  # the count a run of this process set, and torch's count before it


def torch_default(current: int) -> int:
    """Torch's own thread count: ``current`` (``torch.get_num_threads()``), or, when that is the count an
    earlier run of this process set (:func:`remember`), the count torch had before it, so that runs in one
    process do not ratchet each other down."""
    return _last["before"] if _last and _last["set"] == current else current


def remember(before: int, threads: int) -> None:
    """Note that a run set ``threads`` where torch had ``before`` (for :func:`torch_default`)."""
    _last.update(before=before, set=threads)


def choose_threads(setting: int, default: int, *, env=None, measure=None) -> tuple[int | None, str | None]:
    """``(threads to set or None to keep torch's, the line that says so or None)`` for ``train.threads =
    setting``; ``default``: torch's current count; ``measure(cpus) -> busy cores`` (:func:`other_load`)."""
    env = os.environ if env is None else env
    measure = other_load if measure is None else measure
    if setting > 0:
        return setting, None
    if env.get("OMP_NUM_THREADS"):
        return None, (f"torch threads: {default} (OMP_NUM_THREADS={env['OMP_NUM_THREADS']}); set train.threads=N "
                      f"to override")
    cpus = usable_cpus()
    busy = measure(cpus)
    n = auto_threads(len(cpus), default, busy)
    load = "load unknown" if busy is None else f"load {busy:.1f}"
    return n, f"torch threads: {n} ({len(cpus)} cores, {load}); set train.threads=N to override"
