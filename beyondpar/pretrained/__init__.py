"""Pretrained checkpoints in JAX: GPT-2, GPT-NeoX/Pythia, Llama, Mistral, Qwen2, Qwen3,
Gemma 2, Gemma 3 (text) and Phi-3.

`load` reads a Hugging Face folder (config.json, safetensors weights, tokenizer.json) or
a GGUF file (llama.cpp, Ollama; architectures llama, qwen2, qwen3, gpt2, gemma2, gemma3,
phi3), without torch or transformers, onto one device or a `data` x `model` mesh
(`sharding` says which parameters split); `apply_with_attention` returns logits and
every layer's attention like `beyondpar.model.apply_with_attention`, with the same head
mask; `layer_by_layer` yields one layer's attention at a time, for texts too long to
keep every layer's T x T maps.
"""

from beyondpar.pretrained import (  # noqa: F401
    gemma,
    gguf_file,
    gpt2,
    gpt_neox,
    hf_folder,
    llama,
    phi3,
    rotary,
    sharding,
)
from beyondpar.pretrained.loading import (  # noqa: F401
    FAMILIES,
    build,
    family,
    fingerprint,
    layer_name,
    load,
    load_gguf,
    parameter_shapes,
)
from beyondpar.pretrained.running import (  # noqa: F401
    apply_with_attention,
    check_head_mask,
    check_tokens,
    gather_heads,
    head_importances,
    layer_by_layer,
    place_tokens,
)
