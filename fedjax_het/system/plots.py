"""Plots of the system-heterogeneity layer: schedule timeline, availability, participation.

Three PNG figures in the spirit of FLHetBench's analysis (Zhang et al., CVPR
2024, §5: "unselected or frequently disconnected clients", participation
bias) and FLASH's availability traces (Yang et al., WWW 2021):

- :func:`plot_timeline`: clients x virtual time, each selected slot a bar
  coloured by its outcome;
- :func:`plot_availability`: clients x time heatmap of ready / not ready;
- :func:`plot_participation`: histogram of per-client participation counts,
  with their Gini coefficient.

Inputs are arrays (a schedule is any object with the ``Schedule`` fields:
``selected``, ``valid``, ``outcome``, ``start``, ``duration``, ``finish``).
Figures are drawn on matplotlib's Agg canvas without ``pyplot``, so no global
backend is switched and nothing is shown; each is ``figsize * dpi`` pixels.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from fedjax_het.data.diagnostics import gini
from fedjax_het.system.availability import Availability, is_ready
from fedjax_het.system.schedule import DROPPED, LATE, OK, OUTCOMES, UNAVAILABLE

# Colour of each drawn outcome (EMPTY slots are not drawn).
OUTCOME_COLORS = {OK: "#2ca02c", UNAVAILABLE: "#9e9e9e", LATE: "#ff7f0e", DROPPED: "#d62728"}
FIGSIZE = (10.0, 6.0)  # inches; PNGs are FIGSIZE * DPI pixels
DPI = 100

_ready_grid = jax.jit(
    jax.vmap(jax.vmap(is_ready, in_axes=(None, None, 0)), in_axes=(None, 0, None))
)


def _save(fig: Figure, path: str | os.PathLike, dpi: int) -> None:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=dpi, format="png")


def plot_timeline(
    schedule,
    path: str | os.PathLike,
    *,
    max_clients: int = 50,
    figsize: tuple[float, float] = FIGSIZE,
    dpi: int = DPI,
) -> np.ndarray:
    """Draws which client worked when, and how each slot ended.

    Each valid slot of round ``r`` is a bar on its client's row from
    ``start[r]`` to ``start[r] + finish[r, s]`` (when it finished or gave up),
    coloured by ``outcome``; an UNAVAILABLE slot spans its whole round (the
    client was selected for it and could not take part). Rows are the
    ``max_clients`` lowest client ids that were ever selected.

    Returns:
      ``[rows]`` the client ids drawn, top to bottom.

    Raises:
      ValueError: ``max_clients < 1`` or schedule fields of mismatched shapes.
    """
    if max_clients < 1:
        raise ValueError(f"max_clients must be >= 1, got {max_clients}")
    selected = np.asarray(schedule.selected)
    valid = np.asarray(schedule.valid, bool)
    outcome = np.asarray(schedule.outcome)
    finish = np.asarray(schedule.finish, np.float64)
    start = np.asarray(schedule.start, np.float64)
    duration = np.asarray(schedule.duration, np.float64)
    rounds = selected.shape[0]
    if not (valid.shape == outcome.shape == finish.shape == selected.shape) or selected.ndim != 2:
        raise ValueError("schedule.selected, valid, outcome and finish must share one [R, m] shape")
    if start.shape != (rounds,) or duration.shape != (rounds,):
        raise ValueError(f"schedule.start and schedule.duration must have shape ({rounds},)")
    clients = np.unique(selected[valid])[:max_clients]
    drawn = valid & np.isin(selected, clients) & np.isin(outcome, list(OUTCOME_COLORS))
    r, _ = np.nonzero(drawn)
    row = np.searchsorted(clients, selected[drawn])
    left = start[r] / 3600.0
    width = np.where(outcome[drawn] == UNAVAILABLE, duration[r], finish[drawn]) / 3600.0
    verts = np.stack(
        [
            np.stack([left, row - 0.4], -1),
            np.stack([left + width, row - 0.4], -1),
            np.stack([left + width, row + 0.4], -1),
            np.stack([left, row + 0.4], -1),
        ],
        axis=1,
    )
    colors = [OUTCOME_COLORS[int(o)] for o in outcome[drawn]]

    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    ax.add_collection(PolyCollection(verts, facecolors=colors, edgecolors="none"))
    end = max(float(np.max(start + duration, initial=0.0)), 1e-9) / 3600.0
    ax.set_xlim(0.0, end)
    ax.set_ylim(max(len(clients), 1) - 0.5, -0.5)
    if len(clients) <= 40:
        ax.set_yticks(np.arange(len(clients)), [str(c) for c in clients])
    ax.set_xlabel("virtual time (h)")
    ax.set_ylabel("client")
    ax.set_title(f"{rounds} rounds, {len(clients)} clients shown")
    ax.legend(
        handles=[Patch(color=c, label=OUTCOMES[code]) for code, c in OUTCOME_COLORS.items()],
        loc="upper right",
        fontsize="small",
    )
    _save(fig, path, dpi)
    return clients


def plot_availability(
    availability: Availability,
    trace_ids: np.ndarray,
    path: str | os.PathLike,
    *,
    hours: float = 48.0,
    resolution_s: float = 600.0,
    figsize: tuple[float, float] = FIGSIZE,
    dpi: int = DPI,
) -> np.ndarray:
    """Heatmap of who is ready when: clients x time, sampled every ``resolution_s`` seconds.

    Readiness is ``availability.is_ready`` at ``t = 0, resolution_s, ...``
    below ``hours * 3600`` (cell ``j`` shows the state at its left edge).

    Returns:
      ``[clients, times]`` bool, the ready matrix drawn.

    Raises:
      ValueError: ``hours`` or ``resolution_s`` not > 0, or a trace id outside
        ``[-1, num_traces)``.
    """
    if not hours > 0 or not resolution_s > 0:
        raise ValueError(f"hours and resolution_s must be > 0, got {hours}, {resolution_s}")
    trace_ids = np.asarray(trace_ids, np.int32).reshape(-1)
    if np.any((trace_ids < -1) | (trace_ids >= availability.num_traces)):
        raise ValueError(
            f"trace_ids must lie in [-1, {availability.num_traces}), "
            f"got [{trace_ids.min()}, {trace_ids.max()}]"
        )
    times = np.arange(0.0, hours * 3600.0, resolution_s)
    times = jnp.asarray(times, availability.period.dtype)
    ready = np.asarray(_ready_grid(availability, jnp.asarray(trace_ids), times))

    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    colors = ("#e0e0e0", "#1f77b4")
    ax.imshow(
        ready.astype(np.uint8),
        cmap=ListedColormap(colors),
        vmin=0,
        vmax=1,
        aspect="auto",
        interpolation="nearest",
        extent=(0.0, len(times) * resolution_s / 3600.0, len(trace_ids) - 0.5, -0.5),
    )
    ax.set_xlabel("time of day from the trace origin (h)")
    ax.set_ylabel("client")
    ax.set_title(f"{len(trace_ids)} clients, ready {ready.mean():.1%} of the time")
    ax.legend(
        handles=[Patch(color=c, label=name) for name, c in zip(("not ready", "ready"), colors)],
        loc="upper right",
        fontsize="small",
    )
    _save(fig, path, dpi)
    return ready


def plot_participation(
    counts: np.ndarray,
    path: str | os.PathLike,
    *,
    figsize: tuple[float, float] = FIGSIZE,
    dpi: int = DPI,
) -> float:
    """Histogram of how many rounds each client took part in; returns their Gini.

    Raises:
      ValueError: empty or negative counts.
    """
    counts = np.asarray(counts).reshape(-1)
    if counts.size == 0 or np.any(counts < 0):
        raise ValueError("counts must be a non-empty array of participation counts >= 0")
    coefficient = gini(counts)
    top = float(counts.max())
    bins = np.arange(top + 2) - 0.5 if top < 100 else 50

    fig = Figure(figsize=figsize, dpi=dpi)
    ax = fig.add_subplot()
    ax.hist(counts, bins=bins, color="#1f77b4", edgecolor="white")
    ax.set_xlabel("rounds participated")
    ax.set_ylabel("clients")
    ax.set_title(f"participation of {counts.size} clients, Gini {coefficient:.3f}")
    _save(fig, path, dpi)
    return coefficient


def plot_async(
    clock_s: np.ndarray,
    in_flight: np.ndarray,
    staleness: np.ndarray,
    participation: np.ndarray,
    path: str | os.PathLike,
    *,
    figsize: tuple[float, float] = (15.0, 4.5),
    dpi: int = DPI,
) -> None:
    """An asynchronous run: tasks in flight over virtual hours (at each server event), the
    histogram of the applied updates' staleness, and the clients' participation with its Gini."""
    participation = np.asarray(participation).reshape(-1)
    fig = Figure(figsize=figsize, dpi=dpi)
    left, middle, right = fig.subplots(1, 3)
    left.step(np.asarray(clock_s) / 3600.0, in_flight, where="post", color="#1f77b4")
    left.set_xlabel("virtual hours")
    left.set_ylabel("tasks in flight after the event")
    left.set_title("concurrency")
    staleness = np.asarray(staleness)
    middle.bar(np.arange(staleness.size), staleness, color="#ff7f0e")
    middle.set_xlabel("staleness (server versions)")
    middle.set_ylabel("updates applied")
    middle.set_title(f"staleness of {int(staleness.sum())} applied updates")
    top = float(participation.max(initial=0))
    bins = np.arange(top + 2) - 0.5 if top < 100 else 50
    right.hist(participation, bins=bins, color="#2ca02c", edgecolor="white")
    right.set_xlabel("updates applied")
    right.set_ylabel("clients")
    right.set_title(f"participation of {participation.size} clients, Gini {gini(participation):.3f}")
    fig.tight_layout()
    _save(fig, path, dpi)
