"""beyondpar: multi-head attention as computational graphs over tokens.

Reproduces and extends "Beyond Parallelism: Synergistic Computational Graph Effects in
Multi-Head Attention" (arXiv 2507.02944).
"""

__version__ = "0.1.0"
