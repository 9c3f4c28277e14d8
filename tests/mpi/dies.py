"""Run by tests/test_parallel.py under mpiexec: rank 1 dies (argv[1]: "raise" an exception, or
"exit" the process without a word) while rank 0 waits for it in an all-reduce."""

import os
import sys

import numpy as np

from rlkit.core import parallel

comm = parallel.world()
if comm.rank == 1:
    if sys.argv[1] == "raise":
        raise RuntimeError("replica 1 lost its data")
    os._exit(3)
comm.all_reduce(np.ones(3))
print("rank 0 got past the all-reduce")
