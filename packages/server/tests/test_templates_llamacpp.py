"""llama.cpp's own chat templates (its `models/templates/*.jinja`, from $LLAMA_CPP_SRC) load and render,
the built-in templates by name render as llama.cpp's, and thinking renders as llama.cpp's."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from conftest import LLAMA_CPP_SRC

from llama_server.builtin_templates import BUILTIN_NAMES, BuiltinTemplate, detect_builtin, make_template
from llama_server.chat_prompt import _thinking_tail
from llama_server.template import ChatTemplate, TemplateError

TEMPLATES = LLAMA_CPP_SRC / "models" / "templates"
FILES = sorted(TEMPLATES.glob("*.jinja"))
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
BASIC = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"}]
MULTI = [
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "How are you?"},
]
CALL = {
    "id": "abcdefghi",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
TOOL_TURN = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "sunny"},
]


def load(name: str) -> ChatTemplate:
    return make_template((TEMPLATES / f"{name}.jinja").read_text(), None, True, "<s>", "</s>")


def render(t: ChatTemplate, messages, tools=None, **kwargs) -> str:
    from llama_server.template_caps import adapt_messages

    return t.render(adapt_messages(messages, t.caps), True, tools, {"enable_thinking": True, **kwargs})


def test_the_template_files_are_there():
    assert len(FILES) > 50, f"llama.cpp's templates not found in {TEMPLATES} (set LLAMA_CPP_SRC)"


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_llamacpp_template_loads_and_renders(path: Path):
    t = make_template(path.read_text(), None, True, "<s>", "</s>")
    for messages, tools in ((BASIC, None), (MULTI, None), (MULTI, TOOLS), (TOOL_TURN, TOOLS)):
        try:
            out = render(t, messages, tools)
        except TemplateError as e:
            # the template's own checks (raise_exception) on a conversation it does not accept are fine;
            # the engine's own errors are not
            assert "error rendering" not in str(e) and "unsafe" not in str(e), (path.stem, str(e))
            continue
        assert "Hello" in out or "Paris" in out


@pytest.mark.parametrize(
    "name,on,end",
    [
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", True, "<think>\n"),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", False, "<think>\n</think>"),
        ("Qwen-Qwen3-0.6B", True, "<|im_start|>assistant\n"),
        ("Qwen-Qwen3-0.6B", False, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ("Qwen-QwQ-32B", True, "<|im_start|>assistant\n<think>\n"),
        ("Qwen-QwQ-32B", False, "<|im_start|>assistant\n<think>\n</think>"),
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", True, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
            False,
            "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|><|START_THINKING|><|END_THINKING|>",
        ),
    ],
)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_thinking_on_and_off(name, on, end, tools):
    t = load(name)
    segments = t.render_segments(
        [{"role": "user", "content": "What is today?"}], True, tools, {"enable_thinking": on}
    )
    segments, opened = _thinking_tail(segments, t.caps, on)
    text = "".join(s for s, _ in segments)
    assert text.endswith(end), text[-80:]
    assert opened == (on and end.endswith("<think>\n"))


@pytest.mark.parametrize(
    "name,fmt",
    [("meta-llama-Llama-3.3-70B-Instruct", "%d %b %Y"), ("fireworks-ai-llama-3-firefunction-v2", "%b %d %Y")],
)
def test_today_in_the_prompt(name, fmt):
    out = render(load(name), [{"role": "user", "content": "What is today?"}])
    assert datetime.date.today().strftime(fmt) in out


def test_loop_controls_and_system_merging():
    t = load("CohereForAI-c4ai-command-r7b-12-2024-tool_use")  # {% break %}
    assert "Hello" in render(t, BASIC, TOOLS)
    gemma2 = load("google-gemma-2-2b-it")  # raises on a system turn: merged into the first user turn
    assert not gemma2.caps.supports_system_role
    assert "<start_of_turn>user\nYou are helpful.\nHello<end_of_turn>" in render(gemma2, BASIC)


def test_object_arguments_for_templates_that_print_them():
    t = load("Qwen-Qwen2.5-7B-Instruct")
    assert t.caps.object_arguments
    out = render(t, TOOL_TURN, TOOLS)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in out


def test_template_lists_stay_local():
    t = ChatTemplate("{% set ns = [] %}{% set _ = ns.append(1) %}{{ ns|length }}{{ messages.append(1) }}")
    with pytest.raises(TemplateError):
        t.render(MULTI)
    assert ChatTemplate("{% set q = [] %}{% set _ = q.append(2) %}{{ q.pop(0) }}").render(MULTI) == "2"


# what llama.cpp's llm_chat_apply_template writes for [system "Sys", user "Hi"] plus the generation prompt
EXPECTED = {
    "chatml": "<|im_start|>system\nSys<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nSys<|eot_id|><|start_header_id|>user<|end_header_id|>"
    "\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>Sys<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
    "<|USER_TOKEN|>Hi<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "gemma": "<start_of_turn>user\nSys\n\nHi<end_of_turn>\n<start_of_turn>model\n",
    "llama2-sys": "[INST] <<SYS>>\nSys\n<</SYS>>\n\nHi [/INST]",
    "mistral-v7": "[SYSTEM_PROMPT] Sys[/SYSTEM_PROMPT][INST] Hi[/INST]",
    "phi3": "<|system|>\nSys<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n",
    "deepseek3": "Sys\n\n<｜User｜>Hi<｜Assistant｜>",
    "vicuna": "Sys\n\nUSER: Hi\nASSISTANT:",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_templates_by_name(name):
    messages = [{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi"}]
    assert BuiltinTemplate(name).render(messages) == EXPECTED[name]
    if name in ("llama3", "command-r", "gemma"):  # these trim each message, as llama.cpp's
        spaced = [{"role": "system", "content": " Sys\n"}, {"role": "user", "content": "  Hi "}]
        assert BuiltinTemplate(name).render(spaced) == EXPECTED[name]


def test_every_builtin_name_renders_and_user_text_stays_user_text():
    for name in BUILTIN_NAMES:
        segs = BuiltinTemplate(name).render_segments(MULTI)
        assert ("How are you?", True) in segs, name


@pytest.mark.parametrize(
    "path,name",
    [
        ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
        ("Qwen-Qwen2.5-7B-Instruct", "chatml"),
        ("google-gemma-2-2b-it", "gemma"),
        ("microsoft-Phi-3.5-mini-instruct", "phi3"),
        ("CohereForAI-c4ai-command-r-plus-tool_use", "command-r"),
    ],
)
def test_no_jinja_detects_the_builtin(path, name):
    assert detect_builtin((TEMPLATES / f"{path}.jinja").read_text()) == name
    assert make_template(None, (TEMPLATES / f"{path}.jinja").read_text(), False).source == name
