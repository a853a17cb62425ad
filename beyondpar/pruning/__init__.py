"""Do the metrics find the heads that matter? Prune heads in the order a score gives and
measure what the masked model still does (a true ablation, not a proxy).

Two halves on either side of the model: `ranking` orders heads from scores and attention
arrays alone (a kernel, it runs no model); `head_masking` runs a model under head masks
(losses, accuracies, mask gradients, whether a task needs attention). The study's and the
analysis's pruning curves put them together.
"""

from beyondpar.pruning.head_masking import (  # noqa: F401
    attention_necessity,
    gradient_importance,
    masked_logits,
    masked_scores,
    sequence_losses,
)
from beyondpar.pruning.ranking import (  # noqa: F401
    ORDERS,
    area,
    fidelity_order,
    greedy_sequences,
    masks_along,
    merge_sequences,
    order_from_scores,
    orders,
)
