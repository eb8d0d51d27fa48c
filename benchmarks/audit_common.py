"""What the bad-input audit's case modules share: ERROR, the `want` of a case whose right
answer is a clear error, and the seeded generator of their random inputs."""
import numpy as np

ERROR = "error"


def rng():
    return np.random.default_rng(0)
