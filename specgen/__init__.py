"""specgen: lossless staged speculative decoding for GGUF models on your own machine.

Kept import-free: `python -m specgen.llama.build` runs before any dependency is installed.
"""

__version__ = "0.1.0"
