"""The training loop around the engine's round: ``simulate.run`` (plan, build the programs,
loop over blocks, record), the in-loop schedule (``online``), checkpoints, interrupts,
divergence checks, evaluation metrics, compilation settings and multi-host start-up.

May import: the foundation, ``data``, ``system``, ``engine`` and ``transforms``.
"""
