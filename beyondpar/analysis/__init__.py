"""Real models: a text or a corpus through a pretrained checkpoint -> records -> report.

`text.text_record` analyses one text (or `text.attention_record` attention from
elsewhere), `corpus.run` a corpus in windows with bootstrap intervals, `series` a text or
corpus through every checkpoint of a series. Each layer is measured by
`beyondpar.measure`, the measurement every workflow shares.
"""

from beyondpar.analysis.text import (  # noqa: F401
    analyze_attention,
    analyze_tokens,
    attention_record,
    text_record,
)
