"""GANDALF end to end: GAN rebalancing (phases 1-2), then mediator training (phase 3).

Chou, Chang, Chou, "A GAN-based Data Augmentation Framework for Federated
Learning on Non-IID Data" (GANDALF; notes: dace-gandalf-freezefl §B.1).
:func:`run_gandalf` is the one entry point behind ``algorithm.name =
"gandalf"`` (``gan=True``) and ``"mediator"`` (``gan=False``):

1. with ``gan``: ``rebalance.label_groups`` (K-Means into ``M_g`` label
   groups, Algorithm 2) -> ``gan.train_sequential`` (one conditional WGAN-GP
   per group, client to client, Algorithm 1) -> ``rebalance.augmentation_counts``
   (``B = tau pinv(A) H`` over each client's ``J`` GANs, static top-up capped at
   ``static_cap`` times the source rows, §4.2) -> ``rebalance.augment`` (the
   synthetic rows join each client's rows in the flat store);
2. ``grouping.kl_groups`` (greedy KL grouping into ``M_c`` mediators,
   Algorithm 4) on the class counts of the (augmented) training data;
3. ``mediator.run_mediator`` (Algorithm 3 with the fault tolerance of §3.4):
   ``E_m`` passes per round, ``T_R`` maximum wait, heartbeat and rollback.

It returns the evaluations on the virtual clock, the per-round metrics and, as
in the paper's Table 2, the rounds and virtual seconds to each target accuracy.

Defaults (:func:`gandalf_options`) follow §5.1 of the paper where it gives one:
``M_g = M_c = 2``, ``tau = 0.5`` (CINIC-10; 0.07 for EMNIST), ``T_g = 3``,
``T_d = 2``, ``E_m = 1``, every client receives all ``M_g`` GANs (``J = M_g``),
GAN batch 256, static cap 2x. The paper gives no ``T_R`` nor heartbeat
timeout: ``max_wait = 60`` s and ``heartbeat = 5`` s are placeholders to be set
from the clients' speeds (``experiments/gandalf_fault_tolerance.py`` derives
them from Table 2's round lengths). ``gan_passes = 1`` stands in for the
paper's "until the GAN converges".

Clients with one training example cannot train a GAN (WGAN-GP's penalty
interpolates between two rows): ``gan.train_sequential`` skips them (they still
receive synthetic rows); a GAN group with no client of two or more rows is a
``ValueError``.

.. warning:: The mediator baseline (``gan=False``) trains on the raw data: no
   static augmentation either. FedAvg is the mediator run with ``group_size=1``
   (every client its own group, one pass), whose round is
   ``sum_k (n_k / n) w_k`` over the clients that trained.

>>> gandalf_options(tau=0.07).gan_groups
2

Over 400 lines on purpose: it is the paper's pipeline end to end, and most of it is the
docstrings of the phases' options, kept where they are read.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedjax_het import rng
from fedjax_het.data.batching import LocalWork
from fedjax_het.data.federated import FederatedData
from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.gandalf import gan as gan_lib
from fedjax_het.gandalf import rebalance, wgan
from fedjax_het.gandalf.grouping import Groups, kl_groups
from fedjax_het.gandalf.mediator import Continuation, MediatorHistory, run_mediator
from fedjax_het.models import Model
from fedjax_het.system.profiles import ClientProfiles
from fedjax_het.training import interrupt, metrics


@dataclasses.dataclass(frozen=True)
class GandalfOptions:
    """The validated options of a GANDALF or mediator run (build with :func:`gandalf_options`).

    Attributes:
      group_size: clients per mediator group; None when ``num_mediators`` is given.
      num_mediators: ``M_c``, mediator groups (Algorithm 4's cap ``ceil(K / M_c)``).
      passes: ``E_m``, passes of the weights over each group per round.
      max_wait: ``T_R``, seconds a mediator waits for a client.
      fault_tolerance: balanced order, heartbeat and rollback (§3.4); False: fixed
        order, every failure costs ``T_R``.
      heartbeat: seconds of silence after which a gone client is noticed (<= ``T_R``).
      gan: run phases 1-2 (GAN augmentation) before training.
      tau: degree of balancing in (0, 1].
      gan_groups: ``M_g``, K-Means label groups, one GAN each.
      gans_per_client: ``J``, GANs each client receives (None: all ``M_g``).
      critic_steps, generator_steps: ``T_d`` and ``T_g`` per client visit.
      gan_passes: sweeps of each GAN over its group's clients.
      gan_batch_size: rows per critic or generator batch.
      gan_hidden: hidden widths of both GAN networks.
      gan_output: the generator's output, "linear", "sigmoid" (data in [0, 1]) or "tanh".
      static_cap: static rows of a class at most this multiple of the client's rows of it.
      chunk: mediator groups per ``vmap`` (None: all).
    """

    group_size: int | None = None
    num_mediators: int | None = 2
    passes: int = 1
    max_wait: float = 60.0
    fault_tolerance: bool = True
    heartbeat: float = 5.0
    gan: bool = True
    tau: float = 0.5
    gan_groups: int = 2
    gans_per_client: int | None = None
    critic_steps: int = 2
    generator_steps: int = 3
    gan_passes: int = 1
    gan_batch_size: int = 256
    gan_hidden: tuple[int, ...] = (256, 256)
    gan_output: str = "linear"
    static_cap: float = 2.0
    chunk: int | None = None


_GAN_OUTPUTS = ("linear", "sigmoid", "tanh")


def gandalf_options(**kwargs: Any) -> GandalfOptions:
    """A ``GandalfOptions`` from config keys, each checked with a one-line ``ValueError``.

    Give at most one of ``group_size`` and ``num_mediators``; giving
    ``group_size`` alone drops the default ``num_mediators``.
    """
    unknown = sorted(set(kwargs) - {f.name for f in dataclasses.fields(GandalfOptions)})
    if unknown:
        raise ValueError(f"unknown gandalf option(s) {unknown}")
    if kwargs.get("group_size") is not None and "num_mediators" not in kwargs:
        kwargs["num_mediators"] = None
    if "gan_hidden" in kwargs:
        kwargs["gan_hidden"] = tuple(kwargs["gan_hidden"])
    options = GandalfOptions(**kwargs)
    if (options.group_size is None) == (options.num_mediators is None):
        raise ValueError("give exactly one of group_size and num_mediators (M_c)")
    for name in ("group_size", "num_mediators", "gans_per_client", "chunk"):
        value = getattr(options, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    for name in ("passes", "gan_groups", "critic_steps", "generator_steps", "gan_passes",
                 "gan_batch_size"):  # fmt: skip
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    for name in ("fault_tolerance", "gan"):
        if type(getattr(options, name)) is not bool:
            raise ValueError(f"{name} must be true or false, got {getattr(options, name)!r}")
    if not 0 < options.max_wait < math.inf:
        raise ValueError(f"max_wait (T_R) must be > 0 seconds and finite, got {options.max_wait}")
    if not 0 <= options.heartbeat <= options.max_wait:
        raise ValueError(
            f"heartbeat must be in [0, max_wait={options.max_wait}] seconds, got {options.heartbeat}"
        )
    if not 0 < options.tau <= 1:
        raise ValueError(f"tau must be in (0, 1], got {options.tau}")
    if options.gans_per_client is not None and options.gans_per_client > options.gan_groups:
        raise ValueError(
            f"gans_per_client (J) must be <= gan_groups (M_g={options.gan_groups}), "
            f"got {options.gans_per_client}"
        )
    if not options.gan_hidden or any(
        isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in options.gan_hidden
    ):
        raise ValueError(f"gan_hidden must be widths >= 1, got {options.gan_hidden}")
    if options.gan_output not in _GAN_OUTPUTS:
        raise ValueError(f"gan_output must be one of {_GAN_OUTPUTS}, got {options.gan_output!r}")
    if not 0 <= options.static_cap < math.inf:
        raise ValueError(f"static_cap must be finite and >= 0, got {options.static_cap}")
    return options


def gandalf_data(
    data: FederatedData, options: GandalfOptions, *, seed: int, progress: bool = False
) -> rebalance.Augmented:
    """Phases 1-2: label groups, one WGAN-GP per group, synthetic rows in the flat store.

    Keys: ``stream(seed_key(seed), "gandalf_gan")`` for the GANs and
    ``"gandalf_augment"`` for the generated and static rows; K-Means is seeded by ``seed``.
    ``progress``: bars of the GANs' client visits (``gan.train_sequential``) and of the
    clients given synthetic rows (``rebalance.augment``).
    """
    counts = rebalance.class_counts(data.train, data.num_classes)
    if options.gan_groups > data.num_clients:
        raise ValueError(
            f"gan_groups (M_g={options.gan_groups}) exceeds the {data.num_clients} clients"
        )
    if int(np.sum(data.train.count >= 2)) == 0:
        raise ValueError("gan=True needs a client with >= 2 training examples to train a GAN on")
    groups = rebalance.label_groups(counts, options.gan_groups, seed)
    features = int(np.prod(data.example_shape, dtype=np.int64))
    network = wgan.wgan_gp(
        features,
        data.num_classes,
        hidden=options.gan_hidden,
        output=options.gan_output,
        critic_steps=options.critic_steps,
        generator_steps=options.generator_steps,
    )
    key = rng.seed_key(seed)
    states, _ = gan_lib.train_sequential(
        network,
        data.train,
        groups,
        key=rng.stream(key, "gandalf_gan"),
        passes=options.gan_passes,
        batch_size=options.gan_batch_size,
        progress=progress,
    )
    added = rebalance.augmentation_counts(
        counts,
        rebalance.group_mix(counts, groups),
        tau=options.tau,
        gans_per_client=options.gans_per_client,
        static_cap=options.static_cap,
    )
    generators = gan_lib.generators(network, states)
    return rebalance.augment(
        data, added, generators, key=rng.stream(key, "gandalf_augment"), progress=progress
    )


@dataclasses.dataclass(frozen=True)
class GandalfResult:
    """What :func:`run_gandalf` returns.

    Attributes:
      evaluations: one dict per evaluation: round (rounds done), virtual_s (seconds
        since ``start``), test_loss, test_accuracy.
      round_metrics: ``{name: [R]}`` from ``run_mediator`` (duration, clock, requests,
        failures, waited, participants, examples, train_loss).
      targets: ``{target: {"round": r, "virtual_s": t}}``, the first evaluation at or
        above each target accuracy (None and None when never reached).
      summary: best and final accuracy, mean round seconds, total virtual seconds,
        failure rate (failures / requests), synthetic rows, wall seconds per phase.
      groups: the mediators' groups.
      history: ``run_mediator``'s full history (final params, plans, participation).
      origin: ``[total]`` origin of every training row (``rebalance.REAL``/``GAN``/``STATIC``).
    """

    evaluations: list[dict[str, float]]
    round_metrics: dict[str, np.ndarray]
    targets: dict[float, dict[str, float | None]]
    summary: dict[str, float]
    groups: Groups
    history: MediatorHistory
    origin: np.ndarray


def run_gandalf(
    data: FederatedData,
    model: Model,
    algorithm: FederatedAlgorithm,
    options: GandalfOptions,
    *,
    rounds: int,
    work: LocalWork,
    hyper: dict[str, float] | None = None,
    seed: int = 0,
    profiles: ClientProfiles | None = None,
    start: float = 0.0,
    eval_every: int = 1,
    targets: Sequence[float] = (),
    augmented: rebalance.Augmented | None = None,
    progress: bool = True,
    continuation: Continuation = Continuation(),
) -> GandalfResult:
    """GANDALF (``options.gan``) or mediator-only training for ``rounds`` rounds.

    Args:
      data: federated data with a test split (the global model is evaluated on all its rows).
      model, algorithm, work, hyper: the user model, its FL algorithm (fedavg's client
        hooks), each client's local work per task (``E`` epochs) and hyperparameters.
      options: from :func:`gandalf_options`.
      rounds: synchronization rounds ``R``.
      seed: seeds the GANs, the augmentation, K-Means and the mediator run.
      profiles: the clients' system profiles (speeds, availability, dropout); None: no failures.
      start: virtual time of round 0 (seconds into the availability traces).
      eval_every: rounds between evaluations; targets are resolved at evaluations only.
      targets: test accuracies in (0, 1] whose rounds and virtual seconds are reported.
      augmented: phases 1-2 already run by :func:`gandalf_data` on ``data`` with these
        options and ``seed`` (reused across runs that differ only in timing); only with ``gan``.
      progress: bars of the GAN phase's client visits (with the critic's Wasserstein
        estimate), of the clients given synthetic rows and of the mediator rounds (with the
        test accuracy), and one line at the end of each phase.
      continuation: a checkpoint to continue from and what to write as the run goes
        (``run_dir.run_in_dir``). Phases 1-2 are computed again on a resume (the same
        rows: every key comes from ``seed``).

    Raises:
      Interrupted: SIGINT or SIGTERM: during phases 1-2 at once (nothing trained), during
        training after the block of rounds it is computing (``continuation.save`` wrote
        a checkpoint).
    """
    _check_run(data, options, targets=targets, augmented=augmented)
    say = print if progress else (lambda *_: None)
    began = time.perf_counter()
    with interrupt.raised():
        data, origin = _training_data(
            data, options, augmented, seed=seed, progress=progress, began=began
        )
    gan_seconds = time.perf_counter() - began
    groups = kl_groups(
        rebalance.class_counts(data.train, data.num_classes),
        group_size=options.group_size,
        num_groups=options.num_mediators,
    )
    history = run_mediator(
        data, model, algorithm, groups, rounds=rounds, work=work, max_wait=options.max_wait,
        heartbeat=options.heartbeat if options.fault_tolerance else None,
        passes=options.passes, profiles=profiles, hyper=hyper, seed=seed, start=start,
        eval_every=eval_every, chunk=options.chunk, continuation=continuation, progress=progress,
    )  # fmt: skip
    train_seconds = time.perf_counter() - began - gan_seconds
    evaluations = [evaluation_line(ev, start) for ev in history.evaluations]
    reached = {float(t): time_to_accuracy(evaluations, t) for t in targets}
    metrics = history.round_metrics
    summary = _summary(
        evaluations, metrics, origin, rounds=rounds, gan_s=gan_seconds, train_s=train_seconds
    )
    say(f"gandalf: {rounds} rounds, best accuracy {summary['best_accuracy']:.4f}, "
        f"{summary['total_virtual_s']:.0f} virtual s ({train_seconds:.1f} s)")  # fmt: skip
    return GandalfResult(evaluations, metrics, reached, summary, groups, history, origin)


def _check_run(
    data: FederatedData,
    options: GandalfOptions,
    *,
    targets: Sequence[float],
    augmented: rebalance.Augmented | None,
) -> None:
    """``run_gandalf``'s inputs that ``gandalf_options`` cannot check alone, each a one-line
    ``ValueError``."""
    if any(not 0 < t <= 1 for t in targets):
        raise ValueError(f"targets must be accuracies in (0, 1], got {list(targets)}")
    if augmented is not None and not options.gan:
        raise ValueError("augmented data was given but options.gan is False")
    if options.num_mediators is not None and options.num_mediators > data.num_clients:
        raise ValueError(
            f"num_mediators (M_c={options.num_mediators}) exceeds the {data.num_clients} clients"
        )
    if options.group_size is not None and options.group_size > data.num_clients:
        raise ValueError(f"group_size={options.group_size} exceeds the {data.num_clients} clients")


def _training_data(
    data: FederatedData,
    options: GandalfOptions,
    augmented: rebalance.Augmented | None,
    *,
    seed: int,
    progress: bool,
    began: float,
) -> tuple[FederatedData, np.ndarray]:
    """The data the mediators train on and the origin of each of its training rows: with
    ``options.gan`` the augmented data (phases 1-2, or ``augmented`` when given), else ``data``
    with every row real. ``progress``: the bars of phases 1-2 and a line at their end."""
    if options.gan:
        if augmented is None:
            augmented = gandalf_data(data, options, seed=seed, progress=progress)
        if augmented.data.num_clients != data.num_clients:
            raise ValueError("augmented data has another number of clients than data")
        data, origin = augmented.data, augmented.origin
        if progress:
            print(f"gandalf: {int(augmented.synthetic.sum())} synthetic rows added "
                  f"({time.perf_counter() - began:.1f} s)")  # fmt: skip
    else:
        origin = np.full(data.train.y.shape[0], rebalance.REAL, np.int8)
    return data, origin


def _summary(
    evaluations: Sequence[dict[str, float]],
    metrics: dict[str, np.ndarray],
    origin: np.ndarray,
    *,
    rounds: int,
    gan_s: float,
    train_s: float,
) -> dict[str, float]:
    """``GandalfResult.summary`` of a run; ``gan_s``, ``train_s``: wall seconds of phases 1-2
    and of training."""
    accuracies = [ev["test_accuracy"] for ev in evaluations]
    return {
        "best_accuracy": max(accuracies),
        "final_accuracy": accuracies[-1],
        "rounds": rounds,
        "mean_round_s": float(np.mean(metrics["duration"])),
        "total_virtual_s": float(np.sum(metrics["duration"])),
        "failure_rate": float(np.sum(metrics["failures"]) / max(np.sum(metrics["requests"]), 1)),
        "synthetic_rows": int(np.sum(origin != rebalance.REAL)),
        "gan_wall_s": gan_s,
        "train_wall_s": train_s,
    }


def evaluation_line(evaluation: dict[str, float], start: float) -> dict[str, float]:
    """A mediator evaluation as a run's metrics line (virtual seconds since ``start``)."""
    return {
        "round": evaluation["round"],
        "virtual_s": evaluation["clock"] - start,
        "test_loss": evaluation["loss"],
        "test_accuracy": evaluation["accuracy"],
    }


def time_to_accuracy(
    evaluations: Sequence[dict[str, float]], target: float
) -> dict[str, float | None]:
    """``{"round", "virtual_s"}`` of the first evaluation with test_accuracy >= ``target``
    (``metrics.time_to_accuracy``'s), both None if none reaches it."""
    hit = metrics.time_to_accuracy(evaluations, [target])[f"{target:g}"]
    return hit or {"round": None, "virtual_s": None}


MEDIATED = {"gandalf": True, "mediator": False}
"""The ``algorithm.name`` values run by :func:`run_gandalf` (not as one cohort a round), and
whether each trains the GANs first."""


def plot(evaluations: Sequence[dict[str, float]], path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0, 4.0), dpi=110)
    ax = fig.add_subplot()
    ax.plot([e["virtual_s"] / 3600 for e in evaluations], [e["test_accuracy"] for e in evaluations])
    ax.set(xlabel="virtual hours", ylabel="test accuracy", title="test accuracy")
    ax.grid(alpha=0.3)
    FigureCanvasAgg(fig)
    fig.savefig(path, format="png")
