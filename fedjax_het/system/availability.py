"""Availability traces as interval arrays, queried inside jit (docs/design.md §5).

A trace is a set of "ready" intervals ``[start, end)`` within one cycle of
length ``period`` (seconds); simulated time ``t`` maps to position
``t mod period`` of the trace, so a trace is replayed cyclically and, when
every period is a whole number of days and position 0 is midnight, all
clients share the same time of day (FLHetBench notes §2.1). All traces are
stored flat, trace ``k`` owning rows ``offset[k] : offset[k] + count[k]``.

Every query is written for one client (a scalar trace id and time) and is a
couple of ``searchsorted`` calls; ``vmap`` it over clients. Trace id ``-1``
means "always available". Two ways work meets an unavailable period:

- pause (FLHetBench, ``finish_time``): progress accrues only while ready, and
  resumes when the device is ready again (notes §2.6, the function F_i(t, d));
- lost (FLASH, ``finish_time_or_lost``): the task must fit in the ready
  interval it started in, or it fails when that interval ends.

Times are in the dtype of the stored arrays (float32 by default: a resolution
of about 0.03 s at 4 days, 1 s at 200 days; enable ``jax_enable_x64`` and build
float64 traces for longer simulated spans).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

ALWAYS = -1  # trace id of a client that is always available


@struct.dataclass
class Availability:
    """Ready intervals of ``T`` traces, flat.

    Attributes:
      start, end: ``[I]`` interval bounds in seconds, ``0 <= start < end <= period`` of
        their trace; sorted and disjoint within a trace.
      ready_before: ``[I]`` ready seconds of the trace before each interval's start.
      offset, count: ``[T]`` first row and number of intervals of each trace.
      period: ``[T]`` cycle length of each trace in seconds.
      ready_per_period: ``[T]`` ready seconds in one cycle.
      longest: at least the most intervals of one trace (static), which bounds a query's
        bisection (``log2(longest)`` steps); None: the number of rows.

    Queries read only rows ``offset[k] : offset[k] + count[k]`` of trace ``k``,
    so a builder may leave unused padding rows between traces.
    """

    start: jax.Array
    end: jax.Array
    ready_before: jax.Array
    offset: jax.Array
    count: jax.Array
    period: jax.Array
    ready_per_period: jax.Array
    longest: int | None = struct.field(pytree_node=False, default=None)

    @property
    def num_traces(self) -> int:
        return int(self.offset.shape[0])

    @classmethod
    def from_intervals(
        cls,
        intervals: Sequence[np.ndarray],
        period: float | Sequence[float],
        *,
        min_interval: float = 0.0,
        dtype=np.float32,
    ) -> Availability:
        """Builds the store from one ``[n_k, 2]`` array of ``(start, end)`` seconds per trace.

        Intervals are clipped to ``[0, period)``, sorted and merged where they
        touch or overlap; intervals shorter than ``min_interval`` seconds are
        dropped (a device ready for 30 s cannot finish a round).

        Raises:
          ValueError: an interval with ``end < start``, a negative start, or a period <= 0.
        """
        periods = np.broadcast_to(np.asarray(period, np.float64), (len(intervals),))
        if np.any(~(periods > 0)):
            raise ValueError(f"every trace period must be > 0 seconds, got {periods.min()}")
        starts, ends, before, counts, totals = [], [], [], [], []
        for k, (pairs, length) in enumerate(zip(intervals, periods)):
            pairs = np.asarray(pairs, np.float64).reshape(-1, 2)
            if np.any(pairs[:, 1] < pairs[:, 0]):
                bad = int(np.argmax(pairs[:, 1] < pairs[:, 0]))
                raise ValueError(
                    f"trace {k}: interval {bad} ends before it starts "
                    f"({pairs[bad, 0]} > {pairs[bad, 1]})"
                )
            if np.any(pairs[:, 0] < 0):
                raise ValueError(f"trace {k}: interval starts must be >= 0 seconds")
            merged = _merge(np.clip(pairs, 0, length))
            merged = merged[merged[:, 1] - merged[:, 0] >= max(min_interval, 1e-9)]
            lengths = merged[:, 1] - merged[:, 0]
            starts.append(merged[:, 0])
            ends.append(merged[:, 1])
            before.append(np.cumsum(lengths) - lengths)
            counts.append(len(merged))
            totals.append(lengths.sum())
        count = np.asarray(counts, np.int32)
        offset = (np.cumsum(count) - count).astype(np.int32)
        flat = lambda parts: jnp.asarray(np.concatenate(parts or [[]]).astype(dtype))
        return cls(
            start=flat(starts),
            end=flat(ends),
            ready_before=flat(before),
            offset=jnp.asarray(offset),
            count=jnp.asarray(count),
            period=jnp.asarray(periods.astype(dtype)),
            ready_per_period=jnp.asarray(np.asarray(totals, dtype)),
            longest=int(count.max(initial=0)),
        )


def _merge(pairs: np.ndarray) -> np.ndarray:
    """Sorted, disjoint union of ``[n, 2]`` intervals (touching ones are joined)."""
    if len(pairs) == 0:
        return pairs.reshape(0, 2)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    out = [list(pairs[0])]
    for s, e in pairs[1:]:
        if s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return np.asarray(out, np.float64)


def _segment_search(values: jax.Array, lo: jax.Array, cnt: jax.Array, x: jax.Array, side: str,
                    longest: int | None = None):
    """``searchsorted(values[lo:lo + cnt], x, side)`` by bisection in ``log2(longest)`` steps
    (``longest >= cnt``; None: ``len(values)``).

    ``values`` is sorted within the segment only, so a global ``searchsorted``
    cannot be used; the static step count keeps the query jit-able.
    """
    size = values.shape[0] if longest is None else min(longest, values.shape[0])
    steps = max(1, int(np.ceil(np.log2(size + 1))))

    def body(_, bounds):
        left, right = bounds
        mid = (left + right) // 2
        probe = values[lo + jnp.minimum(mid, jnp.maximum(cnt - 1, 0))]
        go_right = (probe < x) if side == "left" else (probe <= x)
        go_right = go_right & (mid < right)
        return jnp.where(go_right, mid + 1, left), jnp.where(go_right, right, mid)

    left, _ = jax.lax.fori_loop(0, steps + 1, body, (jnp.zeros_like(cnt), cnt))
    return left


def _trace_rows(av: Availability, trace: jax.Array, p: jax.Array, side: str) -> jax.Array:
    """``searchsorted`` of position ``p`` among the interval starts of ``trace``."""
    return _segment_search(av.start, av.offset[trace], av.count[trace], p, side, av.longest)


def _locate(av: Availability, trace: jax.Array, t: jax.Array):
    """Cycle number, position in the cycle, and the last interval starting at or before it."""
    k = jnp.maximum(trace, 0)
    period = av.period[k]
    cycle = jnp.floor(t / period)
    position = t - cycle * period
    j = _trace_rows(av, k, position, "right") - 1  # -1: before the first interval
    return k, cycle, position, j


def is_ready(av: Availability, trace: jax.Array, t: jax.Array) -> jax.Array:
    """Whether the device on ``trace`` is ready at time ``t``."""
    if av.period.shape[0] == 0:  # no traces at all: every device is ALWAYS ready
        shape = jnp.broadcast_shapes(jnp.shape(trace), jnp.shape(t))
        return jnp.broadcast_to(jnp.asarray(trace) == ALWAYS, shape)
    k, _, position, j = _locate(av, trace, t)
    row = av.offset[k] + jnp.maximum(j, 0)
    ready = (j >= 0) & (position < av.end[row])
    return (trace == ALWAYS) | ready


def ready_seconds(av: Availability, trace: jax.Array, t: jax.Array) -> jax.Array:
    """Ready seconds of ``trace`` in ``[0, t)`` (``t`` itself for an always-available client)."""
    k, cycle, position, j = _locate(av, trace, t)
    row = av.offset[k] + jnp.maximum(j, 0)
    within = jnp.where(
        j >= 0, av.ready_before[row] + jnp.minimum(position, av.end[row]) - av.start[row], 0.0
    )
    return jnp.where(trace == ALWAYS, t, cycle * av.ready_per_period[k] + within)


def finish_time(av: Availability, trace: jax.Array, t0: jax.Array, work: jax.Array) -> jax.Array:
    """When ``work`` ready-seconds started at ``t0`` are done, pausing while not ready.

    The function ``F_i(t, d)`` of FLHetBench (notes §2.6): progress accrues only
    inside ready intervals and the trace wraps cyclically. ``inf`` for a trace
    that is never ready (and work > 0).
    """
    k = jnp.maximum(trace, 0)
    total = av.ready_per_period[k]
    target = ready_seconds(av, trace, t0) + work
    safe_total = jnp.where(total > 0, total, 1.0)
    cycle = jnp.floor(target / safe_total)
    rem = target - cycle * safe_total
    # Finishing exactly at a cycle's last ready second belongs to that cycle.
    at_edge = (rem <= 0) & (cycle > 0)
    cycle = jnp.where(at_edge, cycle - 1, cycle)
    rem = jnp.where(at_edge, safe_total, rem)
    lo, cnt = av.offset[k], av.count[k]
    reach = av.ready_before + (av.end - av.start)  # ready seconds up to each interval's end
    j = jnp.minimum(_segment_search(reach, lo, cnt, rem, "left", av.longest),
                    jnp.maximum(cnt - 1, 0))
    row = lo + j
    t = cycle * av.period[k] + av.start[row] + (rem - av.ready_before[row])
    t = jnp.where(total > 0, t, jnp.inf)
    t = jnp.maximum(t, t0)
    t = jnp.where(work <= 0, t0, t)
    return jnp.where(trace == ALWAYS, t0 + work, t)


def ready_until(av: Availability, trace: jax.Array, t: jax.Array) -> jax.Array:
    """End of the ready interval holding ``t``; ``t`` itself when not ready, inf when always."""
    k, cycle, position, j = _locate(av, trace, t)
    row = av.offset[k] + jnp.maximum(j, 0)
    inside = (j >= 0) & (position < av.end[row])
    end = jnp.where(inside, cycle * av.period[k] + av.end[row], t)
    return jnp.where(trace == ALWAYS, jnp.inf, end)


def finish_time_or_lost(
    av: Availability, trace: jax.Array, t0: jax.Array, work: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """FLASH's rule: ``(finish, lost)``; work is lost if the device stops being ready.

    ``finish`` is ``t0 + work`` when the work fits in the ready interval holding
    ``t0``; otherwise ``lost`` is True and ``finish`` is when that interval ends
    (``t0`` if the device was not ready at ``t0``). An interval that runs up to
    the period's end is not joined with one that opens the next cycle.
    """
    until = ready_until(av, trace, t0)
    done = t0 + work
    lost = done > until
    return jnp.where(lost, until, done), lost


def next_ready(av: Availability, trace: jax.Array, t: jax.Array) -> jax.Array:
    """The earliest time ``>= t`` at which the device is ready (inf if never)."""
    k, cycle, position, j = _locate(av, trace, t)
    lo, cnt = av.offset[k], av.count[k]
    row = lo + jnp.maximum(j, 0)
    inside = (j >= 0) & (position < av.end[row])
    nxt = j + 1
    later = jnp.where(
        nxt < cnt,
        cycle * av.period[k] + av.start[lo + jnp.minimum(nxt, jnp.maximum(cnt - 1, 0))],
        (cycle + 1) * av.period[k] + av.start[lo],
    )
    out = jnp.where(inside, t, jnp.where(cnt > 0, later, jnp.inf))
    return jnp.where(trace == ALWAYS, t, out)


def queryable(av: Availability) -> Availability:
    """``av``, padded with one unused interval row (and trace) if it has none.

    The availability queries index the interval arrays, which fails on an
    empty store (``profiles.no_traces()``, or traces that are never ready);
    a padding row with ``count == 0`` answers the same: never ready.
    """
    if min(x.shape[0] for x in jax.tree.leaves(av)) > 0:
        return av

    def pad(x, value):
        return x if x.shape[0] > 0 else jnp.full((1,), value, x.dtype)

    return Availability(
        start=pad(av.start, 0),
        end=pad(av.end, 0),
        ready_before=pad(av.ready_before, 0),
        offset=pad(av.offset, 0),
        count=pad(av.count, 0),
        period=pad(av.period, 1),
        ready_per_period=pad(av.ready_per_period, 0),
        longest=av.longest,
    )
