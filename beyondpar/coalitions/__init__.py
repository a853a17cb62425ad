"""Cooperative-game analysis of the heads of a layer: the value of every coalition of
heads (the objective of its mix), Shapley values, Harsanyi dividends and pairwise
interactions, exact up to 16 heads and sampled beyond.

Modules: `game` (the transforms of a table of values), `mix_game` (value functions and the
table of every coalition), `sampling` (permutation sampling of Shapley values)."""

from beyondpar.coalitions.game import (  # noqa: F401
    coalition_masks,
    coalition_sizes,
    harsanyi,
    interaction,
    shapley,
    zeta,
)
from beyondpar.coalitions.mix_game import (  # noqa: F401
    MAX_EXACT_HEADS,
    OBJECTIVES,
    MixGame,
    ValueFn,
    all_values,
    empty_value,
    mix_value_fn,
    values,
)
from beyondpar.coalitions.sampling import (  # noqa: F401
    orders,
    sampled_shapley,
    shapley_values,
)
