"""The training loop around the engine's round: ``simulate.run`` (its keywords grouped in
``options``; the schedule before training in ``plan``; the round's jitted block and
evaluation in ``programs``; the loop over blocks in ``loop``; evaluation lines and the
final ``History`` in ``recorder``; checkpoint saving and resuming in ``resume``), the
in-loop schedule (``online``), the checkpoint file, interrupts, divergence checks,
evaluation metrics, compilation settings and multi-host start-up.

May import: the foundation, ``data``, ``system``, ``engine`` and ``transforms``.
"""
