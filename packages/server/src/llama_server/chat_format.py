"""Which output format a chat template's model writes, found from the template's source as llama.cpp
finds it (`common_chat_try_specialized_template`), and the parser for each.

- gpt-oss: the template writes Harmony's `<|channel|>` (`harmony_parser`).
- Gemma 4: it writes `'<|tool_call>call:'` (`gemma4_parser`).
- Qwen3-Coder XML calls: `<tool_call>`, `<function=` and `<parameter=` with newlines between the tags
  (Qwen3-Coder, Qwen3.5/3.6, Nemotron Nano 3, StepFun 3.5; `xml_call_parser`).
- Any other template: `chat_parser.ChatParser` (`<think>` blocks, Hermes, Mistral and Llama 3 calls).
"""

from __future__ import annotations

import enum
from typing import Any

from .chat_parser import ChatParser, OutputParser
from .gemma4_parser import Gemma4Parser
from .harmony_parser import HarmonyParser
from .xml_call_parser import XmlCallParser

__all__ = ["ChatFormat", "detect_format", "make_parser"]


class ChatFormat(enum.StrEnum):
    GENERIC = "generic"
    GPT_OSS = "gpt-oss"
    GEMMA4 = "gemma4"
    QWEN3_CODER = "qwen3-coder"


def detect_format(source: str) -> ChatFormat:
    """The format of a template's model (llama.cpp's order: its LLM-jp Harmony dialect is not gpt-oss)."""
    if "<|channel|>" in source and "chat_format=llm-jp-harmony-v1" not in source:
        return ChatFormat.GPT_OSS
    if "'<|tool_call>call:'" in source:
        return ChatFormat.GEMMA4
    if (
        "<tool_call>" in source
        and "<function=" in source
        and "<parameter=" in source
        # templates that write the tags without newlines between them are another format
        and "'<tool_call><function=' ~ tool_call.name ~ '>'" not in source
    ):
        return ChatFormat.QWEN3_CODER
    return ChatFormat.GENERIC


def make_parser(
    fmt: ChatFormat | str,
    reasoning: bool,
    tools: list[Any] | None,
    forced_open: bool = False,
    thinking: bool = True,
    **options: Any,
) -> OutputParser:
    """The parser of one reply. `tools`: the request's tool definitions, None when calls are not parsed;
    `thinking`: the template writes thinking tags; `options`: ChatParser's (generic format only)."""
    if fmt == ChatFormat.GPT_OSS:
        return HarmonyParser(reasoning, tools is not None)
    if fmt == ChatFormat.GEMMA4:
        return Gemma4Parser(reasoning, tools is not None)
    if fmt == ChatFormat.QWEN3_CODER:
        return XmlCallParser(reasoning, tools, forced_open, thinking)
    return ChatParser(reasoning, tools is not None, forced_open, **options)
