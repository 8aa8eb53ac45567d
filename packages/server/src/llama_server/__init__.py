"""llama-server: an HTTP API for GGUF models, compatible with llama.cpp's server, OpenAI and Anthropic.

from llama_server import ServerConfig, create_app
import uvicorn

app = create_app(ServerConfig(model="SmolLM2-135M-Instruct.Q4_1.gguf", n_parallel=4, n_ctx=4096))
uvicorn.run(app, host="127.0.0.1", port=8080, http="h11")  # h11 keeps header names in canonical case
"""

from .app import create_app
from .config import ServerConfig, bundled_model_path
from .errors import ApiError
from .state import ServerState

__version__ = "0.1.0"

__all__ = ["ApiError", "ServerConfig", "ServerState", "__version__", "bundled_model_path", "create_app"]
