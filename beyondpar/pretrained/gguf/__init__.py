"""GGUF files (llama.cpp, Ollama, LM Studio): the header (`header`), the dequantising
kernels (`quants`), the tokenizer rebuilt from the stored vocabulary (`tokenizer`), and
the file read into the Hugging Face layout (`reader`)."""

from beyondpar.pretrained.gguf.reader import ARCHITECTURES, GgufFile, find  # noqa: F401
