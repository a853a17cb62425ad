"""A user's fresh process in JAX's float32 mode handing float64 matrices to two metrics:
prints whether x64 was on once beyondpar was imported (a library must not switch it on),
how many warnings they gave and the first one's message.

    python tests/helpers/float64_warning.py
"""

import warnings

import jax
import numpy as np

from beyondpar import metrics


def main() -> None:
    print(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", False)  # float32 mode, whatever JAX_ENABLE_X64 says
    c = np.full((2, 2), 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics.minimax_fidelity(c)
        metrics.hitting_time(c)
    print(len(caught), str(caught[0].message))


if __name__ == "__main__":
    main()
