"""llama-engine: run GGUF models like llama.cpp, with continuous batching.

from llama_engine import LLM

with LLM("SmolLM2-135M-Instruct.Q4_1.gguf") as llm:
    print(llm.complete("The capital of France is", max_tokens=16, temperature=0))
"""

from .batch import Batch
from .engine import Engine, EngineConfig, QueuedInfo, QueueFullError, SlotFileResult, SlotInfo
from .handles import EmbeddingHandle, RequestCancelledError, RequestHandle
from .llm import LLM
from .requests import (
    EmbeddingRequest,
    FinalEvent,
    GenerationRequest,
    Pooling,
    ProgressEvent,
    StopReason,
    Timings,
    TokenEvent,
    Usage,
)
from .sampling import SamplingParams
from .slot import SlotState
from .state_file import StateFileError
from .step import Step

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "Batch",
    "EmbeddingHandle",
    "EmbeddingRequest",
    "Engine",
    "EngineConfig",
    "FinalEvent",
    "GenerationRequest",
    "Pooling",
    "ProgressEvent",
    "QueueFullError",
    "QueuedInfo",
    "RequestCancelledError",
    "RequestHandle",
    "SamplingParams",
    "SlotFileResult",
    "SlotInfo",
    "SlotState",
    "StateFileError",
    "Step",
    "StopReason",
    "Timings",
    "TokenEvent",
    "Usage",
    "__version__",
]
