"""One formatter per generation API: engine events in, that API's response Structs out.

Each module holds the response schemas of one API (every body and stream event as a msgspec Struct, keys
in the reference's order) and its `Formatter`; `streaming.respond` drives them all.
"""

from .anthropic import AnthropicFormatter
from .chat import ChatFormatter, Parsing
from .completions import CompletionsFormatter
from .native import NativeFormatter
from .responses import ResponsesFormatter

__all__ = [
    "AnthropicFormatter",
    "ChatFormatter",
    "CompletionsFormatter",
    "NativeFormatter",
    "Parsing",
    "ResponsesFormatter",
]
