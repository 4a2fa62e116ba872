"""A schedule's rows: what each slot of each round did (``Schedule``), and the outcome codes.

The synchronous schedule (``fedjax_het.system.schedule``) computes these rows;
training rounds, the online loop, reports and plots read them.
"""

from __future__ import annotations

import jax
from flax import struct

OK, UNAVAILABLE, LATE, DROPPED, EMPTY = 0, 1, 2, 3, 4
OUTCOMES = ("ok", "unavailable", "late", "dropped", "empty")  # names, indexed by code


@struct.dataclass
class Schedule:
    """The timing of ``R`` rounds with ``m`` slots each (one round: no ``R`` axis).

    Attributes:
      selected: int32 ``[R, m]`` client id in each slot (arbitrary where not valid).
      valid: bool ``[R, m]`` the slot holds a selected client.
      outcome: int32 ``[R, m]`` OK, UNAVAILABLE, LATE, DROPPED or EMPTY.
      steps_done: int32 ``[R, m]`` local steps completed (compute spent; aggregate only OK).
      version: int32 ``[R, m]`` global-model version the slot trains from (= round here).
      start: ``[R]`` virtual time the round starts.
      duration: ``[R]`` round duration, server overhead included.
      clock: ``[R]`` virtual time at the end of the round, ``start + duration``.
      finish: ``[R, m]`` seconds after ``start`` when the slot finished or gave up.
      bytes_down: ``[R, m]`` bytes downloaded (a transfer counts once complete).
      bytes_up: ``[R, m]`` bytes uploaded (0 when the client never finished).
    """

    selected: jax.Array
    valid: jax.Array
    outcome: jax.Array
    steps_done: jax.Array
    version: jax.Array
    start: jax.Array
    duration: jax.Array
    clock: jax.Array
    finish: jax.Array
    bytes_down: jax.Array
    bytes_up: jax.Array
