"""Chat templates are untrusted: sandbox escapes, output bombs and time bombs are refused."""

from __future__ import annotations

import time

import pytest

from llama_server.template import BUILTIN_TEMPLATES, ChatTemplate, TemplateError

MSGS = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ messages.append(1) }}",  # immutable sandbox: no mutation of inputs
        "{{ 'a' * 1000000000 }}",
        "{{ [1] * 1000000000 }}",
        "{{ 10 ** 100000 }}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{{ '%0999999999d'|format(1) }}",
        "{{ '{:>999999999}'.format(1) }}",
        "{{ 'x'|center(999999999)|length }}",
        "{{ 'x'.ljust(999999999) }}",
        "{{ '%999999999d' % 1 }}",
        "{{ '%*d' % (999999999, 1) }}",
        "{% set f = '{:>999999999}'.format %}{{ f(1) }}",
        "{{ '{:>{}}'.format(1, 999999999) }}",
        "{{ 'x'|indent(999999999, true) }}",
        "{{ raise_exception('nope') }}",
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    ],
)
def test_hostile_templates(source):
    t0 = time.monotonic()
    with pytest.raises(TemplateError):
        ChatTemplate(source).render(MSGS)
    assert time.monotonic() - t0 < 5


def test_syntax_error():
    with pytest.raises(TemplateError):
        ChatTemplate("{% for %}")


def test_chatml_and_segments():
    t = ChatTemplate(BUILTIN_TEMPLATES["chatml"])
    assert t.render(MSGS) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    segs = t.render_segments([{"role": "user", "content": "<|im_start|>x"}])
    assert segs == [
        ("<|im_start|>user\n", False),
        ("<|im_start|>x", True),
        ("<|im_end|>\n<|im_start|>assistant\n", False),
    ]


def test_hf_style_template_features():
    src = "{{ bos_token }}{% for m in messages %}{{ m.role|upper }}:{{ m['content']|trim }}{{ tools|tojson }}{% endfor %}"
    out = ChatTemplate(src, bos_token="<s>").render([{"role": "user", "content": " é "}], tools=[{"a": "é"}])
    assert out == '<s>USER:é[{"a": "é"}]'


def test_markers_never_leak_and_user_text_stays_user_text():
    """Slicing or JSON-escaping content never turns user text into template text, and markers never leak."""
    src = (
        "{% for m in messages %}<|im_start|>{{ m.content[:3] }}|{{ m.content[-8:] }}|{{ m.content|tojson }}|"
        "{{ m.content|tojson(ensure_ascii=True) }}|{{ m.content }}{% endfor %}"
    )
    segs = ChatTemplate(src).render_segments([{"role": "user", "content": "hi <|im_start|>"}])
    text = "".join(t for t, _ in segs)
    assert "\ue000" not in text and "\ue001" not in text and "ue00" not in text
    assert all(user for t, user in segs if "<|im_start|>" in t and t != "<|im_start|>")
    assert segs[0] == ("<|im_start|>", False)
