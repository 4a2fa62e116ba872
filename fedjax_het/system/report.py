"""What a run's system heterogeneity looks like, before any training: ``fedjax-het hetero describe``.

``describe`` computes the six FLHetBench Monte-Carlo metrics of the
profiles (``flhetbench``; lower R and higher T mean more heterogeneous) and
the run's own schedule (``schedule``: outcomes, durations, participation),
and draws the schedule's timeline (clients x virtual time, coloured by
outcome), the availability heatmap and the participation histogram.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fedjax_het import results
from fedjax_het.system import flhetbench, participation, plots
from fedjax_het.system.availability import ALWAYS
from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.system.schedule import OK, OUTCOMES, Schedule

ORDER = ("DevMC-R", "StatMC-R", "InterMC-R", "DevMC-T", "StatMC-T", "InterMC-T")


def heterogeneity_metrics(
    profiles: ClientProfiles, *, key: jax.Array, mc: flhetbench.MonteCarlo
) -> dict[str, float]:
    """The six FLHetBench metrics of ``profiles`` (``flhetbench.all_metrics``: two programs,
    one ``vmap`` of the R run and one of the T run); the state metrics need availability
    traces (every client always available: no state heterogeneity to measure)."""
    has_traces = bool(np.any(np.asarray(profiles.trace) != ALWAYS))
    values = jax.device_get(flhetbench.all_metrics(profiles, key=key, mc=mc, states=has_traces))
    return {name: float(values[name]) for name in ORDER if name in values}


def schedule_summary(
    s: Schedule, num_clients: int, readiness: tuple[ClientProfiles, RoundPolicy] | None = None
) -> dict[str, Any]:
    """Outcome counts, round durations and participation of a schedule, and why the clients
    that never trained did not (``participation.never_trained``, ``readiness`` as there)."""
    s = jax.device_get(s)
    valid = np.asarray(s.valid)
    outcome = np.asarray(s.outcome)[valid]
    counts = flhetbench.participation_counts(s, num_clients)
    duration = np.asarray(s.duration, np.float64)
    return {
        "rounds": int(duration.size),
        "virtual_s": float(np.asarray(s.clock)[-1]),
        "round_s": {"min": float(duration.min()), "median": float(np.median(duration)),
                    "max": float(duration.max())},
        "outcomes": {name: int(np.sum(outcome == code)) for code, name in enumerate(OUTCOMES)
                     if name != "empty"},
        "participation": {"min": int(counts.min()), "median": float(np.median(counts)),
                          "max": int(counts.max()), "never": int(np.sum(counts == 0))},
        "participation_counts": counts.tolist(),
        **participation.never_trained(s, num_clients, readiness),
        "rounds_nobody_counted": int(np.sum(~np.any(valid & (np.asarray(s.outcome) == OK), 1))),
    }


def describe(
    profiles: ClientProfiles,
    run_schedule: Callable[[], Schedule],
    out_dir: str | Path,
    *,
    key: jax.Array,
    mc: flhetbench.MonteCarlo,
    policy: RoundPolicy | None = None,
) -> dict[str, Any]:
    """Computes the metrics and the schedule summary (with the run's ``policy``: which unselected
    clients were never ready), its warnings, writes ``system_summary.json`` and the
    plots. The metrics' programs compile and run in a thread of their own (XLA compiles
    without the GIL) while ``run_schedule()`` plans the run's schedule and it is drawn."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        metrics = pool.submit(heterogeneity_metrics, profiles, key=key, mc=mc)
        schedule = jax.device_get(run_schedule())
        readiness = None if policy is None else (profiles, policy)
        summary = {"schedule": schedule_summary(schedule, profiles.num_clients, readiness)}
        counts = np.asarray(summary["schedule"]["participation_counts"])
        summary["schedule"]["participation_gini"] = plots.plot_participation(
            counts, out / "participation.png"
        )
        plots.plot_timeline(schedule, out / "timeline.png")
        plots.plot_availability(
            profiles.availability, np.asarray(profiles.trace)[:200], out / "availability.png"
        )
        summary = {"flhetbench": metrics.result(), **summary}
    s = summary["schedule"]
    totals = {**s, "clients_never_participated": s["participation"]["never"]}
    summary["warnings"] = participation.warnings(totals, profiles.num_clients, s["rounds"])
    (out / "system_summary.json").write_text(results.strict_json(summary, indent=2) + "\n")
    return summary


def format_report(summary: dict[str, Any]) -> str:
    """The summary as a few readable lines, then the warnings a run of this schedule would
    print (``participation.warnings``)."""
    lines = ["FLHetBench metrics (R: lower = more heterogeneous; T: higher = more):"]
    lines += [f"  {name:10s} {value:10.4f}" for name, value in summary["flhetbench"].items()]
    s = summary["schedule"]
    lines.append(
        f"schedule: {s['rounds']} rounds, {s['virtual_s']:.0f} s virtual; round length "
        f"min/median/max {s['round_s']['min']:.1f}/{s['round_s']['median']:.1f}/"
        f"{s['round_s']['max']:.1f} s"
    )
    lines.append("outcomes: " + ", ".join(f"{k} {v}" for k, v in s["outcomes"].items()))
    p = s["participation"]
    lines.append(
        f"participation per client: min {p['min']}, median {p['median']:g}, max {p['max']}, "
        f"never {p['never']}; Gini {s['participation_gini']:.3f}"
    )
    lines += [f"warning: {warning}" for warning in summary.get("warnings", ())]
    return "\n".join(lines)
