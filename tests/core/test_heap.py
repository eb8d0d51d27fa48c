"""core/heap.py: after keep_freed_memory, a freed block's pages are reused (no fresh page
faults when the same arrays are allocated again), as a training step's arrays are."""
import resource
import sys

import numpy as np
import pytest

from scratchllm.core.heap import keep_freed_memory


def _faults_of_reallocating(n_rounds):
    """Minor page faults of allocating, touching and freeing 8 arrays of 1 MiB n_rounds times
    (after one warm-up round)."""
    def one_round():
        arrays = [np.ones(1 << 18, np.float32) for _ in range(8)]  # 8 x 1 MiB, touched
        del arrays
    one_round()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(n_rounds):
        one_round()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_pages_are_reused_after_keep_freed_memory():
    if not keep_freed_memory():
        pytest.skip("malloc is not glibc's (musl): nothing to tune")
    assert keep_freed_memory() is True  # once per process, the same answer again
    # without the tuning each round maps 8 MiB afresh: 8 x 256 = 2,048 faults a round
    assert _faults_of_reallocating(20) < 200
