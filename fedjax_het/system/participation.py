"""Who took part in a schedule and, for the clients that never trained, why: never selected, or
selected but always unavailable, late or dropped; and the warnings a run (``summary.json``) and
``fedjax-het hetero describe`` print about it, each naming its cause and the option that
changes it."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.system import availability as avail
from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule_row import DROPPED, LATE, OK, UNAVAILABLE, Schedule

GINI_WARNING = 0.6
"""Participation Gini above which a run's end warns that a few clients did most rounds."""
FAILURES = {"unavailable": UNAVAILABLE, "late": LATE, "dropped": DROPPED}


def never_trained(
    s: Schedule, num_clients: int, readiness: tuple[ClientProfiles, RoundPolicy] | None = None
) -> dict[str, Any]:
    """Why the clients of a host schedule (``jax.device_get``'s) that never trained did not:
    ``clients_never_selected`` (no slot in any round) and ``never_trained_because``: of those
    selected at least once, how many were unavailable, late or dropped every time (``mixed``:
    more than one of these). With the run's ``readiness`` (profiles and policy) and a selection
    that looks at availability, ``never_selected_never_ready`` counts the unselected clients
    that were not ready when any round's clients started (so could not be drawn)."""
    valid = np.asarray(s.valid)
    selected, outcome = np.asarray(s.selected)[valid], np.asarray(s.outcome)[valid]
    by_client = np.zeros((num_clients, max(OK, *FAILURES.values()) + 1), np.int64)
    known = outcome < by_client.shape[1]
    np.add.at(by_client, (selected[known], outcome[known]), 1)
    times = by_client.sum(axis=1)
    failed = (by_client[:, OK] == 0) & (times > 0)
    only = {name: failed & (by_client[:, code] == times) for name, code in FAILURES.items()}
    mixed = failed & ~np.any(list(only.values()), axis=0)
    unselected = times == 0
    aware = readiness is not None and bool(readiness[1].availability_aware)
    never_ready = {}
    if aware and np.any(unselected):
        ready = ever_ready(*readiness, np.asarray(s.start))
        never_ready = {"never_selected_never_ready": int(np.sum(unselected & ~ready))}
    return {
        "clients_never_selected": int(np.sum(unselected)),
        **never_ready,
        "never_trained_because": {
            **{name: int(np.sum(mask)) for name, mask in only.items()},
            "mixed": int(np.sum(mixed)),
        },
    }


def ever_ready(profiles: ClientProfiles, policy: RoundPolicy, starts: np.ndarray) -> np.ndarray:
    """``[N]``: whether each client was ready when the clients of some round started (its
    ``start`` plus the policy's overhead: when ``schedule.wait_for_ready`` looks)."""
    av = avail.queryable(profiles.availability)
    times = jnp.asarray(starts, profiles.step_time.dtype) + policy.overhead
    at = lambda t: jax.vmap(avail.is_ready, in_axes=(None, 0, None))(av, profiles.trace, t)
    return np.asarray(jax.jit(jax.vmap(at))(times).any(axis=0))


_OPTIONS = {
    "unavailable": "unavailable (policy.start: the FLASH traces start at a midnight, when few "
    "devices are ready; system.availability, policy.availability_aware)",
    "late": "late (policy.deadline, policy.on_late)",
    "dropped": "dropped (system.dropout)",
    "mixed": "unavailable, late or dropped in turn",
}


def _never_line(totals: dict[str, Any], num_clients: int, steps: int, what: str) -> str | None:
    """The never-trained warning, its clients split by cause when the accounting knows it."""
    never = totals.get("clients_never_participated", 0)
    if not never:
        return None
    if "clients_never_selected" not in totals:
        return (
            f"{never} of {num_clients} clients never trained: none of their updates was applied "
            "(never dispatched, always dropped or too stale); see system.availability, "
            "system.dropout, server.max_staleness"
        )
    causes = []
    unselected = totals["clients_never_selected"]
    unready = totals.get("never_selected_never_ready", 0)
    if unready:
        causes.append(
            f"{unready} {_were(unready)} never ready when a round started, so never selected ("
            + _OPTIONS["unavailable"].removeprefix("unavailable (")
        )
    if unselected - unready:
        causes.append(
            f"{unselected - unready} {_were(unselected - unready)} never selected in {steps} {what} "
            "(the sampler's draw, "
            "not their devices: more rounds or sampler.clients_per_round reach them)"
        )
    for name, count in totals["never_trained_because"].items():
        if count:
            causes.append(f"{count} {_were(count)} selected but always {_OPTIONS[name]}")
    return f"{never} of {num_clients} clients never trained: " + "; ".join(causes)


def _were(count: int) -> str:
    return "was" if count == 1 else "were"


def warnings(totals: dict[str, Any], num_clients: int, steps: int) -> list[str]:
    """What a researcher would want to know about a schedule, each with its cause and the
    option that changes it. ``totals``: an accounting's (``clients_never_participated``,
    ``clients_never_selected``, ``never_trained_because``, ``participation_gini``,
    ``rounds_nobody_counted`` or an asynchronous run's ``stalled_events``); ``steps`` the
    rounds or server events run."""
    what = "server events" if "stalled_events" in totals else "rounds"
    out = [_never_line(totals, num_clients, steps, what)]
    gini_ = totals.get("participation_gini", 0.0)
    if gini_ > GINI_WARNING:
        out.append(
            f"participation is concentrated (Gini {gini_:.2f}): a few clients did most of the "
            "training, so the model mostly learned their data; with availability-aware "
            "selection only ready clients are picked (policy.start, system.availability = "
            '"loose", policy.availability_aware)'
        )
    empty = totals.get("rounds_nobody_counted", totals.get("stalled_events", 0))
    if empty:
        out.append(
            f"{empty} of {steps} {what} aggregated no update: every selected client was late, "
            'dropped or unavailable; raise policy.deadline, set policy.on_late = "partial", '
            "lower system.dropout or select more clients (sampler.clients_per_round)"
        )
    return [line for line in out if line]
