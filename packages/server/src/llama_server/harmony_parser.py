"""gpt-oss's Harmony output: messages on channels, split into reasoning, content and tool calls.

The generation prompt ends in `<|start|>assistant`, so the reply begins with the first message's header.
Each message is a header, `<|message|>`, a body and an end token; the next one starts with
`<|start|>assistant` again (llama.cpp's `common_chat_params_init_gpt_oss`):

    <|channel|>analysis<|message|>...<|end|>                  reasoning
    <|channel|>commentary<|message|>...<|end|>                content (a preamble)
    <|channel|>final<|message|>...                            content
    <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}    a tool call
     to=functions.NAME<|channel|>commentary json<|message|>{...}                 the same, recipient first

A message to another recipient (`to=python`, `to=container.exec`: the built-in tools) is dropped. The
stray `<|channel|>commentary to=assistant` gpt-oss-20b sometimes writes before a header is skipped.
"""

from __future__ import annotations

import json
import re

from .chat_parser import Parsed, ToolCall, held_prefix, keep_ids

__all__ = ["HarmonyParser"]

START = "<|start|>assistant"
MESSAGE = "<|message|>"
CHANNEL = "<|channel|>"
# a message ends in <|end|>; <|call|> and <|return|> are end-of-generation tokens that may be kept in text
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADERS = (CHANNEL, " to=", "<|constrain|>")  # how a message's header may begin
_STRAY = re.compile(r"<\|channel\|>commentary(?: to=assistant)?(?=<\|channel\|>)")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>(\w+)")


def _end_of(body: str) -> tuple[int, int]:
    """Where the message body ends and the length of its end token; (-1, 0) when it has not ended."""
    best, size = -1, 0
    for tag in ENDS:
        i = body.find(tag)
        if i >= 0 and (best < 0 or i < best):
            best, size = i, len(tag)
    return best, size


def _complete_json(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class HarmonyParser:
    """Parse one gpt-oss reply. `reasoning`: analysis messages go to reasoning (else they stay in the
    content with their tags, as llama.cpp's `reasoning_format: none`); `tools`: function calls are
    extracted (without tools in the request they are dropped like any other recipient's message)."""

    def __init__(self, reasoning: bool, tools: bool) -> None:
        self.reasoning = reasoning
        self.tools = tools
        self._ids: list[str] = []

    def parse(self, text: str, final: bool) -> Parsed:
        out = Parsed()
        pos = 0
        while pos < len(text):
            rest = text[pos:]
            if rest.startswith(START):
                pos += len(START)
                continue
            if not final and START.startswith(rest):
                break  # the next message's start, cut off
            if not rest.startswith(_HEADERS):
                if final or not any(h.startswith(rest) for h in _HEADERS):
                    out.content += rest  # not Harmony at all: kept as text
                break
            pos = self._message(text, pos, final, out)
            if pos < 0:
                break
        keep_ids(self._ids, out.tool_calls)
        return out

    def _message(self, text: str, pos: int, final: bool, out: Parsed) -> int:
        """Parse the message at `pos` into `out`; the position after it, or -1 when the text ends in it."""
        head_end = text.find(MESSAGE, pos)
        if head_end < 0:
            return -1  # the header is still being written
        header = text[pos:head_end]
        stray = _STRAY.match(header)
        plain = header[stray.end() :] if stray else header
        body_start = head_end + len(MESSAGE)
        end, end_size = _end_of(text[body_start:])
        closed = end >= 0
        body = text[body_start : body_start + end] if closed else text[body_start:]
        if not closed and not final:
            body = body[: len(body) - held_prefix(body, ENDS)]
        recipient = _RECIPIENT.search(plain)
        channel_m = _CHANNEL.search(plain)
        channel = channel_m.group(1) if channel_m else ""
        if recipient is not None and recipient.group(1) != "assistant":
            name = recipient.group(1)
            if self.tools and name.startswith("functions."):
                args = body.strip()
                if closed or final or _complete_json(args):
                    out.tool_calls.append(ToolCall(name[len("functions.") :], args or "{}"))
        elif channel == "analysis":
            if self.reasoning:
                out.reasoning += body
            else:
                # llama.cpp keeps the whole message, tags and all, in the content
                out.content += (
                    text[pos:body_start]
                    + body
                    + (text[body_start + end : body_start + end + end_size] if closed else "")
                )
        else:  # final, commentary without a recipient (a preamble), or an unnamed channel
            out.content += body
        return body_start + end + end_size if closed else -1
