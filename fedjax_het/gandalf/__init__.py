"""The GANDALF seed system (DACE-style mediators, GAN augmentation, rebalancing), built on the
engine: ``pipeline.run_gandalf`` runs it (``run_dir.run_in_dir`` into a run directory), ``mediator`` trains client groups sequentially inside
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
)
from fedjax_het.gandalf.run_dir import run_in_dir

__all__ = [
    "GandalfOptions",
    "GandalfResult",
    "gandalf_data",
    "gandalf_options",
    "run_gandalf",
    "run_in_dir",
    "time_to_accuracy",
]
