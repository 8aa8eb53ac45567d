"""Chat templates against a real `llama-server`: a hostile `--chat-template-file` is refused per request
without growing the server, and a continued assistant message renders as llama-server renders it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import LLAMA_CPP_SRC, Server, assert_error, start_server, stop_server

# the template is ordinary chatml unless a message asks for one of the allocations it holds
HOSTILE = """\
{%- for m in messages -%}
{%- if 'bomb-concat' in m.content -%}
{%- set ns = namespace(s='x' * 1000) -%}{%- for i in range(40) -%}{%- set ns.s = ns.s ~ ns.s -%}{%- endfor -%}
{%- elif 'bomb-join' in m.content -%}{{ ([('x' * 100)] * 4000000)|join }}
{%- elif 'bomb-replace' in m.content -%}{%- set s = 'x' * 1000000 -%}{{ s.replace('', s) }}
{%- elif 'bomb-keep' in m.content -%}{%- set s = 'x' * 1000000 -%}{%- set l = [] -%}
{%- for i in range(60000) -%}{%- set _ = l.append(s ~ i) -%}{%- endfor -%}
{%- else -%}{{ '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""
BOMBS = ["bomb-concat", "bomb-join", "bomb-replace", "bomb-keep"]
# what one refused render may add to the server's peak resident memory: the values the template holds
# (64 MiB at most before they are checked), one value being sized, the allocator's slack. Renders run on
# the worker threads, and glibc keeps an arena per thread: freed memory one thread keeps is not reused by
# another, so the peak over many renders on many threads can reach this once per thread.
MAX_GROWTH_KB = 96 * 1024


def _kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("hostile-template")
    path = tmp / "hostile.jinja"
    path.write_text(HOSTILE)
    s = start_server(
        tmp, "--jinja", "--chat-template-file", str(path), "-c", "512", "-np", "1", "--temp", "0"
    )
    yield s
    stop_server(s)


def test_hostile_template_is_refused_and_the_server_stays_small(hostile: Server):
    pid = hostile.proc.pid
    with hostile.client() as c:
        hello = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        assert c.post("/v1/chat/completions", json=hello).status_code == 200  # the routes are warm
        for bomb in BOMBS:
            for route in ("/apply-template", "/v1/chat/completions"):
                Path(f"/proc/{pid}/clear_refs").write_text("5")  # restart the peak (VmHWM) from here
                before = _kb(pid, "VmRSS")
                r = c.post(route, json={"messages": [{"role": "user", "content": bomb}], "max_tokens": 2})
                growth = _kb(pid, "VmHWM") - before
                print(f"{bomb} {route}: peak resident growth {growth} kB")
                err = assert_error(r, 400)
                assert "chat template" in err["message"] or "output is too large" in err["message"], err
                assert growth < MAX_GROWTH_KB, (bomb, route, growth)
                assert c.get("/health").status_code == 200
        after = c.post("/apply-template", json={"messages": [{"role": "user", "content": "hello"}]})
        assert after.json()["prompt"] == "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
        chat = c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
        )
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 2


@pytest.fixture(scope="module")
def llama31(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """llama.cpp's test_chat_template_assistant_prefill setup: Llama 3.1's template, `__verbose` on."""
    template = LLAMA_CPP_SRC / "models" / "templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja"
    if not template.exists():
        pytest.skip("llama.cpp's templates not found (set LLAMA_CPP_SRC)")
    s = start_server(
        tmp_path_factory.mktemp("llama31"),
        *("--jinja", "--chat-template-file", str(template), "-v", "-c", "512", "-np", "1", "--temp", "0"),
    )
    with s.client() as c:
        yield c
    stop_server(s)


@pytest.mark.parametrize(
    "prefill,re_prefill",
    [("Whill", "Whill"), ([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}], "Wh\n\nill")],
)
def test_assistant_prefill_renders_as_llamacpp(llama31: httpx.Client, prefill, re_prefill):
    messages = [
        {"role": "system", "content": "Book"},
        {"role": "user", "content": "What is the best book"},
        {"role": "assistant", "content": prefill},
    ]
    tail = (
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is the best book<|eot_id|>"
        f"<|start_header_id|>assistant<|end_header_id|>\n\n{re_prefill}"
    )
    res = llama31.post("/chat/completions", json={"max_tokens": 8, "messages": messages})
    assert res.status_code == 200
    assert res.json()["__verbose"]["prompt"].endswith(tail)
    assert llama31.post("/apply-template", json={"messages": messages}).json()["prompt"].endswith(tail)
