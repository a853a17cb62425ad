"""Tiny shapes of real model families, shared by the tests that run a benchmark suite on
them: one shape, compiled once for all of them."""

from beyondpar.benchmarks.models import SMOLLM2_135M

# SmolLM2's family and fields, shrunk: 2 layers of 3 heads (8 coalitions a layer) sharing
# one key-value head, on windows of up to 64 tokens.
TINY_SMOLLM2 = {
    **SMOLLM2_135M,
    **dict(vocab_size=64, hidden_size=24, intermediate_size=32, num_hidden_layers=2),
    **dict(num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=64),
}
