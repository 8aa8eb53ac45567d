"""llama-router: many GGUF models behind one address, one `llama-server` child process per loaded model.

Engine-free: it installs without numba and speaks to its children over HTTP and their stdout state lines.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
