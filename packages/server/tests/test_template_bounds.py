"""Chat templates cannot exhaust memory: every string and list a template builds is sized where it is built
(most of them before they allocate), and what a render holds is bounded; ordinary templates still render
as Jinja renders them."""

from __future__ import annotations

import time
import tracemalloc

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from llama_server.template import ChatTemplate, TemplateError
from llama_server.template_bounds import MAX_RENDER_BYTES

MSGS = [{"role": "user", "content": "Hi"}]
BIG = "{% set s = 'x' * 1000000 %}"  # 1 Mi characters: allowed on its own
# what a refused render may allocate at its peak: the table of held values, and one value being sized
PEAK_BOUND = MAX_RENDER_BYTES + 32 * 1024 * 1024

HOSTILE = {
    # `~` compiles to a join of its operands, outside the sandbox's operator hooks
    "concat-doubling": "{% set ns = namespace(s='x'*1000) %}{% for i in range(40) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "join-shared-refs": "{{ ([('x'*100)]*4000000)|join }}",
    "join-shared-refs-short-list": "{{ ([('x'*100)]*200000)|join }}",
    "str-replace-empty": BIG + "{{ s.replace('', s) }}",
    "filter-replace-empty": BIG + "{{ s|replace('', s) }}",
    "list-plus-doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}",
    "str-plus-doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "list-of-huge-string": "{{ ('x' * 4000000)|list|length }}",
    "center-filter": "{{ 'x'|center(10**9) }}",
    "center-method": "{{ 'x'.center(10**9) }}",
    "zfill-method": "{{ 'x'.zfill(10**9) }}",
    "format-method-width": "{{ '{:>999999999}'.format(1) }}",
    "format-method-fields": "{{ ('{0}' * 1000).format('x' * 100000) }}",
    "percent-fields": "{{ ('%s' * 1000) % ((('x' * 100000),) * 1000) }}",
    "percent-precision": "{{ '%.999999999f' % 1.5 }}",
    "format-filter-fields": BIG + "{{ '%s%s%s%s%s'|format(s, s, s, s, s) }}",
    "wordwrap-wrapstring": "{% set w = 'x' * 100000 %}{{ ('a b ' * 2000)|wordwrap(1, wrapstring=w) }}",
    "indent-width": "{{ 'x'|indent(10**8) }}",
    "indent-many-lines": "{{ ('\\n' * 1000000)|indent(100) }}",
    "expandtabs": "{{ ('\\t' * 1000).expandtabs(10**8) }}",
    "batch-fill": "{{ [1]|batch(10**9, 'x')|list }}",
    "slice-count": "{{ [1]|slice(10**9)|list|length }}",
    "nested-map-join": "{{ ([[('x' * 1000)] * 200000] * 1000)|map('join')|list }}",
    # each item is within bounds: the deadline stops it, what it holds stays bounded
    "nested-map-center": "{{ (['x'] * 200000)|map('center', 4000000)|map('length')|sum }}",
    "tojson-shared-refs": "{{ (['x' * 1000] * 200000)|tojson }}",
    "tojson-indent": "{{ [[[1]]]|tojson(indent=10**6) }}",
    "pprint-shared-refs": "{{ (['x' * 1000] * 200000)|pprint }}",
    "string-shared-refs": "{{ (['x' * 1000] * 200000)|string }}",
    "output-shared-refs": "{{ ['x' * 1000] * 200000 }}",
    "xmlattr-shared-refs": "{{ {'a': ['x' * 1000] * 200000}|xmlattr }}",
    "urlencode-shared-refs": "{{ {'a': ['x' * 1000] * 200000}|urlencode }}",
    "wordcount-shared-refs": "{{ (['x' * 1000] * 200000)|wordcount }}",
    "upper-shared-refs": "{{ (['x' * 1000] * 200000)|upper }}",
    "join-separator": BIG + "{{ (['a'] * 200000)|join(s) }}",
    "join-method": BIG + "{{ s.join(['a'] * 200000) }}",
    "translate": BIG + "{{ s.translate({120: s}) }}",
    "sum-lists": "{{ ([[1] * 1000] * 1000)|sum(start=[])|length }}",
    "split-many": "{{ ('x' * 1000000).split('x')|length }}",
    "macro-output": BIG + "{% macro m() %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endmacro %}"
    "{% set x = m() %}",
    "set-block": BIG + "{% set x %}{% for i in range(100000) %}{{ s }}{% endfor %}{% endset %}",
    "keep-concatenations": BIG + "{% set l = [] %}{% for i in range(60000) %}"
    "{% set _ = l.append(s ~ i) %}{% endfor %}",
    "keep-slices": BIG
    + "{% set l = [] %}{% for i in range(60000) %}{% set _ = l.append(s[i:]) %}{% endfor %}",
    "keep-upper": BIG + "{% set l = [] %}{% for i in range(60000) %}{% set _ = l.append((s ~ i)|upper) %}"
    "{% endfor %}",
    "int-squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "int-power": "{{ (10 ** 1000) ** 1000 }}",
    "int-to-bytes": "{{ (1).to_bytes(10**9, 'big') }}",
    "encode": "{{ 'x'.encode() }}",
    "lipsum": "{{ lipsum(10**6) }}",
    "urlize": "{{ 'www.example.com '|urlize }}",
    # copies kept in a list: what a global, a method or a filter returns is counted with the items it holds
    "keep-namespace-copies": "{% set d = dict(range(100000)|batch(2)|list) %}{% set l = [] %}"
    "{% for i in range(3000) %}{% set _ = l.append(namespace(d)) %}{% endfor %}",
    "keep-dict-copies": "{% set d = dict(range(100000)|batch(2)|list) %}{% set l = [] %}"
    "{% for i in range(3000) %}{% set _ = l.append(dict(d)) %}{% endfor %}",
    "keep-cycler-copies": "{% set p = (range(100000)|list) * 2 %}{% set l = [] %}"
    "{% for i in range(3000) %}{% set _ = l.append(cycler(*p)) %}{% endfor %}",
    "keep-item-pairs": "{% set d = dict(range(100000)|batch(2)|list) %}{% set l = [] %}"
    "{% for i in range(3000) %}{% set _ = l.append(d|items|list) %}{% endfor %}",
}


@pytest.mark.parametrize("source", list(HOSTILE.values()), ids=list(HOSTILE))
def test_hostile_template_is_refused_quickly_and_small(source):
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(TemplateError):
            ChatTemplate(source).render(MSGS)
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 3, elapsed
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MiB"


def test_refusal_messages_name_the_limit():
    def err(source: str) -> str:
        with pytest.raises(TemplateError) as e:
            ChatTemplate(source).render(MSGS)
        return str(e.value)

    assert err(HOSTILE["concat-doubling"]) == "the template's output is too large"
    assert "longer than 262144 items" in err(HOSTILE["join-shared-refs"])
    assert "holds more than 32 MiB" in err(HOSTILE["keep-concatenations"])


def test_accumulating_a_prompt_costs_what_it_holds_not_what_it_built():
    """`ns.out = ns.out ~ text` (Reka, DeepSeek, Kimi...) builds ~400 MB of intermediate strings here, but
    holds one prompt at a time."""
    src = (
        "{% set ns = namespace(out='') %}{% for i in range(200) %}{% set ns.out = ns.out ~ ('y' * 20000) %}"
        "{% endfor %}{{ ns.out|length }}"
    )
    assert ChatTemplate(src).render(MSGS) == "4000000"


CASES = [
    "{{ ['a', 1, none, [2]]|join(', ') }}|{{ 'a-b-c'|replace('-', '+', 1) }}|{{ 'abc'|replace('', '.') }}",
    "{{ 'a {0} {x}'.format(1, x=[2]) }}|{{ '%s=%05.1f' % ('k', 2.25) }}|{{ '%(a)s' % {'a': 1} }}",
    "{{ 'x'|center(7) }}|{{ 'ab'.ljust(4, '.') }}|{{ 'a\\tb'.expandtabs(4) }}|{{ '7'.zfill(3) }}",
    "{{ 'a\\nb\\n\\nc'|indent(2, true) }}|{{ 'a\\nb'|indent('> ', blank=true) }}",
    "{{ 'the quick brown fox jumps'|wordwrap(9, wrapstring='/') }}|{{ 'long words'|truncate(8, true) }}",
    "{{ 'abc'|list }}|{{ [3, 1, 2]|sort }}|{{ [[1], [2, 3]]|sum(start=[]) }}|{{ 'abc'|reverse }}",
    "{{ range(5)|batch(2, 0)|list }}|{{ range(5)|slice(2)|list }}|{{ [1, 1, 2]|unique|list }}",
    "{{ {'b': [1, {'c': 'e'}]}|tojson(indent=2) }}|{{ {'b': 1}|pprint }}|{{ [1, 'a'] ~ none ~ 2 }}",
    "{{ 'a,b'.split(',') }}|{{ 'Ab'.translate({65: 'xy'}) }}|{{ 'é'|upper }}|{{ ['a', 'b']|string }}",
    "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) ~ m(2) }}{% set b %}[{{ 'q' * 3 }}]{% endset %}{{ b }}",
    "{{ {'a': 'x y', 'b': 1}|xmlattr }}|{{ {'a': 'x y'}|urlencode }}|{{ ('a' * 3)[1:] }}|{{ 2 ** 10 }}",
]


@pytest.mark.parametrize("source", CASES)
def test_ordinary_operations_render_as_jinja_renders_them(source):
    jinja = ImmutableSandboxedEnvironment(undefined=jinja2.Undefined).from_string(source).render()
    assert ChatTemplate(source).render(MSGS) == jinja
