"""beyondpar: multi-head attention as computational graphs over tokens.

Reproduces and extends "Beyond Parallelism: Synergistic Computational Graph Effects in
Multi-Head Attention" (arXiv 2507.02944).

Layers, each importing only from those before it: `base` (checks, files, devices, locks,
settings, timing); the kernels on attention arrays (`graphs`, `metrics`, `synergy`,
`weighting`, `pruning.ranking`); the models (`model`, `batches`, `tasks`, `checkpoints`,
`released`, `pretrained`, `pruning`: a model under head masks); the two workflows, which
never import each other (`study`: the paper's study; `analysis`: real models); and
`benchmarks`.
"""

__version__ = "0.1.0"
