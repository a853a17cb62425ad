"""Pieces every report shares: layer numbers (from 1, the paper's convention), Markdown
tables with a row per layer, and the figures both workflows draw (pairwise synergy
heatmaps, pruning curves). Imports only base helpers, so both workflows may use it."""

from beyondpar.reports import figures, numbering, tables  # noqa: F401
