"""Evaluation of the global model, per-client accuracy summaries, and what a schedule cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.data.diagnostics import gini
from fedjax_het.engine.local import DeviceSplit
from fedjax_het.models import Model, per_example_correct
from fedjax_het.system import participation as participation_lib
from fedjax_het.system.flhetbench import participation_counts
from fedjax_het.typing import Params


def evaluate(
    model: Model, params: Params, split: DeviceSplit, row_client: jax.Array, *, batch_size: int
) -> dict[str, jax.Array]:
    """Loss and accuracy of ``params`` on every row of ``split``, overall and per client.

    Rows are evaluated in batches of ``batch_size`` under ``lax.map`` (the
    last batch padded and masked). Returns the example-weighted global loss and
    accuracy and per-client ``correct``, ``loss_sum`` and ``count`` [num_clients].
    """
    n = split.y.shape[0]
    num_batches = max(1, -(-n // batch_size))
    pad = num_batches * batch_size - n

    def padded(a):
        a = jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)])
        return a.reshape(num_batches, batch_size, *a.shape[1:])

    valid = padded(jnp.ones((n,), bool))

    def one_batch(inputs):
        x, y = inputs
        outputs = model.apply(params, x, train=False, key=None)
        return model.per_example_loss(outputs, y), per_example_correct(outputs, y)

    losses, correct = jax.lax.map(one_batch, (padded(split.x), padded(split.y)))
    losses = jnp.where(valid, losses, 0.0).reshape(-1)[:n]
    correct = jnp.where(valid, correct, 0.0).reshape(-1)[:n]
    num_clients = split.count.shape[0]
    per_client = lambda v: jax.ops.segment_sum(v, row_client, num_segments=num_clients)
    return {
        "loss": jnp.sum(losses) / max(n, 1),
        "accuracy": jnp.sum(correct) / max(n, 1),
        "client_correct": per_client(correct),
        "client_loss_sum": per_client(losses),
        "client_count": split.count,
    }


def evaluate_personal(
    model: Model, params_of: Callable[[jax.Array], Params], split: DeviceSplit, *,
    max_count: int, chunk: int,
) -> tuple[jax.Array, jax.Array]:
    """Each client's own model on its own test rows: ``(correct [N], loss_sum [N])``.

    ``params_of(ids [c]) -> params [c, ...]`` gives the personal models of a
    chunk of clients; chunks run under ``lax.map``, each client's rows padded
    to ``max_count`` and masked.
    """
    n = split.count.shape[0]
    num_chunks = -(-n // chunk)
    ids = jnp.minimum(jnp.arange(num_chunks * chunk, dtype=jnp.int32), n - 1)
    position = jnp.arange(max(max_count, 1))

    def one_client(params, k):
        valid = position < split.count[k]
        rows = split.offset[k] + jnp.minimum(position, jnp.maximum(split.count[k] - 1, 0))
        outputs = model.apply(params, split.x[rows], train=False, key=None)
        correct = jnp.where(valid, per_example_correct(outputs, split.y[rows]), 0.0)
        loss = jnp.where(valid, model.per_example_loss(outputs, split.y[rows]), 0.0)
        return jnp.sum(correct), jnp.sum(loss)

    def one_chunk(chunk_ids):
        return jax.vmap(one_client)(params_of(chunk_ids), chunk_ids)

    correct, loss = jax.lax.map(one_chunk, ids.reshape(num_chunks, chunk))
    return correct.reshape(-1)[:n], loss.reshape(-1)[:n]


def client_accuracy_summary(
    client_correct: np.ndarray, client_count: np.ndarray, prefix: str = "client_accuracy"
) -> dict[str, float]:
    """Distribution of per-client test accuracy over clients that have test examples.

    Returns ``{prefix}_mean``, ``_std`` (HDFL's good-intent fairness), ``_p10``
    (10th percentile) and ``_min`` (worst client), plus how many clients were
    evaluated.
    """
    has_test = client_count > 0
    acc = client_correct[has_test] / client_count[has_test]
    nan = float("nan")
    figures = {
        "mean": float(acc.mean()) if acc.size else nan,
        "std": float(acc.std()) if acc.size else nan,
        "p10": float(np.percentile(acc, 10)) if acc.size else nan,
        "min": float(acc.min()) if acc.size else nan,
    }
    return {
        **{f"{prefix}_{k}": v for k, v in figures.items()},
        "clients_evaluated": int(acc.size),
    }


def time_to_accuracy(
    evaluations: Sequence[Mapping[str, Any]], targets: Sequence[float]
) -> dict[str, dict[str, float] | None]:
    """For each target test accuracy, the first evaluation reaching it: its round, virtual
    time and bytes moved (``virtual_s``, ``bytes_down``, ``bytes_up``, when the run had a
    system) and wall time; None if never reached.

    Rounds-to-accuracy and time-to-accuracy side by side: under deadlines and
    stragglers the two rank settings differently (FLHetBench §4.1).
    """
    out: dict[str, dict[str, float] | None] = {}
    for target in targets:
        hit = next((e for e in evaluations if e["test_accuracy"] >= target), None)
        out[f"{target:g}"] = None if hit is None else {
            key: hit[key]
            for key in ("round", "virtual_s", "wall_s", "bytes_down", "bytes_up") if key in hit
        }
    return out


@dataclasses.dataclass(frozen=True)
class ScheduleAccounting:
    """What a run's schedule cost, per round and per client (numpy, host side).

    Attributes:
      per_round: ``[R]`` arrays: ``duration_s``, ``clock_s`` (virtual seconds since the run
        started, whatever the policy's trace ``start``), ``ok`` / ``unavailable`` /
        ``late`` / ``dropped`` counts, ``bytes_down``, ``bytes_up``, ``examples_processed``
        (by every client that computed, whether its update counted or not) and
        ``examples_wasted`` (by clients whose update was not aggregated).
      participation: ``[N]`` successful participations of each client.
      never: why the clients that never trained did not (``participation.never_trained``,
        computed when the totals are: it may compile the readiness query).
    """

    per_round: dict[str, np.ndarray]
    participation: np.ndarray
    never: Callable[[], dict[str, Any]] | None = None

    @classmethod
    def empty(cls, num_clients: int) -> ScheduleAccounting:
        """The accounting of no round yet (an in-loop run before its first block), so that
        round 0's line carries the same fields as a planned run's."""
        keys = ("duration_s", "clock_s", *OUTCOME_NAMES, "bytes_down", "bytes_up",
                "examples_processed", "examples_wasted")
        return cls({key: np.zeros(0) for key in keys}, np.zeros(num_clients, np.int64))

    def upto(self, done: int) -> dict[str, Any]:
        """Cumulative figures after ``done`` rounds, for one ``metrics.jsonl`` line."""
        r = self.per_round
        processed = float(r["examples_processed"][:done].sum())
        line = {
            "virtual_s": float(r["clock_s"][done - 1]) if done else 0.0,
            "outcomes": {name: int(r[name][:done].sum()) for name in OUTCOME_NAMES},
            "bytes_down": float(r["bytes_down"][:done].sum()),
            "bytes_up": float(r["bytes_up"][:done].sum()),
            "examples_processed": processed,
            "wasted_share": float(r["examples_wasted"][:done].sum()) / processed if processed else 0.0,
        }
        return line

    def totals(self) -> dict[str, Any]:
        """Whole-run figures for ``summary.json`` (HDFL's cost and fairness, Zawad et al.)."""
        final = self.upto(len(self.per_round["clock_s"]))
        return {
            "virtual_s": final["virtual_s"],
            "outcomes": final["outcomes"],
            "bytes_down": final["bytes_down"],
            "bytes_up": final["bytes_up"],
            "examples_processed": final["examples_processed"],
            "wasted_share": final["wasted_share"],
            "participation_gini": gini(self.participation),
            "clients_never_participated": int(np.sum(self.participation == 0)),
            **(self.never() if self.never else {}),
            "rounds_nobody_counted": int(np.sum(self.per_round["ok"] == 0)),
        }


OUTCOME_NAMES = ("ok", "unavailable", "late", "dropped")


def _examples_processed(s, spec, count: np.ndarray) -> np.ndarray:
    """``[R, S]`` examples each valid slot of host-side plans ``s`` trained on (0 elsewhere)."""
    need = np.asarray(spec.work.examples_to_process(jnp.asarray(count, jnp.int32)))
    processed = np.minimum(np.asarray(s.steps_done) * spec.work.batch_size, need[s.selected])
    return np.where(np.asarray(s.valid), processed, 0)


def schedule_accounting(
    plans,
    spec,
    count: np.ndarray,
    num_clients: int,
    origin: float | None = None,
    *,
    readiness: tuple | None = None,
) -> ScheduleAccounting:
    """Accounts a ``system.schedule.Schedule`` of a run with local work ``spec.work``; the
    virtual clock counts from ``origin`` (the policy's ``start``: a first round that waited
    for a ready client starts later), default the first round's start. ``readiness``: the
    system's ``(profiles, policy)``, to tell clients never ready from clients never drawn."""
    s = jax.device_get(plans)
    valid = np.asarray(s.valid)
    outcome = np.where(valid, np.asarray(s.outcome), -1)
    processed = _examples_processed(s, spec, count)
    ok = outcome == 0
    per_round = {
        "duration_s": np.asarray(s.duration, np.float64),
        "clock_s": np.asarray(s.clock, np.float64)
        - float(np.asarray(s.start)[0] if origin is None else origin),
        **{name: np.sum(outcome == code, axis=1) for code, name in enumerate(OUTCOME_NAMES)},
        "bytes_down": np.asarray(s.bytes_down, np.float64).sum(axis=1),
        "bytes_up": np.asarray(s.bytes_up, np.float64).sum(axis=1),
        "examples_processed": processed.sum(axis=1).astype(np.float64),
        "examples_wasted": np.where(ok, 0, processed).sum(axis=1).astype(np.float64),
    }
    participation = np.asarray(participation_counts(s, num_clients))
    never = lambda: participation_lib.never_trained(s, num_clients, readiness)
    return ScheduleAccounting(per_round, participation, never)



@dataclasses.dataclass(frozen=True)
class EventAccounting:
    """What an asynchronous run's events cost (``system.events.EventSchedule``; numpy, host side).

    The same interface as ``ScheduleAccounting``, per server event instead of per round.

    Attributes:
      per_round: ``[E]`` arrays: ``duration_s``, ``clock_s`` (virtual seconds since the run
        started), ``applied`` (updates aggregated), ``discarded`` (too stale), ``dropped``
        (tasks that failed), ``dispatched``, ``in_flight`` (concurrency just after the event),
        ``staleness_mean``, ``bytes_down``, ``bytes_up`` and ``examples_processed`` (by the
        applied updates; the work of discarded and failed tasks is in their counts).
      participation: ``[N]`` updates of each client that were applied.
      staleness: ``[max_staleness + 1]`` histogram of the applied updates' staleness.
    """

    per_round: dict[str, np.ndarray]
    participation: np.ndarray
    staleness: np.ndarray

    def upto(self, done: int) -> dict[str, Any]:
        """Cumulative figures after ``done`` events, for one ``metrics.jsonl`` line."""
        r = self.per_round
        return {
            "virtual_s": float(r["clock_s"][done - 1]) if done else 0.0,
            **{k: int(r[k][:done].sum()) for k in ("applied", "discarded", "dropped", "dispatched")},
            "in_flight": int(r["in_flight"][done - 1]) if done else 0,
            "bytes_down": float(r["bytes_down"][:done].sum()),
            "bytes_up": float(r["bytes_up"][:done].sum()),
            "examples_processed": float(r["examples_processed"][:done].sum()),
        }

    def plot(self, path) -> None:
        """``async.png``: concurrency over virtual hours, staleness, participation."""
        from fedjax_het.system.plots import plot_async  # matplotlib, only when writing

        r = self.per_round
        plot_async(r["clock_s"], r["in_flight"], self.staleness, self.participation, path)

    def totals(self) -> dict[str, Any]:
        """Whole-run figures for ``summary.json``."""
        r = self.per_round
        final = self.upto(len(r["clock_s"]))
        applied = max(final["applied"], 1)
        return {
            **final,
            "discarded_share": final["discarded"] / max(final["applied"] + final["discarded"], 1),
            "mean_in_flight": float(np.mean(r["in_flight"])) if len(r["in_flight"]) else 0.0,
            "staleness_histogram": self.staleness.tolist(),
            "staleness_mean": float(np.arange(len(self.staleness)) @ self.staleness) / applied,
            "stalled_events": int(np.sum(r["applied"] == 0)),
            "participation_gini": gini(self.participation),
            "clients_never_participated": int(np.sum(self.participation == 0)),
        }


def event_accounting(plans, spec, count: np.ndarray, num_clients: int, max_staleness: int
                     ) -> EventAccounting:
    """Accounts a ``system.events.EventSchedule`` of a run with local work ``spec.work``."""
    s = jax.device_get(plans)
    valid = np.asarray(s.valid)
    processed = _examples_processed(s, spec, count)
    tau = np.where(valid, np.arange(valid.shape[0])[:, None] - np.asarray(s.version), 0)
    applied = valid.sum(axis=1)
    per_round = {
        "duration_s": np.asarray(s.duration, np.float64),
        "clock_s": np.asarray(s.clock, np.float64) - float(np.asarray(s.start)[0]),
        "applied": applied,
        "discarded": np.asarray(s.discarded),
        "dropped": np.asarray(s.dropped),
        "dispatched": np.asarray(s.dispatched),
        "in_flight": np.asarray(s.in_flight),
        "staleness_mean": tau.sum(axis=1) / np.maximum(applied, 1),
        "bytes_down": np.asarray(s.bytes_down, np.float64),
        "bytes_up": np.asarray(s.bytes_up, np.float64),
        "examples_processed": processed.sum(axis=1).astype(np.float64),
    }
    histogram = np.bincount(tau[valid], minlength=max_staleness + 1)
    participation = np.asarray(participation_counts(s, num_clients))
    return EventAccounting(per_round, participation, histogram)
