"""A run's system heterogeneity from two config tables: ``[system]`` (profiles) and ``[policy]``.

``profiles_from_options`` assembles per-client ``ClientProfiles`` from named
sources: compute from a homogeneous speed, log-normal speeds or the shipped
AI-Benchmark devices (``devices``); network from one bandwidth or the FLASH
profiles (``network``); availability always, Bernoulli slots or the FLASH
traces (``availability``). ``device_sampler`` / ``state_sampler`` choose which
device and trace each client gets with a heterogeneity sampler registered in
``fedjax_het.registry`` (``dpgmm`` and ``dpcsm`` from ``fedjax_het.sampling``
at a ``mild`` / ``middle`` / ``severe`` level); ``random`` draws them
uniformly.

Each of the three sources may instead be your own file: a value ending in
``.csv`` is a path (a relative one is read from the working directory;
``absolute_paths`` pins it for the run's record) in a schema of
``fedjax_het.system.sources_csv``, whose rows for client ``k`` give client
``k``'s profile (no sampler applies).

``policy_from_options`` builds the ``RoundPolicy``.

Compute speed of a device: the median device of the AI-Benchmark table takes
``step_time`` seconds per local step and a device of score ``s`` takes
``step_time * median_score / s`` (speed proportional to the AI score, the
rule of ``sources.step_time_from_score`` with the median device as reference);
an ``ai_score`` column of a devices CSV is read with the same rule.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import registry, rng
from fedjax_het.system import policy as policies
from fedjax_het.system import sources, sources_csv, sources_synthetic
from fedjax_het.system.availability import Availability
from fedjax_het.system.policy import RoundPolicy
from fedjax_het.system.profiles import ClientProfiles, no_traces, validate

DEVICES = ("uniform", "lognormal", "flash")
NETWORKS = ("uniform", "flash")
AVAILABILITY = ("always", "bernoulli", "strict", "loose")
SOURCES = ("devices", "network", "availability")  # the options that also take a CSV path
DAY_S = 86_400.0


@dataclasses.dataclass(frozen=True)
class System:
    """The system side of a run: who can do what, and how rounds are run."""

    profiles: ClientProfiles
    policy: RoundPolicy


def profiles_from_options(
    num_clients: int,
    *,
    seed: int = 0,
    devices: str = "uniform",
    step_time: float = 0.05,
    step_time_sigma: float = 0.5,
    device_sampler: str = "random",
    device_level: str = "middle",
    network: str = "uniform",
    bandwidth: float = 1e7,
    availability: str = "always",
    availability_p: float = 0.5,
    availability_slots: int = 24,
    availability_period: float = DAY_S,
    min_interval: float = 0.0,
    state_sampler: str = "random",
    state_level: str = "middle",
    dropout: float = 0.0,
) -> ClientProfiles:
    """Per-client profiles from named sources (see the module docstring).

    Args:
      num_clients: N.
      seed: seed of every random choice here (rows drawn, synthetic speeds, slots).
      devices: "uniform" (everyone ``step_time``), "lognormal" (median ``step_time``,
        log-std ``step_time_sigma``), "flash" (AI-Benchmark devices) or a CSV path
        (``client,step_time_s`` or ``client,ai_score``, one row per client).
      step_time: seconds of one local step: every device's ("uniform"), the median
        device's ("lognormal", "flash"), >= 0 (0: computing takes no time).
      step_time_sigma: the log-std of the log-normal step times.
      device_sampler: "random" or a registered device sampler (e.g. "dpgmm") choosing the
        AI-Benchmark rows at ``device_level``; only with ``devices = "flash"``.
      device_level: the device sampler's heterogeneity: "mild", "middle" or "severe".
      network: "uniform" (``bandwidth`` bytes/s both ways, no spread; ``inf``: transfers
        take no time), "flash" (the 19 measured profiles, kbit/s read as 125 bytes/s per
        unit) or a CSV path (``client,down_bytes_per_s,up_bytes_per_s``, optional
        ``*_std_bytes_per_s``).
      bandwidth: bytes per second of the "uniform" network, both ways, > 0.
      availability: "always", "bernoulli" (ready in each of ``availability_slots`` slots of a
        cycle of ``availability_period`` seconds with probability ``availability_p``), the
        FLASH traces ("strict", "loose"; their own 48 h cycle) or a CSV path
        (``client,start_s,end_s`` intervals of a cycle of ``availability_period`` seconds,
        every client listed), dropping intervals shorter than ``min_interval`` seconds.
      availability_p: the probability that a "bernoulli" client is ready in a slot, in (0, 1].
      availability_slots: slots of a "bernoulli" cycle.
      availability_period: seconds of a "bernoulli" or CSV availability cycle (a day).
      min_interval: drop ready intervals shorter than this many seconds.
      state_sampler: "random" or a registered state sampler (e.g. "dpcsm") choosing the traces
        at ``state_level``; only with FLASH traces.
      state_level: the state sampler's heterogeneity: "mild", "middle" or "severe".
      dropout: probability that a started client drops out in a round, below 1.

    Raises:
      ValueError: an impossible option (``check_profile_options``).

    References:
      Yang, Wang, Xu, Chen, Bian, Liu and Liu, "Characterizing Impacts of Heterogeneity in
      Federated Learning upon Large-Scale Smartphone Data" (WWW 2021), FLASH's devices, networks
      and traces; Zhang et al., "FLHetBench: Benchmarking Device and State Heterogeneity in
      Federated Learning" (CVPR 2024), its samplers and levels.
    """
    options = dict(locals())  # the keyword options, as passed
    del options["num_clients"]
    check_profile_options(**options)
    key = rng.stream(rng.seed_key(seed), "system")
    step = _step_times(key, num_clients, devices, step_time, step_time_sigma, device_sampler,
                       device_level, seed)
    net = _network(key, num_clients, network, bandwidth)
    trace, av = _availability(key, num_clients, availability, availability_p, availability_slots,
                              availability_period, min_interval, state_sampler, state_level, seed)
    profiles = ClientProfiles(
        step_time=jnp.asarray(step, jnp.float32), **net, trace=trace,
        dropout=jnp.full((num_clients,), dropout, jnp.float32), availability=av,
    )
    validate(profiles)
    return profiles


_LIMITS: dict[str, tuple[Callable[[float], bool], str]] = {
    "seed": (lambda v: v >= 0, ">= 0"),
    "step_time": (lambda v: 0 <= v < math.inf, "a finite number of seconds >= 0"),
    "step_time_sigma": (lambda v: 0 <= v < math.inf, "a finite number >= 0"),
    "bandwidth": (lambda v: v > 0, "> 0 bytes/s (inf: transfers take no time)"),
    "availability_p": (lambda v: 0 < v <= 1, "a probability in (0, 1] (at 0 nobody is ever ready)"),
    "availability_slots": (lambda v: v >= 1, ">= 1"),
    "availability_period": (lambda v: 0 < v < math.inf, "a finite number of seconds > 0"),
    "min_interval": (lambda v: 0 <= v < math.inf, "a finite number of seconds >= 0"),
    "dropout": (
        lambda v: 0 <= v < 1, "a probability in [0, 1) (at 1 every client drops out of every round)"
    ),
}
"""The values each number of ``profiles_from_options`` may take, and how to say so."""


def check_profile_options(**options: Any) -> None:
    """Raises a one-line ValueError naming the first impossible ``[system]`` option.

    ``options`` are keyword options of :func:`profiles_from_options`; those left
    out take its defaults. It needs no data, so the config calls it before
    building any (and ``profiles_from_options`` calls it first).
    """
    defaults = {
        name: p.default for name, p in inspect.signature(profiles_from_options).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }
    o = {**defaults, **options}
    _source("system.devices", o["devices"], DEVICES)
    _source("system.network", o["network"], NETWORKS)
    _source("system.availability", o["availability"], AVAILABILITY)
    for name, (ok, allowed) in _LIMITS.items():
        if not ok(o[name]):
            raise ValueError(f"system.{name} must be {allowed}, got {o[name]}")
    if o["device_sampler"] != "random" and o["devices"] != "flash":
        raise ValueError("system.device_sampler needs devices = \"flash\" (a device database)")
    if o["state_sampler"] != "random" and o["availability"] not in ("strict", "loose"):
        raise ValueError("system.state_sampler needs availability = \"strict\" or \"loose\" traces")


def policy_from_options(
    *,
    kind: str = "wait_all",
    deadline: float = 120.0,
    on_late: str = "drop",
    readiness: float = 0.2,
    over_commit: float = 0.0,
    overhead: float = 0.0,
    start: float = 0.0,
    availability_aware: bool = True,
    on_unavailable: str = "pause",
    max_staleness: int = 0,
) -> RoundPolicy:
    """The ``[policy]`` table: how a synchronous round runs on the clients' devices.

    Args:
      kind: "wait_all" (the round waits for every selected client), "deadline" (it ends
        ``deadline`` seconds after the clients start) or "readiness" (it ends when ``1 -
        readiness`` of the clients finished).
      deadline: seconds a "deadline" round gives its clients, > 0.
      on_late: what a "deadline" round does with work that would end late: "drop" it or
        "partial": the client trains only the steps that fit.
      readiness: the share of started clients a "readiness" round does not wait for, in (0, 1).
      over_commit: select ``ceil(m (1 + over_commit))`` clients and keep the first ``m`` to
        finish, >= 0.
      overhead: server seconds per round (selection, aggregation) before the clients start.
      start: virtual time of round 0, in seconds into the availability traces (86,400: their
        second midnight).
      availability_aware: select only clients ready at the round's start; false: a selected
        client that is not ready is counted unavailable.
      on_unavailable: a device that stops being ready: "pause" its work until it is ready
        again, or "lost": the task fails.
      max_staleness: stale tasks ("deadline" only): a late client keeps working and its update
        counts in the first later round whose deadline covers it, up to this many rounds
        later; 0: late work is lost.

    References:
      Nishio and Yonetani, "Client Selection for Federated Learning with Heterogeneous
      Resources in Mobile Edge" (ICC 2019), deadline rounds; Zhang et al., "FLHetBench" (CVPR
      2024), readiness rounds and stale tasks.
    """
    _one_of("policy.kind", kind, policies.KINDS)
    if max_staleness and kind != "deadline":
        raise ValueError(f"policy.max_staleness (stale tasks) needs policy.kind = 'deadline', "
                         f"got {kind!r}")
    if not 0 < readiness < 1:  # checked under every kind: a value set is a value meant
        raise ValueError(f"policy.readiness is the share of clients not waited for, in (0, 1); "
                         f"got {readiness}")
    common = {"over_commit": over_commit, "overhead": overhead, "start": start,
              "availability_aware": availability_aware, "on_unavailable": on_unavailable}
    if kind == "deadline":
        return policies.deadline(deadline, on_late=on_late, max_staleness=max_staleness, **common)
    if kind == "readiness":
        return policies.readiness(readiness, **common)
    return policies.wait_all(**common)


def is_csv_path(value: str) -> bool:
    """Whether a ``devices`` / ``network`` / ``availability`` value names a file: it ends in
    ``.csv`` (any case). Built-in source names never do."""
    return value.lower().endswith(".csv")


def absolute_paths(options: Mapping[str, Any]) -> dict[str, Any]:
    """``[system]`` options with every CSV source made absolute (a relative path is read from
    the working directory), so that the recorded config reproduces the run from anywhere."""
    return {
        key: str(Path(value).resolve())
        if key in SOURCES and isinstance(value, str) and is_csv_path(value) else value
        for key, value in options.items()
    }


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


def _source(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if not is_csv_path(value) and value not in allowed:
        raise ValueError(
            f"{name} must be one of {', '.join(allowed)} or a path ending in .csv; got {value!r}"
        )


def _rows(key, num_clients: int, pool: int, sampler: str, level: str, values, seed: int, kind):
    if sampler == "random":
        return sources.draw_rows(key, num_clients, pool)
    factory = registry.lookup(kind, sampler)
    return jnp.asarray(factory(np.asarray(values), num_clients=num_clients, level=level, seed=seed))


def _step_times(key, n, devices, step_time, sigma, sampler, level, seed):
    if is_csv_path(devices):
        return jnp.asarray(sources_csv.load_step_times_csv(
            devices, num_clients=n, score_to_step_time=lambda s: step_time * _median_score() / s
        ))
    if devices == "uniform":
        return jnp.full((n,), step_time)
    if devices == "lognormal":
        return sources_synthetic.lognormal_step_times(
            rng.stream(key, "devices"), n, median=step_time, sigma=sigma
        )
    scores = sources.load_devices()["ai_score"]
    rows = _rows(rng.stream(key, "devices"), n, scores.shape[0], sampler, level, scores, seed,
                 "device_sampler")
    return step_time * _median_score() / jnp.asarray(scores)[rows]


def _median_score() -> float:
    """AI score of the median AI-Benchmark device, the one that takes ``step_time`` per step."""
    return float(np.median(sources.load_devices()["ai_score"]))


def _network(key, n, network, bandwidth) -> dict[str, jax.Array]:
    if is_csv_path(network):
        table = sources_csv.load_network_csv(network, num_clients=n)
        return {name: jnp.asarray(values, jnp.float32) for name, values in table.items()}
    if network == "uniform":
        full = jnp.full((n,), bandwidth, jnp.float32)
        spread = jnp.zeros_like(full)  # not 0 * full: bandwidth may be inf
        return {"down_mean": full, "down_std": spread, "up_mean": full, "up_std": spread}
    table = sources.load_network("kbit/s")
    rows = sources.draw_rows(rng.stream(key, "network"), n, table["down_mean"].shape[0])
    return {name: jnp.asarray(table[name], jnp.float32)[rows]
            for name in ("down_mean", "down_std", "up_mean", "up_std")}


def _availability(key, n, kind, p, slots, period, min_interval, sampler, level, seed):
    if kind == "always":
        return jnp.full((n,), -1, jnp.int32), no_traces()
    if is_csv_path(kind):
        av = sources_csv.load_intervals_csv(
            kind, period=period, num_clients=n, min_interval=min_interval, every_client=True
        )
        return jnp.arange(n, dtype=jnp.int32), av
    if kind == "bernoulli":
        av = sources_synthetic.bernoulli_availability(
            rng.stream(key, "availability"), n, p=p, slots=slots, period=period
        )
        return jnp.arange(n, dtype=jnp.int32), av
    av, _ = sources.load_traces(kind, min_interval=min_interval, drop_never_ready=True)
    scores = _ready_fraction(av)
    rows = _rows(rng.stream(key, "availability"), n, av.num_traces, sampler, level, scores, seed,
                 "state_sampler")
    return rows.astype(jnp.int32), av


def _ready_fraction(av: Availability) -> np.ndarray:
    """Each trace's ready share of its cycle, the default DPCSM score (FLHetBench notes §2.2)."""
    return np.asarray(av.ready_per_period) / np.asarray(av.period)
