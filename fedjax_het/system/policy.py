"""Round policies: when a synchronous round ends and whose work counts (docs/design.md §5).

A ``RoundPolicy`` holds the numbers a sweep may vary as traced leaves
(deadline, readiness share ``r``, over-commitment factor, server overhead) and
the structural choices as static fields, so one compiled schedule can be
``vmap``-ed over deadlines or readiness shares (STYLE.md habit 4). Build one
with a factory, which validates the numbers:

- ``wait_all``: the round waits for every selected client (plain FedAvg,
  McMahan et al. 2017).
- ``deadline``: clients must finish within ``deadline`` seconds or the server
  proceeds without them (FLHetBench §3, "deadline-based strategy"); late work
  is dropped, or planned as partial work ``steps_k = floor((deadline - comm_k)
  / step_time_k)`` (docs/design.md §5).
- ``readiness``: the round ends when a share ``1 - r`` of the selected clients
  has finished (FLHetBench §3, "readiness-based strategy", r = 0.2).

Every policy can over-commit (select ``ceil(m * (1 + over_commit))`` clients
and keep the first ``m`` finishers, the over-selection of Bonawitz et al. 2019,
"Towards Federated Learning at Scale: System Design"), select only clients that
are ready when the round starts (``availability_aware``), and either pause the
work of a device that stops being ready (FLHetBench, notes §2.6) or lose it
(FLASH, Yang et al. 2021). ``round_end`` states the rules; ``fedjax_het.system.schedule``
applies them to simulated clients.

>>> p = deadline(120.0, overhead=20.0)
>>> p.kind, float(p.deadline), float(p.overhead)
('deadline', 120.0, 20.0)
>>> deadline(-1.0)
Traceback (most recent call last):
...
ValueError: deadline must be > 0 seconds, got -1.0
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

KINDS = ("wait_all", "deadline", "readiness")
ON_LATE = ("drop", "partial")
ON_UNAVAILABLE = ("pause", "lost")
DEADLINE_ENDS = ("last_ok", "wait_deadline")


@struct.dataclass
class RoundPolicy:
    """How a synchronous round is run. Build with ``wait_all``, ``deadline`` or ``readiness``.

    Attributes:
      deadline: seconds the clients have after the server overhead (``inf``
        unless ``kind == "deadline"``).
      drop_share: ``r``, the share of the started clients a readiness round
        does not wait for: it ends at the ``1 - r`` quantile of their finish
        times (0 unless ``kind == "readiness"``).
      over_commit: select ``ceil(m * (1 + over_commit))`` clients, keep the first ``m`` finishers.
      overhead: server seconds per round (selection, aggregation), before the clients start.
      start: virtual time at which round 0 starts, in seconds into the availability
        traces (their time 0 is the first midnight of the FLASH logs, when few
        devices are ready; 86,400 starts at the second midnight).
      kind: "wait_all", "deadline" or "readiness" (static).
      on_late: "drop" (late work is discarded) or "partial" (a deadline client
        plans only the steps that fit; static).
      deadline_end: when a deadline round ends (static). "last_ok": at the last
        successful finish, or at the deadline if nobody succeeded (FLHetBench's
        training server, notes §4.2). "wait_deadline": once every started
        client has reported success or failure, so at the deadline whenever a
        client is late (FLHetBench's Monte-Carlo metrics, notes §4.7).
      availability_aware: select only clients ready at the round start; else a
        selected client that is not ready gets outcome UNAVAILABLE (static).
      on_unavailable: "pause" (work pauses while the device is not ready and
        resumes later; FLHetBench) or "lost" (the task fails when the device
        stops being ready; FLASH) (static).
      max_staleness: stale tasks (deadline rounds only; FLHetBench's ``--sync_staleness``,
        notes §4.4): a client late for round ``r`` keeps working, and its update
        arrives in the first later round whose deadline covers its completion, trained
        from round ``r``'s model, if that is at most ``max_staleness`` rounds later; 0:
        late work is lost (static; ``schedule.schedule``).
    """

    deadline: jax.Array
    drop_share: jax.Array
    over_commit: jax.Array
    overhead: jax.Array
    start: jax.Array
    kind: str = struct.field(pytree_node=False, default="wait_all")
    on_late: str = struct.field(pytree_node=False, default="drop")
    deadline_end: str = struct.field(pytree_node=False, default="last_ok")
    availability_aware: bool = struct.field(pytree_node=False, default=True)
    on_unavailable: str = struct.field(pytree_node=False, default="pause")
    max_staleness: int = struct.field(pytree_node=False, default=0)


def num_selected(cohort_size: int | jax.Array, over_commit: float | jax.Array) -> jax.Array:
    """``ceil(cohort_size * (1 + over_commit))``, ignoring float noise below 1e-4 of a client.

    >>> int(num_selected(20, 0.3)), int(num_selected(20, 0.0)), int(num_selected(20, 0.01))
    (26, 20, 21)
    """
    wanted = jnp.asarray(cohort_size, jnp.float32) * (1.0 + jnp.asarray(over_commit, jnp.float32))
    return jnp.ceil(wanted - 1e-4).astype(jnp.int32)


def _check(name: str, value, ok, allowed: str) -> jax.Array:
    """``value`` as a float array; raises ValueError naming ``name`` unless it is finite and
    ``ok`` holds (an infinite overhead or deadline would put the clock at infinity).

    Traced values (a factory called inside ``jit``) are not checked.
    """
    if not isinstance(value, jax.core.Tracer):
        concrete = np.asarray(value, np.float64)
        shown = concrete.item() if concrete.ndim == 0 else concrete.tolist()
        if not np.all(np.isfinite(concrete)):
            raise ValueError(f"{name} must be a finite number, got {shown}")
        if not np.all(ok(concrete)):
            raise ValueError(f"{name} must be {allowed}, got {shown}")
    return _number(value)


def _number(value) -> jax.Array:
    """A policy number in JAX's default float: float64 under ``jax_enable_x64``, so that a
    float64 computation sees 0.2, not float32(0.2); each use casts it to its times' dtype."""
    return jnp.asarray(value, float)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def _policy(
    kind: str,
    *,
    deadline_s=np.inf,
    drop_share=0.0,
    over_commit,
    overhead,
    start,
    on_late: str = "drop",
    deadline_end: str = "last_ok",
    availability_aware: bool,
    on_unavailable: str,
    max_staleness: int = 0,
) -> RoundPolicy:
    if isinstance(max_staleness, bool) or not isinstance(max_staleness, (int, np.integer)) or (
        max_staleness < 0
    ):
        raise ValueError(f"max_staleness must be an integer >= 0, got {max_staleness!r}")
    return RoundPolicy(
        deadline=_number(deadline_s),
        drop_share=_number(drop_share),
        over_commit=_check("over_commit", over_commit, lambda v: v >= 0, ">= 0"),
        overhead=_check("overhead", overhead, lambda v: v >= 0, ">= 0 seconds"),
        start=_check("start", start, lambda v: v >= 0, ">= 0 seconds"),
        kind=kind,
        on_late=_choice("on_late", on_late, ON_LATE),
        deadline_end=_choice("deadline_end", deadline_end, DEADLINE_ENDS),
        availability_aware=bool(availability_aware),
        on_unavailable=_choice("on_unavailable", on_unavailable, ON_UNAVAILABLE),
        max_staleness=int(max_staleness),
    )


def wait_all(
    *,
    overhead: float | jax.Array = 0.0,
    over_commit: float | jax.Array = 0.0,
    start: float | jax.Array = 0.0,
    availability_aware: bool = True,
    on_unavailable: str = "pause",
) -> RoundPolicy:
    """The round ends when every started client has finished or failed.

    Round time = overhead + max over the started clients of their finish (or
    failure) time; with over-commitment, the time of the ``m``-th finisher.
    """
    return _policy(
        "wait_all",
        over_commit=over_commit,
        overhead=overhead,
        start=start,
        availability_aware=availability_aware,
        on_unavailable=on_unavailable,
    )


def deadline(
    deadline: float | jax.Array,
    *,
    on_late: str = "drop",
    deadline_end: str = "last_ok",
    overhead: float | jax.Array = 0.0,
    over_commit: float | jax.Array = 0.0,
    start: float | jax.Array = 0.0,
    availability_aware: bool = True,
    on_unavailable: str = "pause",
    max_staleness: int = 0,
) -> RoundPolicy:
    """Clients have ``deadline`` seconds (after the overhead); later work is LATE.

    With ``on_late="partial"`` a client plans ``floor((deadline - comm_k) /
    step_time_k)`` local steps, at most the steps it needs (comm_k = its drawn
    download + upload seconds); it is LATE if not even one step fits, or if
    unavailability still makes it miss the deadline. See ``RoundPolicy`` for
    ``deadline_end`` and ``max_staleness`` (late work arriving in later rounds).

    Raises:
      ValueError: deadline <= 0, over_commit < 0, overhead < 0, or an unknown choice.
    """
    return _policy(
        "deadline",
        deadline_s=_check("deadline", deadline, lambda v: v > 0, "> 0 seconds"),
        over_commit=over_commit,
        overhead=overhead,
        start=start,
        on_late=on_late,
        deadline_end=deadline_end,
        availability_aware=availability_aware,
        on_unavailable=on_unavailable,
        max_staleness=max_staleness,
    )


def readiness(
    drop_share: float | jax.Array = 0.2,
    *,
    overhead: float | jax.Array = 0.0,
    over_commit: float | jax.Array = 0.0,
    start: float | jax.Array = 0.0,
    availability_aware: bool = True,
    on_unavailable: str = "pause",
) -> RoundPolicy:
    """The round ends at the ``1 - drop_share`` quantile of the finish times.

    The quantile is numpy's default ("linear") over the finish times of the
    started clients that did not fail, as FLHetBench's Monte-Carlo T-metrics
    compute it (notes §3.2); clients finishing later are LATE. FLHetBench's
    r = 0.2 waits for the 80th-percentile finisher.

    Raises:
      ValueError: drop_share outside (0, 1), over_commit < 0, overhead < 0, or an unknown choice.
    """
    return _policy(
        "readiness",
        drop_share=_check("drop_share", drop_share, lambda v: (v > 0) & (v < 1), "in (0, 1)"),
        over_commit=over_commit,
        overhead=overhead,
        start=start,
        availability_aware=availability_aware,
        on_unavailable=on_unavailable,
    )


def _masked_quantile(x, mask, q) -> jax.Array:
    """numpy's default ("linear") ``quantile(x[mask], q)``; 0 when nothing is masked in."""
    count = jnp.sum(mask)
    ordered = jnp.sort(jnp.where(mask, x, jnp.inf))
    h = (count - 1) * q
    lo = jnp.clip(jnp.floor(h), 0, None).astype(jnp.int32)
    a, b = ordered[lo], ordered[jnp.clip(lo + 1, 0, count - 1)]
    value = jnp.clip(a + (h - lo) * (b - a), a, b)
    return jnp.where(count > 0, value, 0.0)


def _finish_rank(done, ids, counted) -> jax.Array:
    """Rank of each slot's finish among the ``counted`` slots (ties: client id, then slot)."""
    slot = jnp.arange(done.shape[0])
    tie = (ids[None, :] < ids[:, None]) | (
        (ids[None, :] == ids[:, None]) & (slot[None, :] < slot[:, None])
    )
    before = (done[None, :] < done[:, None]) | ((done[None, :] == done[:, None]) & tie)
    return jnp.sum(before & counted[None, :], axis=1)


def _masked_max(x, mask) -> jax.Array:
    return jnp.max(jnp.where(mask, x, 0.0))


def round_end(
    policy: RoundPolicy,
    *,
    t0: jax.Array,
    started: jax.Array,
    finished: jax.Array,
    eligible: jax.Array,
    done: jax.Array,
    fail: jax.Array,
    ids: jax.Array,
    keep: int | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """When a round ends and whose work counts (OK) under ``policy``.

    - wait_all: at the last finish or failure of a started client; every finisher is OK.
    - deadline: a finisher is OK if it finished within ``deadline`` (and, for
      partial work, planned one step at least). "last_ok": the round ends at
      the last OK finish, at the deadline if nobody succeeded (at 0 if nobody
      started). "wait_deadline": once every started client has reported
      success or failure, at most at the deadline.
    - readiness: at the ``1 - r`` quantile (numpy "linear") of the finish times
      of the finishers; those finished by then are OK.
    - over-commitment, after any of them: only the first ``keep`` OK finishers
      stay OK (ties broken by client id, then slot); once ``keep`` have
      finished, the round ends at the last of them.

    Failures (drops, lost work) are reported when they happen; the others
    started are LATE. A client's times are seconds after ``t0``.

    Args:
      t0: the time the clients start (scales the float tolerance of the deadline test).
      started: ``[S]`` slots whose client started work.
      finished: ``[S]`` started slots that complete their work (no drop, no loss).
      eligible: ``[S]`` slots whose planned work can count (partial work: at least one step).
      done: ``[S]`` seconds after ``t0`` each slot's work completes.
      fail: ``[S]`` seconds after ``t0`` a failing slot fails (``inf`` if it does not).
      ids: ``[S]`` client ids (break ties in the order of finishing).
      keep: how many of the first OK finishers are kept (over-commitment).

    Returns:
      ``(end, ok)``: seconds after ``t0`` the round ends, and the slots whose work counts.
    """
    if policy.kind == "wait_all":  # everyone who started reports success or failure
        ok = finished
        end = _masked_max(jnp.where(finished, done, fail), started)
    elif policy.kind == "readiness":
        end = _masked_quantile(done, finished, 1.0 - policy.drop_share.astype(done.dtype))
        ok = finished & (done <= end)
    else:
        limit = policy.deadline.astype(done.dtype)
        # Finishing within float rounding of the deadline counts as on time.
        slack = 8 * jnp.finfo(done.dtype).eps * (jnp.abs(t0) + limit)
        ok = finished & eligible & (done <= limit + slack)
        if policy.deadline_end == "last_ok":
            end = jnp.where(jnp.any(ok), _masked_max(done, ok), jnp.any(started) * limit)
        else:  # until every started client has reported success or failure
            report = jnp.where(finished & eligible, done, jnp.where(finished, jnp.inf, fail))
            end = _masked_max(jnp.minimum(report, limit), started)
        end = jnp.minimum(end, limit)
    kept = ok & (_finish_rank(done, ids, ok) < keep)
    return jnp.where(jnp.sum(ok) >= keep, _masked_max(done, kept), end), kept
