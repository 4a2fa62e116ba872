"""The GANDALF seed system (DACE-style mediators, GAN augmentation, rebalancing), built on the
engine: ``pipeline.run_gandalf`` runs it, ``mediator`` trains client groups sequentially inside
and vectorised across, ``gan`` and ``rebalance`` prepare the data.

May import: the foundation, ``data``, ``system``, ``engine``, ``transforms`` and ``training``.
"""

from fedjax_het.gandalf.pipeline import (
    GandalfOptions,
    GandalfResult,
    gandalf_data,
    gandalf_options,
    run_gandalf,
    time_to_accuracy,
    write_run,
)

__all__ = [
    "GandalfOptions",
    "GandalfResult",
    "gandalf_data",
    "gandalf_options",
    "run_gandalf",
    "time_to_accuracy",
    "write_run",
]
