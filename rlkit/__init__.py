"""rlkit: a reinforcement-learning training kit.

The engine is :mod:`rlkit.core` (tensors in column-major ``[features, batch]`` layout, a tape,
every op with its backward, on a native CPU backend); :mod:`rlkit.buffers`, :mod:`rlkit.agents`
and :mod:`rlkit.train` build on it.
"""

__version__ = "0.1.0"
