"""Real system profiles shipped with the package, and the assembly of ``ClientProfiles``.

Three measured sources, converted by ``experiments/build_system_assets.py`` and described in
``assets/README.md`` (provenance, licence, checksums):

- **compute**: the AI-Benchmark ranking table as FLASH ships it (333 phones; Ignatov et al.,
  "AI Benchmark: All About Deep Learning on Smartphones in 2019"), ``load_devices``, turned
  into seconds per local step by ``step_time_from_score``;
- **network**: FLASH's 19 measured up/down throughput profiles (from MobiPerf), ``load_network``;
- **state**: 3,478 real 48-hour "ready" traces of FLASH's early data (2018-03-06/07), under a
  strict (charging) or loose (charging or battery okay) rule, ``load_traces``.

``flash_profiles`` draws a device, a network profile and a trace for each of ``N`` clients
(or takes the rows a sampler in ``fedjax_het.sampling`` chose) and returns ``ClientProfiles``.
Synthetic generators are in ``sources_synthetic``; loaders for user CSVs in ``sources_csv``.
All FLASH data: Yang et al., "Characterizing Impacts of Heterogeneity in Federated Learning upon
Large-Scale Smartphone Data", WWW 2021. BSD-2-Clause, Copyright (c) 2018, TalwalkarLab.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het.system.availability import ALWAYS, Availability
from fedjax_het.system.profiles import ClientProfiles, no_traces
from fedjax_het.typing import PRNGKey

TRACE_PERIOD_S = 172_800.0  # the traces' 48-hour window; position 0 = 2018-03-06 00:00 local
TRACE_RULES = ("strict", "loose")

# Bytes per second in one unit of a network profile. FLASH's values have the magnitude of
# MobiPerf ``tcp_speed_results``, which are kbit/s (the default here); FLASH's own code divides
# a model size in KiB by them, i.e. reads them as KiB/s, 8.192x faster ("KiB/s" follows it).
# FLHetBench divides kbit/s by 8 and a payload in KiB by the result (notes §3.2-3.3), which is
# 1 kbit = 1,024 bits ("Kibit/s").
BYTES_PER_SECOND = {
    "kbit/s": 1000.0 / 8.0,
    "Kibit/s": 1024.0 / 8.0,
    "kB/s": 1000.0,
    "KiB/s": 1024.0,
}

# A training step costs about three forward passes: the backward pass is about twice the
# forward (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", §2.1: C ~ 6N per
# token against 2N forward); FedScale's ``3 x batch x steps x ms_per_sample`` uses the same 3.
TRAIN_COST_PER_FORWARD = 3.0

_DEVICE_TEXT_COLUMNS = ("model", "cpu", "android", "updated")
_DEVICE_INT_COLUMNS = ("row", "year")


def _asset(name: str):
    return importlib.resources.files("fedjax_het.system") / "assets" / name


def _read_csv_asset(name: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(_asset(name).read_text(encoding="utf-8"))))


@functools.cache
def _devices() -> tuple[tuple[str, np.ndarray], ...]:
    rows = _read_csv_asset("ai_benchmark_devices.csv")
    columns = {}
    for name in rows[0]:
        values = [row[name].strip() for row in rows]
        if name in _DEVICE_TEXT_COLUMNS:
            array = np.asarray(values, dtype=str)
        elif name in _DEVICE_INT_COLUMNS:
            array = np.asarray(values, dtype=np.int64)
        else:
            array = np.asarray(values, dtype=np.float64)
        array.flags.writeable = False
        columns[name] = array
    return tuple(columns.items())


def load_devices() -> dict[str, np.ndarray]:
    """The AI-Benchmark table shipped by FLASH: 333 rows (307 phone models), as arrays.

    Rows are in the source order, highest ``ai_score`` first. Numeric columns are float64
    (``row`` and ``year`` int64); ``model``, ``cpu``, ``android`` and ``updated`` (month.year of
    the ranking, ``"1.20"`` = January 2020) are strings. Score columns are unitless, higher is
    faster: ``ai_score`` (212 to 76,206, median 5,063), ``cpu_q_ai_score``, ``cpu_f_ai_score``,
    ``quant_score``, ``fp16_score``, ``fp32_score``, ``fp_par_score``; also ``ram_gb``,
    ``quant_accuracy``, ``fp16_accuracy``, ``memory``, ``accuracy``. FedScale keeps only
    phones with more than 2 GB of RAM: ``np.flatnonzero(load_devices()["ram_gb"] > 2)``.

    >>> table = load_devices()
    >>> table["ai_score"].shape, str(table["model"][0])
    ((333,), 'Huawei Mate 30 Pro 5G')
    """
    return dict(_devices())


def step_time_from_score(
    score,
    *,
    flops_per_example: float,
    batch_size: int,
    reference_score: float,
    reference_flops_per_s: float,
):
    """Seconds per local training step of a device, from its AI-Benchmark score.

    The rule (a FLOP count times a reference speed, scaled by the score)::

        speed = reference_flops_per_s * score / reference_score     # FLOP/s of this device
        step_time = 3 * flops_per_example * batch_size / speed

    ``3`` is ``TRAIN_COST_PER_FORWARD`` (forward + backward ~ 3 forward passes; Kaplan et al.
    2020 §2.1, and FedScale's ``3 x batch x steps x ms_per_sample``). ``flops_per_example`` is
    the model's forward cost of one example; ``reference_flops_per_s`` is the training
    throughput actually sustained (not the peak) on a phone whose score is ``reference_score``.
    No paper publishes that throughput for this table: measure one phone (or take a figure you
    can cite) and pass both numbers; the median phone of the table has ``ai_score`` 5,063.

    Warning: speed is taken to be proportional to the score, a deliberate simplification.
    FLASH instead snaps every device to the nearest of three phones it measured (Nexus S,
    Redmi Note 7 Pro, Pixel 4) and uses their measured times.

    Args:
      score: AI score(s), > 0, any shape (numpy or jax array, or a float).
      flops_per_example, batch_size, reference_score, reference_flops_per_s: positive numbers.

    Returns:
      Seconds per step, the shape of ``score``.

    >>> step_time_from_score(10_000.0, flops_per_example=1e6, batch_size=32,
    ...                      reference_score=5_000.0, reference_flops_per_s=1e9)
    0.048
    """
    for name, value in (
        ("flops_per_example", flops_per_example),
        ("batch_size", batch_size),
        ("reference_score", reference_score),
        ("reference_flops_per_s", reference_flops_per_s),
    ):
        if isinstance(value, int | float) and not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")
    if not isinstance(score, jax.core.Tracer) and np.any(~(np.asarray(score) > 0)):
        raise ValueError("score must be > 0 (AI-Benchmark scores are positive)")
    flops_per_step = TRAIN_COST_PER_FORWARD * flops_per_example * batch_size
    return flops_per_step / (reference_flops_per_s * (score / reference_score))


@functools.cache
def _network() -> tuple[tuple[str, np.ndarray], ...]:
    rows = _read_csv_asset("network_speed_profiles.csv")
    names = ("down_mean", "down_std", "up_mean", "up_std")
    return tuple((name, np.asarray([float(row[name]) for row in rows])) for name in names)


def load_network(unit: str = "kbit/s") -> dict[str, np.ndarray]:
    """FLASH's 19 network profiles in bytes per second.

    Each profile is the mean and standard deviation of a phone's download and upload
    throughput; FLASH gives each client one profile and draws a speed from the normal
    distribution, resampling negative draws, for every transfer (here ``profiles.draw_speed``).

    Args:
      unit: how to read the source numbers. ``"kbit/s"`` (default; the MobiPerf unit their
        magnitudes match): bytes/s = value * 1000 / 8. ``"KiB/s"``: value * 1024, FLASH's code,
        which divides a model size in KiB by them. ``"Kibit/s"``: value * 1024 / 8,
        FLHetBench's arithmetic for its MobiPerf lists. ``"kB/s"``: value * 1000.

    Returns:
      ``down_mean``, ``down_std``, ``up_mean``, ``up_std``: float64 ``[19]`` bytes/s.

    >>> int(load_network()["down_mean"][2]), int(load_network("KiB/s")["down_mean"][2])
    (296276, 2427095)
    """
    if unit not in BYTES_PER_SECOND:
        raise ValueError(f"unit must be one of {sorted(BYTES_PER_SECOND)}, got {unit!r}")
    return {name: values * BYTES_PER_SECOND[unit] for name, values in _network()}


@functools.cache
def _trace_intervals(rule: str) -> tuple[np.ndarray, ...]:
    with _asset("flash_availability_2018.npz").open("rb") as f, np.load(f) as npz:
        start, end, count = (npz[f"{rule}_{k}"] for k in ("start", "end", "count"))
    bounds = np.cumsum(count)[:-1]
    pairs = np.stack([start, end], axis=1).astype(np.float64)
    return tuple(np.split(pairs, bounds))


def load_traces(
    rule: str = "strict", *, min_interval: float = 0.0, drop_never_ready: bool = False
) -> tuple[Availability, np.ndarray]:
    """The 3,478 real 48-hour availability traces as an ``Availability``.

    Each trace is one phone's ready intervals in the 48 hours from 2018-03-06 00:00 local time
    (most likely UTC+8), replayed cyclically with period 172,800 s; simulated time 0 is that
    midnight for every client, so the diurnal pattern is shared (ready share about 3 % by day,
    22 % overnight). ``"strict"``: the phone is charging (31,436 intervals). ``"loose"``:
    charging or battery okay (28,664). The median interval is about a minute, because charging
    flickers; ``min_interval`` (seconds, e.g. one round) drops shorter intervals.

    Traces with no (usable) interval are never available: 610 under ``strict`` and 630 under
    ``loose`` with ``min_interval=0``, more with a larger ``min_interval``. They are real users,
    part of the state heterogeneity, and kept unless ``drop_never_ready``.

    Returns:
      ``(availability, source_ids)``: trace ``k`` of ``availability`` is client
      ``source_ids[k]`` of the source data (``arange(3478)`` unless traces were dropped).

    >>> av, ids = load_traces("strict", drop_never_ready=True)
    >>> av.num_traces, int(ids[0]), float(av.period[0])
    (2868, 0, 172800.0)
    """
    if rule not in TRACE_RULES:
        raise ValueError(f"rule must be one of {TRACE_RULES}, got {rule!r}")
    if not min_interval >= 0:
        raise ValueError(f"min_interval must be >= 0 seconds, got {min_interval}")
    return _load_traces(rule, float(min_interval), bool(drop_never_ready))


@functools.cache
def _load_traces(
    rule: str, min_interval: float, drop_never_ready: bool
) -> tuple[Availability, np.ndarray]:
    intervals = _trace_intervals(rule)
    source_ids = np.arange(len(intervals))
    if drop_never_ready:
        usable = [np.any(p[:, 1] - p[:, 0] >= max(min_interval, 1e-9)) for p in intervals]
        source_ids = source_ids[np.asarray(usable, bool)]
    source_ids.flags.writeable = False
    with jax.ensure_compile_time_eval():  # concrete arrays even when called under jit
        availability = Availability.from_intervals(
            [intervals[i] for i in source_ids], TRACE_PERIOD_S, min_interval=min_interval
        )
    return availability, source_ids


@functools.partial(jax.jit, static_argnums=(1, 2))
def draw_rows(key: PRNGKey, num_clients: int, pool_size: int) -> jax.Array:
    """``[num_clients]`` rows of a pool of ``pool_size``, uniform and balanced.

    The concatenation of independent uniform permutations of the pool (an argsort of random
    bits), cut to ``num_clients``: every client's row is uniform over the pool, clients get
    distinct rows while ``num_clients <= pool_size``, and the rows' use counts differ by at
    most one.
    """
    if num_clients < 1 or pool_size < 1:
        raise ValueError(f"num_clients and pool_size must be >= 1, got {num_clients}, {pool_size}")
    repeats = -(-num_clients // pool_size)
    # Drawn flat then reshaped: XLA:CPU compiles a 2-D draw with a short last axis slowly.
    bits = jax.random.bits(key, (repeats * pool_size,)).reshape(repeats, pool_size)
    perms = jnp.argsort(bits, axis=-1)
    return perms.reshape(-1)[:num_clients].astype(jnp.int32)


def assemble_profiles(
    step_time,
    *,
    down_mean,
    down_std,
    up_mean,
    up_std,
    trace=None,
    availability: Availability | None = None,
    dropout=0.0,
) -> ClientProfiles:
    """``ClientProfiles`` from per-client arrays, broadcasting scalars to ``[N]``.

    ``N`` is the length of ``step_time`` (seconds per step). Throughputs are bytes/s;
    ``dropout`` is each client's probability of dropping out of a round it started.
    ``trace=None`` makes every client always available; otherwise ``trace[i]`` indexes
    ``availability`` (``-1`` = always available). Jit-able; values are checked by
    ``profiles.validate`` on the host, shapes here.
    """
    step_time = jnp.asarray(step_time, jnp.float32)
    if step_time.ndim != 1:
        raise ValueError(f"step_time must be a [num_clients] array, got shape {step_time.shape}")
    n = step_time.shape[0]

    def per_client(name, value, dtype):
        value = jnp.asarray(value, dtype)
        if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != n):
            raise ValueError(f"{name} must be a scalar or a [{n}] array, got shape {value.shape}")
        return jnp.broadcast_to(value, (n,))

    if (trace is None) != (availability is None):
        raise ValueError("trace and availability must be given together (or neither)")
    if availability is None:
        availability, trace = no_traces(), ALWAYS
    return ClientProfiles(
        step_time=step_time,
        down_mean=per_client("down_mean", down_mean, jnp.float32),
        down_std=per_client("down_std", down_std, jnp.float32),
        up_mean=per_client("up_mean", up_mean, jnp.float32),
        up_std=per_client("up_std", up_std, jnp.float32),
        trace=per_client("trace", trace, jnp.int32),
        dropout=per_client("dropout", dropout, jnp.float32),
        availability=availability,
    )


def flash_profiles(
    key: PRNGKey,
    num_clients: int,
    *,
    score_to_step_time: Callable[[np.ndarray], np.ndarray],
    availability: Availability | None = None,
    device_rows=None,
    network_rows=None,
    trace_rows=None,
    score_column: str = "ai_score",
    network_unit: str = "kbit/s",
    dropout=0.0,
) -> ClientProfiles:
    """Profiles of ``num_clients`` clients built from the shipped real data.

    Client ``i`` gets device row ``device_rows[i]`` of ``load_devices()``, network profile
    ``network_rows[i]`` of ``load_network(network_unit)`` and trace ``trace_rows[i]`` of
    ``availability`` (default: ``load_traces("strict")[0]``, all 3,478 traces). Each of the
    three left as ``None`` is drawn by ``draw_rows`` (uniform, distinct while the pool lasts)
    from its own split of ``key``; a sampler (DPGMM, DPCSM in ``fedjax_het.sampling``) passes
    the rows it chose instead. Jit-able in ``key``, the rows and ``dropout``.

    Args:
      key: PRNG key for the rows left to draw.
      num_clients: N.
      score_to_step_time: maps the ``score_column`` scores ``[333]`` to seconds per step,
        e.g. ``functools.partial(step_time_from_score, flops_per_example=..., ...)``.
      dropout: per-round dropout probability, a scalar or ``[N]``
        (``sources_synthetic.exponential_dropout`` draws HDFL's).

    >>> import functools, jax
    >>> rule = functools.partial(step_time_from_score, flops_per_example=1e6, batch_size=32,
    ...                          reference_score=5_063.0, reference_flops_per_s=1e9)
    >>> p = flash_profiles(jax.random.key(0), 100, score_to_step_time=rule, dropout=0.1)
    >>> p.num_clients, p.availability.num_traces
    (100, 3478)
    """
    table = load_devices()
    if score_column not in table or table[score_column].dtype != np.float64:
        raise ValueError(
            f"score_column must be a numeric column of load_devices(), got {score_column!r}"
        )
    network = load_network(network_unit)
    if availability is None:
        availability, _ = load_traces("strict")
    step_per_row = jnp.asarray(score_to_step_time(table[score_column]), jnp.float32)
    pools = (step_per_row.shape[0], network["down_mean"].shape[0], availability.num_traces)
    given = (device_rows, network_rows, trace_rows)
    names = ("device_rows", "network_rows", "trace_rows")
    for name, rows, pool, lowest in zip(names, given, pools, (0, 0, -1)):  # trace -1: always
        if rows is None:
            continue
        if np.shape(rows) != (num_clients,):
            raise ValueError(f"{name} must have shape ({num_clients},), got {np.shape(rows)}")
        if isinstance(rows, jax.core.Tracer):
            continue  # traced rows cannot be range-checked here
        values = np.asarray(rows)
        if np.any((values < lowest) | (values >= pool)):
            raise ValueError(f"{name} must lie in [{lowest}, {pool}), got {values}")
    return _assign(key, num_clients, pools, step_per_row, network, availability, given, dropout)


@functools.partial(jax.jit, static_argnums=(1, 2))
def _assign(key, num_clients, pools, step_per_row, network, availability, given, dropout):
    """Draws the rows left as ``None`` and gathers every client's profile, in one program."""
    keys = jax.random.split(key, len(pools))
    device, net, trace = (
        draw_rows(k, num_clients, pool) if rows is None else jnp.asarray(rows, jnp.int32)
        for k, pool, rows in zip(keys, pools, given)
    )
    return assemble_profiles(
        step_per_row[device],
        **{name: jnp.asarray(values, jnp.float32)[net] for name, values in network.items()},
        trace=trace,
        availability=availability,
        dropout=dropout,
    )
