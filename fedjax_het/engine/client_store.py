"""Where the clients' persistent states live between rounds, and how that is chosen (docs/design.md §8).

An algorithm with memory (SCAFFOLD's control variates, Ditto's personal
models, FedPer's heads) keeps one state per client, ``[num_clients, ...]``
at rest. A round only reads and writes the rows of its cohort: ``gather``
them before local training and ``scatter`` the new rows back, for the
clients whose update counted (a failed or late client keeps its state).

* :class:`DeviceStore` keeps every row in the run state on the device, part
  of the jitted program like any array: ``num_clients x row`` bytes.
* :class:`HostStore` keeps the rows in host numpy arrays, and only the rows of
  clients whose update ever counted, packed in the order they were first
  written (plus a 4-byte index per client); an untouched client reads as the
  initial row, which the run state carries. Inside the jitted round only the
  cohort's rows travel, through ordered ``jax.experimental.io_callback``
  calls, so every gather sees every earlier scatter, across rounds, blocks
  and programs. Results are bit-identical to ``DeviceStore``: rows are
  copied, never recomputed. Each round waits for two host round trips.

Why packed rows and not ``np.zeros([num_clients, ...])`` (whose untouched
pages cost nothing): Linux refuses one allocation much larger than the
machine's memory, which is exactly the case the host store is for.

:func:`plan_client_state` sizes a state from the algorithm's ``client_init`` on
abstract params and chooses the placement before anything compiles:

>>> from fedjax_het import models
>>> from fedjax_het.algorithms import fedavg
>>> personal = fedavg(client_init=lambda params: params)  # a params-sized row per client
>>> model = models.logistic_regression((5,), 3)
>>> p = plan_client_state(personal, model, num_clients=1000, rounds=10, slots=4,
...                       memory=lambda: Memory(device_free=10**9, host_available=10**9))
>>> p.placement, p.row_bytes, p.device_bytes, p.max_rows
('device', 72, 72000, 40)

Stores are static (hashable) under ``jit``.

.. warning:: With a ``HostStore`` the run state holds a handle (the initial
   row and a version number), not the rows: only the newest state of a run
   is valid. Gathering or scattering with an older one raises (the version
   no longer matches). ``HostStore`` cannot be ``vmap``-ed (ordered effects
   do not batch), so ``sweep`` refuses it.

Over 400 lines on purpose: the two stores share one interface and the choice between them
(``plan_client_state``) weighs both stores' sizes, so the three stay together.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.experimental import io_callback, multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fedjax_het.engine.algorithm import FederatedAlgorithm
from fedjax_het.models import Model
from fedjax_het.typing import ClientState, PyTree

PLACEMENTS = ("auto", "device", "host")
COMFORT = 0.5  # "auto" uses at most this share of the free memory for client states


@dataclasses.dataclass(frozen=True)
class DeviceStore:
    """Every client's state as a device array ``[num_clients, ...]`` inside the run state.

    With a ``mesh`` the rows are sharded by client over its ``cohort.CLIENTS``
    axis (padded to a multiple of the device count; the extra rows are never
    read), so each device holds ``1 / devices`` of the table.
    """

    placement: str = "device"
    mesh: Mesh | None = None

    def init(self, one: ClientState, num_clients: int) -> ClientState:
        """The stored states of ``num_clients`` clients, each starting as ``one``."""
        rows = num_clients if self.mesh is None else -(-num_clients // self.mesh.size) * self.mesh.size
        return self._sharded(jax.tree.map(lambda s: jnp.broadcast_to(s, (rows, *s.shape)), one))

    def _sharded(self, held: ClientState) -> ClientState:
        if self.mesh is None:
            return held
        by_client = NamedSharding(self.mesh, PartitionSpec(self.mesh.axis_names[0]))
        return jax.lax.with_sharding_constraint(held, by_client)

    def gather(self, held: ClientState, ids: jax.Array) -> ClientState:
        """The states of clients ``ids [m]``, stacked ``[m, ...]``."""
        return jax.tree.map(lambda s: s[ids], held)

    def scatter(
        self, held: ClientState, ids: jax.Array, new: ClientState, keep: jax.Array
    ) -> ClientState:
        """``held`` with the rows of clients ``ids`` replaced by ``new`` where ``keep [m]``.

        Ids of kept rows must be distinct (a cohort's are); rows not kept are
        not written at all, so an unkept slot may repeat a kept client's id.
        """

        def put(all_rows, rows):
            target = jnp.where(keep, ids, all_rows.shape[0])  # out of range: dropped
            return all_rows.at[target].set(rows, mode="drop")

        return self._sharded(jax.tree.map(put, held, new))

    def read(self, held: ClientState, ids) -> ClientState:
        """Host copies of the states of clients ``ids``, stacked ``[len(ids), ...]``."""
        return jax.tree.map(lambda s: _host_copy(s)[np.asarray(ids)], held)

    def rows_held(self, num_clients: int) -> int:
        """Rows the store holds: every client's."""
        return num_clients

    def host_rows(self) -> dict[str, np.ndarray]:
        """What a checkpoint must keep besides the run state: nothing (the rows are in it)."""
        return {}

    def restore_host_rows(self, arrays: dict[str, np.ndarray]) -> None:
        """Nothing to restore (see ``host_rows``)."""
        del arrays


@struct.dataclass
class HostRows:
    """What the run state holds for a ``HostStore``: the initial row and the table's version."""

    initial: ClientState  # one client's initial state (no client axis): untouched clients read it
    version: jax.Array  # int32 scatters so far; a gather or scatter must match the table's


class _Table:
    """The host side of a ``HostStore``: touched clients' rows, packed in first-write order."""

    def __init__(self):
        self.reset(0)

    def reset(self, num_clients: int, *like: np.ndarray) -> np.ndarray:
        self.slot = np.zeros(num_clients, np.int32)  # 1 + packed row index; 0: untouched
        self.leaves = [np.empty((0, *x.shape), x.dtype) for x in like]
        self.count, self.version = 0, 0
        return np.int32(0)

    def check(self, version) -> None:
        if int(version) != self.version:
            raise RuntimeError(
                f"HostStore: this run state is at version {int(version)} but the host rows are "
                f"at {self.version}; only the newest state of a run can be used"
            )

    def gather(self, version, ids) -> tuple[np.ndarray, ...]:
        self.check(version)
        slot = self.slot[ids] - 1
        has = slot >= 0
        rows = [np.zeros((len(ids), *x.shape[1:]), x.dtype) for x in self.leaves]
        for row, leaf in zip(rows, self.leaves):
            row[has] = leaf[slot[has]]
        return (*rows, has)

    def scatter(self, version, ids, keep, *new: np.ndarray) -> np.ndarray:
        self.check(version)
        ids = ids[keep]
        fresh = ids[self.slot[ids] == 0]
        self.slot[fresh] = self.count + 1 + np.arange(len(fresh), dtype=np.int32)
        self.count += len(fresh)
        if self.leaves and self.count > len(self.leaves[0]):
            capacity = max(self.count, 2 * len(self.leaves[0]))
            self.leaves = [_grown(x, capacity) for x in self.leaves]
        for leaf, rows in zip(self.leaves, new):
            leaf[self.slot[ids] - 1] = rows[keep]
        self.version += 1
        return np.int32(self.version)


def _grown(x: np.ndarray, capacity: int) -> np.ndarray:
    out = np.empty((capacity, *x.shape[1:]), x.dtype)
    out[: len(x)] = x
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class HostStore:
    """Client states in host memory; only touched clients' rows are stored (see the module doc).

    Each instance owns its table (equality and hash are identity); ``init``
    empties it, so one store serves one run at a time.
    """

    placement: str = "host"
    table: _Table = dataclasses.field(default_factory=_Table, repr=False)

    def init(self, one: ClientState, num_clients: int) -> HostRows:
        """Empties the table for ``num_clients`` clients; each reads as ``one`` until written."""
        version = io_callback(
            functools.partial(self.table.reset, num_clients), jax.ShapeDtypeStruct((), jnp.int32),
            *jax.tree.leaves(one), ordered=True,
        )
        return HostRows(one, version)

    def gather(self, held: HostRows, ids: jax.Array) -> ClientState:
        """The states of clients ``ids [m]``, stacked ``[m, ...]``, fetched from the host."""
        leaves, treedef = jax.tree.flatten(held.initial)
        shapes = [jax.ShapeDtypeStruct((*ids.shape, *x.shape), x.dtype) for x in leaves]
        *rows, has = io_callback(
            self.table.gather, (*shapes, jax.ShapeDtypeStruct(ids.shape, jnp.bool_)),
            held.version, ids, ordered=True,
        )
        picked = [
            jnp.where(has.reshape(-1, *[1] * x.ndim), row, x[None]) for row, x in zip(rows, leaves)
        ]
        return jax.tree.unflatten(treedef, picked)

    def scatter(
        self, held: HostRows, ids: jax.Array, new: ClientState, keep: jax.Array
    ) -> HostRows:
        """Writes the rows ``new`` of clients ``ids`` where ``keep [m]`` to the host.

        Ids of kept rows must be distinct (a cohort's are).
        """
        version = io_callback(
            self.table.scatter, jax.ShapeDtypeStruct((), jnp.int32), held.version, ids, keep,
            *jax.tree.leaves(new), ordered=True,
        )
        return HostRows(held.initial, version)

    def read(self, held: HostRows, ids) -> ClientState:
        """Host copies of the states of clients ``ids``, stacked ``[len(ids), ...]``."""
        ids = np.asarray(ids)
        *rows, has = self.table.gather(np.asarray(held.version), ids)
        leaves, treedef = jax.tree.flatten(jax.device_get(held.initial))
        picked = [
            np.where(has.reshape(-1, *[1] * np.ndim(x)), row, np.asarray(x)[None])
            for row, x in zip(rows, leaves)
        ]
        return jax.tree.unflatten(treedef, picked)

    def rows_held(self, num_clients: int) -> int:
        """Rows the store holds: one per client whose update ever counted."""
        del num_clients
        return self.table.count

    def host_rows(self) -> dict[str, np.ndarray]:
        """The host table, for a checkpoint (``restore_host_rows`` puts it back)."""
        table = self.table
        return {
            "host/slot": table.slot, "host/count_version": np.asarray([table.count, table.version]),
            **{f"host/leaf{i}": leaf[: table.count] for i, leaf in enumerate(table.leaves)},
        }

    def restore_host_rows(self, arrays: dict[str, np.ndarray]) -> None:
        """The table as ``host_rows`` saved it (``arrays``: its entries without ``host/``)."""
        table = self.table
        if len(arrays) != 2 + len(table.leaves) or arrays["slot"].shape != table.slot.shape:
            raise ValueError("the checkpoint's host rows are not this run's client states")
        table.slot = arrays["slot"].astype(np.int32)
        table.count, table.version = (int(v) for v in arrays["count_version"])
        table.leaves = [arrays[f"leaf{i}"].copy() for i in range(len(table.leaves))]


ClientStore = DeviceStore | HostStore
ON_DEVICE = DeviceStore()


def _host_copy(x: jax.Array) -> np.ndarray:
    """``x`` as a host array, gathered from every process when it is sharded across hosts."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes free for client states on the device and available on the host."""

    device_free: int
    host_available: int


def available_memory() -> Memory:
    """This process's first device's free memory (``memory_stats``) and the host's available memory.

    A CPU device has no memory of its own: its free memory is the host's.
    """
    host = _host_available()
    stats = jax.local_devices()[0].memory_stats() or {}
    if "bytes_limit" not in stats:
        return Memory(host, host)
    return Memory(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)), host)


def _host_available() -> int:
    """``MemAvailable`` of /proc/meminfo (else ``os.sysconf``), capped by a cgroup v2 limit."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                available = min(available, int(limit) - int(g.read()))
    except (OSError, ValueError):
        pass
    return available


@dataclasses.dataclass(frozen=True)
class StatePlan:
    """Where a run keeps its client states and what they cost.

    Attributes:
      placement: "device", "host", or "none" for a stateless algorithm.
      row_bytes: bytes of one client's state.
      num_clients: clients in the population.
      max_rows: clients whose state a run can ever write, ``min(N, rounds x slots)``.
      runs: runs held at once (``sweep``'s cells).
      devices: devices the rows of a ``DeviceStore`` are sharded over.
    """

    placement: str
    row_bytes: int
    num_clients: int
    max_rows: int
    runs: int = 1
    devices: int = 1

    @property
    def device_bytes(self) -> int:
        """Bytes of every client's state (what a ``DeviceStore`` holds)."""
        return self.runs * self.num_clients * self.row_bytes

    @property
    def host_bytes(self) -> int:
        """Most bytes a ``HostStore`` can come to hold (``max_rows`` rows)."""
        return self.runs * self.max_rows * self.row_bytes

    def store(self, mesh: Mesh | None = None) -> ClientStore:
        """A new store for this placement (a ``HostStore`` owns its table; a ``DeviceStore``
        shards its rows over ``mesh``)."""
        if self.placement == "host":
            return HostStore()
        return ON_DEVICE if mesh is None else DeviceStore(mesh=mesh)

    def held_bytes(self, store: ClientStore) -> int:
        """Bytes ``store`` holds now (one run's)."""
        return self.row_bytes * store.rows_held(self.num_clients) if self.row_bytes else 0


def tree_bytes(tree: PyTree) -> int:
    """Bytes of the arrays (or shape/dtype structs) of ``tree``."""
    return sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def format_bytes(n: float) -> str:
    """``n`` bytes for a person: "1.5 GB"."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def plan_client_state(
    algorithm: FederatedAlgorithm, model: Model, *, num_clients: int, rounds: int, slots: int,
    placement: str = "auto", runs: int = 1, devices: int = 1,
    memory: Callable[[], Memory] = available_memory,
) -> StatePlan:
    """Sizes the client state on abstract params and chooses where it lives.

    Args:
      algorithm, model: the state is ``algorithm.client_init(model.init(key))``,
        sized with ``jax.eval_shape`` (nothing is computed).
      num_clients: the population N.
      rounds, slots: a run writes at most ``rounds x slots`` clients' rows.
      placement: "device", "host", or "auto": the device when every client's state
        fits in ``COMFORT`` of its free memory, else the host when the rows a run
        can write fit in ``COMFORT`` of its available memory.
      runs: runs held at once (``sweep``'s cells).
      devices: devices a ``DeviceStore`` shards the rows over (each holds its share).
      memory: the memory query (injectable for tests).

    Returns:
      The plan; a stateless algorithm (``client_init`` gives ``()``) gets
      placement "none" and no memory query.

    Raises:
      ValueError: (one line) an unknown placement, or a state that does not
        fit where it must go, with the bytes it needs and the bytes available.
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"client_state must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    row = jax.eval_shape(lambda key: algorithm.client_init(model.init(key)), jax.random.key(0))
    result = StatePlan(
        "none", tree_bytes(row), num_clients, min(num_clients, rounds * slots), runs, devices
    )
    if result.row_bytes == 0:
        return result
    free = memory()
    per_device = result.device_bytes / devices
    on_device = per_device <= free.device_free * (COMFORT if placement == "auto" else 1)
    on_host = result.host_bytes <= free.host_available * (COMFORT if placement == "auto" else 1)
    if placement == "auto":
        placement = "device" if on_device else "host" if on_host else "nowhere"
    if placement == "device" and on_device or placement == "host" and on_host:
        return dataclasses.replace(result, placement=placement)
    advice = {
        "nowhere": "automatic placement uses at most half of either",
        "device": "engine.client_state = 'device' does not fit",
        "host": "engine.client_state = 'host' does not fit",
    }[placement]
    cells = f" x {runs} runs" if runs > 1 else ""
    shared = f" over {devices} devices" if devices > 1 else ""
    raise ValueError(
        f"client state needs {format_bytes(result.device_bytes)} ({num_clients} clients x "
        f"{format_bytes(result.row_bytes)}{cells}) on the device{shared}, or {format_bytes(result.host_bytes)} on the "
        f"host for the at most {result.max_rows} clients that {rounds} rounds of {slots} slots "
        f"write; the device has {format_bytes(free.device_free)} free and the host "
        f"{format_bytes(free.host_available)}: {advice}; use fewer clients or rounds, or a smaller state"
    )
