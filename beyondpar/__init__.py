"""beyondpar: multi-head attention as computational graphs over tokens.

Reproduces and extends "Beyond Parallelism: Synergistic Computational Graph Effects in
Multi-Head Attention" (arXiv 2507.02944).
"""

__version__ = "0.1.0"

import logging as _logging

# JAX logs at INFO that it found no TPU on every CPU machine; not news to our users.
_logging.getLogger("jax._src.xla_bridge").setLevel(_logging.WARNING)
