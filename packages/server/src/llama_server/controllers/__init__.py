"""One Controller per resource group."""

from .anthropic import AnthropicController
from .chat import ChatController
from .completion import CompletionController
from .control import ControlController
from .conversations import ConversationsController
from .embeddings import EmbeddingsController
from .feature_off import FeatureOffController
from .health import HealthController
from .lora import LoraController
from .metrics import MetricsController
from .models import ModelsController
from .props import PropsController
from .rerank import RerankController
from .responses import ResponsesController
from .slots import SlotsController
from .streams import StreamsController
from .tokenize import TokenizeController

CONTROLLERS = [
    HealthController,
    CompletionController,
    ChatController,
    ControlController,
    AnthropicController,
    ResponsesController,
    ConversationsController,
    EmbeddingsController,
    RerankController,
    LoraController,
    TokenizeController,
    PropsController,
    ModelsController,
    SlotsController,
    MetricsController,
    StreamsController,
    FeatureOffController,
]

__all__ = ["CONTROLLERS"]
