"""Algorithm-to-algorithm wrappers: update compression (``compression``, with the compressor
contract in ``compressor`` and the encoders in ``encoders``) and differential privacy
(``privacy``). Each takes a ``FederatedAlgorithm`` and returns one.

May import: the foundation and ``engine`` (the algorithm contract).
"""
