"""llama.cpp's built-in chat templates, by name (`--chat-template llama3`), and the detection of a model's
template among them from its Jinja source (what llama.cpp renders with `--no-jinja`).

Each is a small Python function over the messages' roles and text, written from the behaviour of
llama.cpp's `llm_chat_apply_template`: the same prompt for the same messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .template import BEGIN, END, ChatTemplate

__all__ = ["BUILTIN_NAMES", "BuiltinTemplate", "detect_builtin", "make_template"]

Msgs = list[tuple[str, str]]


def _trim(text: str) -> str:
    """Whitespace trimmed at both ends, also just inside the user-text markers."""
    text = text.strip()
    if text.startswith(BEGIN):
        text = BEGIN + text[1:].lstrip()
    if text.endswith(END):
        text = text[:-1].rstrip() + END
    return text


def _simple(
    head: Callable[[str], str], tail: str, gen: str, trim: bool = False, skip_system: bool = False
) -> Callable[[Msgs, bool], str]:
    """Templates of the form head(role) + content + tail per message, then `gen` for the reply."""

    def render(msgs: Msgs, add: bool) -> str:
        out = [
            head(r) + (_trim(c) if trim else c) + tail for r, c in msgs if not (skip_system and r == "system")
        ]
        return "".join(out) + (gen if add else "")

    return render


def _mistral(version: str) -> Callable[[Msgs, bool], str]:
    lead = " " if version == "v1" else ""
    trail = "" if version == "v3-tekken" else " "

    def render(msgs: Msgs, add: bool) -> str:
        out: list[str] = []
        inside = False
        for role, text in msgs:
            if not inside:
                out.append(f"{lead}[INST]{trail}")
                inside = True
            if role == "system":
                out.append(text + "\n\n")
            elif role == "user":
                out.append(f"{text}{lead}[/INST]")
            else:
                out.append(trail + (_trim(text) if version == "v3" else text) + "</s>")
                inside = False
        return "".join(out)

    return render


def _mistral_v7(space: str) -> Callable[[Msgs, bool], str]:
    def render(msgs: Msgs, add: bool) -> str:
        out = []
        for role, text in msgs:
            if role == "system":
                out.append(f"[SYSTEM_PROMPT]{space}{text}[/SYSTEM_PROMPT]")
            elif role == "user":
                out.append(f"[INST]{space}{text}[/INST]")
            else:
                out.append(f"{space}{text}</s>")
        return "".join(out)

    return render


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Callable[[Msgs, bool], str]:
    def render(msgs: Msgs, add: bool) -> str:
        out, inside = ["[INST] "], True
        for role, text in msgs:
            text = _trim(text) if strip else text
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{text}\n<</SYS>>\n\n" if system else text + "\n")
            elif role == "user":
                out.append(text + " [/INST]")
            else:
                out.append(text + "</s>")
                inside = False
        return "".join(out)

    return render


def _gemma(msgs: Msgs, add: bool) -> str:
    out, system = [], ""
    for role, text in msgs:
        if role == "system":  # no system turn: merged into the next user turn
            system += _trim(text)
            continue
        role = "model" if role == "assistant" else role
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(text) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add else "")


def _by_role(parts: dict[str, tuple[str, str]], gen: str, trim: bool = False) -> Callable[[Msgs, bool], str]:
    """A prefix and suffix per role; other roles are left out."""

    def render(msgs: Msgs, add: bool) -> str:
        out = []
        for role, text in msgs:
            if role in parts:
                pre, post = parts[role]
                out.append(pre + (_trim(text) if trim else text) + post)
        return "".join(out) + (gen if add else "")

    return render


def _openchat(msgs: Msgs, add: bool) -> str:
    out = []
    for role, text in msgs:
        if role == "system":
            out.append(text + "<|end_of_turn|>")
        else:
            out.append(f"GPT4 Correct {role[:1].upper() + role[1:]}: {text}<|end_of_turn|>")
    return "".join(out) + ("GPT4 Correct Assistant:" if add else "")


def _orion(msgs: Msgs, add: bool) -> str:
    out, system = [], ""
    for role, text in msgs:
        if role == "system":
            system += text
        elif role == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + text + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(text + "</s>")
    return "".join(out)


def _monarch(msgs: Msgs, add: bool) -> str:
    out = [("" if i == 0 else "<s>") + f"{r}\n{c}</s>\n" for i, (r, c) in enumerate(msgs)]
    return "".join(out) + ("<s>assistant\n" if add else "")


def _rwkv(msgs: Msgs, add: bool) -> str:
    out = []
    for i, (role, text) in enumerate(msgs):
        if role in ("system", "user", "assistant"):
            out.append(f"{role.capitalize()}: {_trim(text)}\n\n")
            if role == "user" and i == len(msgs) - 1:
                out.append("Assistant:")
    return "".join(out)


def _minicpm(msgs: Msgs, add: bool) -> str:
    return "".join(f"<用户>{_trim(c)}<AI>" if r == "user" else _trim(c) for r, c in msgs)


def _bailing(think: bool) -> Callable[[Msgs, bool], str]:
    def render(msgs: Msgs, add: bool) -> str:
        out = [f"<role>{'HUMAN' if r == 'user' else r.upper()}</role>{c}" for r, c in msgs]
        return "".join(out) + (("<role>ASSISTANT</role>" + ("<think>" if think else "")) if add else "")

    return render


_DS = ("<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>")
_RENDERERS: dict[str, Callable[[Msgs, bool], str]] = {
    "chatml": _simple(lambda r: f"<|im_start|>{r}\n", "<|im_end|>\n", "<|im_start|>assistant\n"),
    "llama2": _llama2(False, False, False),
    "llama2-sys": _llama2(True, False, False),
    "llama2-sys-bos": _llama2(True, True, False),
    "llama2-sys-strip": _llama2(True, False, True),
    "mistral-v1": _mistral("v1"),
    "mistral-v3": _mistral("v3"),
    "mistral-v3-tekken": _mistral("v3-tekken"),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _simple(lambda r: f"<|{r}|>\n", "<|end|>\n", "<|assistant|>\n"),
    "phi4": _simple(lambda r: f"<|im_start|>{r}<|im_sep|>", "<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _simple(lambda r: f"<|{r}|>\n", "\n", "<|assistant|>\n"),
    "zephyr": _simple(lambda r: f"<|{r}|>\n", "<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _by_role(
        {"system": ("", "\n\n"), "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "</s>\n")},
        "ASSISTANT:",
    ),
    "vicuna-orca": _by_role(
        {"system": ("SYSTEM: ", "\n"), "user": ("USER: ", "\n"), "assistant": ("ASSISTANT: ", "</s>\n")},
        "ASSISTANT:",
    ),
    "deepseek": _by_role(
        {
            "system": ("", ""),
            "user": ("### Instruction:\n", "\n"),
            "assistant": ("### Response:\n", "\n<|EOT|>\n"),
        },
        "### Response:\n",
    ),
    "deepseek2": _by_role(
        {"system": ("", "\n\n"), "user": ("User: ", "\n\n"), "assistant": ("Assistant: ", _DS[2])},
        "Assistant:",
    ),
    "deepseek3": _by_role(
        {"system": ("", "\n\n"), "user": (_DS[0], ""), "assistant": (_DS[1], _DS[2])}, _DS[1]
    ),
    "command-r": _by_role(
        {
            role: (f"<|START_OF_TURN_TOKEN|><|{tok}_TOKEN|>", "<|END_OF_TURN_TOKEN|>")
            for role, tok in (("system", "SYSTEM"), ("user", "USER"), ("assistant", "CHATBOT"))
        },
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        trim=True,
    ),
    "llama3": _simple(
        lambda r: f"<|start_header_id|>{r}<|end_header_id|>\n\n",
        "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        trim=True,
    ),
    "chatglm4": lambda m, add: (
        "[gMASK]<sop>" + "".join(f"<|{r}|>\n{c}" for r, c in m) + ("<|assistant|>\n" if add else "")
    ),
    "chatglm3": lambda m, add: (
        "[gMASK]sop" + "".join(f"<|{r}|>\n {c}" for r, c in m) + ("<|assistant|>" if add else "")
    ),
    "glmedge": _simple(lambda r: f"<|{r}|>\n", "", "<|assistant|>"),
    "minicpm": _minicpm,
    "exaone3": _by_role(
        {
            "system": ("[|system|]", "[|endofturn|]\n"),
            "user": ("[|user|]", "\n"),
            "assistant": ("[|assistant|]", "[|endofturn|]\n"),
        },
        "[|assistant|]",
        trim=True,
    ),
    "exaone4": _by_role(
        {
            "system": ("[|system|]", "[|endofturn|]\n"),
            "user": ("[|user|]", "\n"),
            "assistant": ("[|assistant|]", "[|endofturn|]\n"),
            "tool": ("[|tool|]", "[|endofturn|]\n"),
        },
        "[|assistant|]",
        trim=True,
    ),
    "rwkv-world": _rwkv,
    "granite": _simple(
        lambda r: (
            f"<|start_of_role|>{r}<|end_of_role|>" + ("<|tool_call|>" if r == "assistant_tool_call" else "")
        ),
        "<|end_of_text|>\n",
        "<|start_of_role|>assistant<|end_of_role|>",
    ),
    "megrez": _simple(
        lambda r: f"<|role_start|>{r}<|role_end|>", "<|turn_end|>", "<|role_start|>assistant<|role_end|>"
    ),
    "bailing": _bailing(False),
    "bailing-think": _bailing(True),
    "llama4": _simple(
        lambda r: f"<|header_start|>{r}<|header_end|>\n\n",
        "<|eot|>",
        "<|header_start|>assistant<|header_end|>\n\n",
        trim=True,
    ),
    "gpt-oss": lambda m, add: (
        "".join(
            f"<|start|>{r}<|message|>{c}" + ("<|return|>" if r == "assistant" else "<|end|>") for r, c in m
        )
        + ("<|start|>assistant" if add else "")
    ),
    "kimi-k2": _by_role(
        {
            "system": ("<|im_system|>system<|im_middle|>", "<|im_end|>"),
            "user": ("<|im_user|>user<|im_middle|>", "<|im_end|>"),
            "assistant": ("<|im_assistant|>assistant<|im_middle|>", "<|im_end|>"),
            "tool": ("<|im_system|>tool<|im_middle|>", "<|im_end|>"),
        },
        "<|im_assistant|>assistant<|im_middle|>",
    ),
    "solar-open": _simple(lambda r: f"<|begin|>{r}<|content|>", "<|end|>", "<|begin|>assistant"),
}
BUILTIN_NAMES = tuple(_RENDERERS)


class BuiltinTemplate(ChatTemplate):
    """A built-in template by name: same interface as a Jinja one (`render`, `render_segments`)."""

    def __init__(self, name: str, bos_token: str = "", eos_token: str = "") -> None:
        if name not in _RENDERERS:
            raise KeyError(name)
        self.source = name
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._fn = _RENDERERS[name]

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        msgs = [(str(m.get("role", "")), _text(m.get("content"))) for m in messages]
        return self._fn(msgs, add_generation_prompt)


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


# (name, markers that must all be in the source), in llama.cpp's order of detection
_DETECT: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("phi4", ("<|im_start|>", "<|im_sep|>")),
    ("chatml", ("<|im_start|>",)),
    ("phi3", ("<|assistant|>", "<|end|>")),
    ("chatglm4", ("[gMASK]<sop>",)),
    ("falcon3", ("<|assistant|>", "<|user|>", "</s>")),
    ("glmedge", ("<|assistant|>", "<|user|>")),
    ("zephyr", ("<|user|>", "<|endoftext|>")),
    ("monarch", ("bos_token + message['role']",)),
    ("gemma", ("<start_of_turn>",)),
    ("orion", ("'\\n\\nAssistant: ' + eos_token",)),
    ("openchat", ("GPT4 Correct ",)),
    ("vicuna-orca", ("USER: ", "ASSISTANT: ", "SYSTEM: ")),
    ("vicuna", ("USER: ", "ASSISTANT: ")),
    ("deepseek", ("### Instruction:", "<|EOT|>")),
    ("command-r", ("<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>")),
    ("llama3", ("<|start_header_id|>", "<|end_header_id|>")),
    ("chatglm3", ("[gMASK]sop",)),
    ("minicpm", ("<用户>",)),
    ("deepseek2", ("'Assistant: ' + message['content'] + eos_token",)),
    ("deepseek3", _DS),
    ("exaone4", ("[|system|]", "[|assistant|]", "[|endofturn|]", "[|tool|]")),
    ("exaone3", ("[|system|]", "[|assistant|]", "[|endofturn|]")),
    ("rwkv-world", ("rwkv-world",)),
    ("granite", ("<|start_of_role|>",)),
    ("megrez", ("<|role_start|>",)),
    ("llama4", ("<|header_start|>", "<|header_end|>")),
    ("gpt-oss", ("<|start|>", "<|channel|>")),
    ("kimi-k2", ("<|im_assistant|>assistant<|im_middle|>",)),
    ("solar-open", ("<|begin|>", "<|end|>", "<|content|>")),
)


def _detect_mistral(src: str) -> str:
    if "[SYSTEM_PROMPT]" in src:
        return "mistral-v7"
    if "' [INST] ' + system_message" in src or "[AVAILABLE_TOOLS]" in src:
        if " [INST]" in src:
            return "mistral-v1"
        return "mistral-v3-tekken" if '"[INST]"' in src else "mistral-v3"
    if "content.strip()" in src:
        return "llama2-sys-strip"
    if "bos_token + '[INST]" in src:
        return "llama2-sys-bos"
    return "llama2-sys" if "<<SYS>>" in src else "llama2"


def detect_builtin(source: str) -> str | None:
    """The built-in template a model's Jinja source corresponds to (llama.cpp's heuristics), or None."""
    if source in _RENDERERS:
        return source
    if "<|im_start|>" not in source and (source.startswith("mistral") or "[INST]" in source):
        return _detect_mistral(source)
    for name, markers in _DETECT:
        if all(m in source for m in markers):
            if name == "chatml" and "<end_of_utterance>" in source:
                return None  # SmolVLM: not chatml, and not built in here
            return name
    return None


def make_template(
    override: str | None, model_source: str | None, jinja: bool, bos_token: str = "", eos_token: str = ""
) -> ChatTemplate:
    """The template a server renders with: `--chat-template NAME` is a built-in by name, other text is Jinja
    (with `--no-jinja`, the built-in its text is detected as); without either, the model's own template,
    else chatml (llama.cpp's fallback)."""
    source = override if override is not None else (model_source or "chatml")
    name = source if source in _RENDERERS else None if jinja else detect_builtin(source) or "chatml"
    if name is not None:
        return BuiltinTemplate(name, bos_token, eos_token)
    return ChatTemplate(source, bos_token, eos_token)
