"""The GGUF reader under its former path (`beyondpar.pretrained.gguf_file.GgufFile`),
which scripts import; it lives in `beyondpar.pretrained.gguf.reader`."""

from beyondpar.pretrained.gguf.reader import ARCHITECTURES, GgufFile, find  # noqa: F401
