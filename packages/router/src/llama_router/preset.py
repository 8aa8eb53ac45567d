"""The `--models-preset` INI format: `[section]`, `key = value`, `;`/`#` comments (also after a value, when
preceded by whitespace), CR/LF/CRLF line ends. Keys before the first section belong to `default`."""

from __future__ import annotations

import re

__all__ = ["PresetError", "canonical_name", "parse_ini", "render_ini"]

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_COMMENT = re.compile(r"\s[;#]")
_TAG_SUFFIX = re.compile(r"[-.]([A-Za-z0-9_]+)$")


class PresetError(ValueError):
    """A preset file that does not parse, or names an unknown option."""


def parse_ini(text: str, source: str = "preset") -> dict[str, dict[str, str]]:
    """Sections in file order, each `key -> value` (raw strings). `version` is ignored; an empty
    `default` section (keys before the first header) is dropped."""
    sections: dict[str, dict[str, str]] = {"default": {}}
    current = "default"
    for n, raw in enumerate(re.split(r"\r\n|\r|\n", text), 1):
        line = raw.strip()
        if not line or line[0] in ";#":
            continue
        if line.startswith("["):
            if not line.endswith("]") or len(line) < 3:
                raise PresetError(f"{source}:{n}: malformed section header: {raw!r}")
            current = line[1:-1].strip()
            sections.setdefault(current, {})
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not _KEY.match(key):
            raise PresetError(f"{source}:{n}: expected 'key = value', got {raw!r}")
        if m := _COMMENT.search(value):
            value = value[: m.start()]
        if key == "version":
            continue
        sections[current][key] = value.strip()
    if not sections["default"]:
        del sections["default"]
    return sections


def canonical_name(name: str) -> str:
    """`repo:tag` with its tag canonicalised: a `-X`/`.X` suffix becomes upper-case `X`, else the whole tag
    is upper-cased (`[repo:q4_k_m]` -> `repo:Q4_K_M`)."""
    repo, sep, tag = name.partition(":")
    if not sep or not tag:
        return name
    m = _TAG_SUFFIX.search(tag)
    return f"{repo}:{(m[1] if m else tag).upper()}"


def render_ini(name: str, options: dict[str, str]) -> str:
    """An entry as INI text (its `status.preset`)."""
    return f"[{name}]\n" + "".join(f"{k} = {v}\n" for k, v in options.items())
