"""Several hosts as one run, through JAX's own distributed runtime (docs/design.md §3).

Every process runs the same program on the same config: it builds the same
data (everything is seeded), and after ``jax.distributed.initialize`` the
mesh of ``cohort.client_mesh`` spans every process's devices, so each round's
cohort is sharded over all of them and the aggregate is one cross-host
``psum``. Only process 0 writes the run directory.

From a config, the ``[distributed]`` table::

    [distributed]
    enabled = true                      # call jax.distributed.initialize
    coordinator_address = "node0:1234"  # optional: process 0's address and a free port
    num_processes = 2                   # optional
    process_id = 0                      # optional: differs per process (--set it)

Keys left out are found by JAX (``JAX_COORDINATOR_ADDRESS``, SLURM, Open MPI).
From Python, call ``jax.distributed.initialize(...)`` before anything else.
"""

from __future__ import annotations

import dataclasses

import jax


@dataclasses.dataclass(frozen=True)
class Cluster:
    """How this process joins a multi-process run (``enabled = False``: it runs alone).

    Attributes:
      enabled: join a multi-process run (``jax.distributed.initialize``); false: run alone.
      coordinator_address: ``host:port`` of process 0 (unset: found from the cluster's
        environment, e.g. SLURM).
      num_processes: processes in the run, >= 1 (unset: from the environment).
      process_id: this process's index, 0 to num_processes - 1 (unset: from the environment).
    """

    enabled: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    def __post_init__(self):
        if self.num_processes is not None and self.num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {self.num_processes}")
        if self.process_id is not None and (
            self.process_id < 0
            or self.num_processes is not None and self.process_id >= self.num_processes
        ):
            raise ValueError(
                f"process_id must be between 0 and num_processes - 1, got {self.process_id}"
            )
        if not self.enabled and (self.coordinator_address or self.num_processes or self.process_id):
            raise ValueError("set enabled = true to join a multi-process run")


def initialize(cluster: Cluster) -> None:
    """Joins the run described by ``cluster`` (no-op when disabled or already joined)."""
    if cluster.enabled and not jax.distributed.is_initialized():
        jax.distributed.initialize(
            cluster.coordinator_address, cluster.num_processes, cluster.process_id
        )


def writes_results() -> bool:
    """Whether this process writes results: process 0 of a multi-process run, or the only one."""
    return jax.process_index() == 0
