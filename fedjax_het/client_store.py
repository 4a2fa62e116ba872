"""Where the clients' persistent states live between rounds (DESIGN.md §5, "client_init").

An algorithm with memory (SCAFFOLD's control variates, Ditto's personal
models, FedPer's heads) keeps one state per client, ``[num_clients, ...]``
at rest. A round only reads and writes the rows of its cohort: ``gather``
them before local training and ``scatter`` the new rows back, for the
clients whose update counted (a failed or late client keeps its state).

``DeviceStore`` keeps every row in the run state on the device, part of the
jitted program like any array. Stores are static (hashable) under ``jit``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from fedjax_het.typing import ClientState


@dataclasses.dataclass(frozen=True)
class DeviceStore:
    """Every client's state as a device array ``[num_clients, ...]`` inside the run state."""

    placement: str = "device"

    def init(self, one: ClientState, num_clients: int) -> ClientState:
        """The stored states of ``num_clients`` clients, each starting as ``one``."""
        return jax.tree.map(lambda s: jnp.broadcast_to(s, (num_clients, *s.shape)), one)

    def gather(self, held: ClientState, ids: jax.Array) -> ClientState:
        """The states of clients ``ids [m]``, stacked ``[m, ...]``."""
        return jax.tree.map(lambda s: s[ids], held)

    def scatter(
        self, held: ClientState, ids: jax.Array, new: ClientState, keep: jax.Array
    ) -> ClientState:
        """``held`` with the rows of clients ``ids`` replaced by ``new`` where ``keep [m]``.

        Ids of kept rows must be distinct (a cohort's are).
        """

        def put(all_rows, rows):
            kept = keep.reshape(-1, *[1] * (rows.ndim - 1))
            return all_rows.at[ids].set(jnp.where(kept, rows, all_rows[ids]))

        return jax.tree.map(put, held, new)


ON_DEVICE = DeviceStore()
