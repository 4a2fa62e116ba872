"""Algorithm-to-algorithm wrappers: update compression (``compression``) and differential
privacy (``privacy``). Each takes a ``FederatedAlgorithm`` and returns one.

May import: the foundation and ``engine`` (the algorithm contract).
"""
