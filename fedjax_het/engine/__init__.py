"""The engine: one federated round as one jitted, vectorised JAX program.

Holds the algorithm contract (``algorithm``), the local step (``local``), the client-state
stores (``client_store``), the cohort's chunked ``vmap`` (``cohort``) and its reduction tree
(``reduction``), the round itself (``round``) and the memory plan (``memory``). Pure JAX: no
files, no config.

May import: the foundation (``typing``, ``rng``, ``registry``, ``models``, ``results``),
``data`` and ``system`` (the round reads a schedule row computed there).
"""
