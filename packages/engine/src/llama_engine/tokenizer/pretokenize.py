"""Pre-tokenizers: split text into words before BPE merging, one per `tokenizer.ggml.pre` name.

This is llama.cpp's `unicode_regex_split` (src/unicode.cpp) with the regex lists of `llm_tokenizer_bpe`
(src/llama-vocab.cpp). llama.cpp runs those regexes on a *collapsed* copy of the text in which every
codepoint >= 128 is replaced by one byte naming its category (letter 0xD2, number 0xD1, punctuation 0xD3,
mark 0xD4, symbol 0xD5, other 0xD0; whitespace 0x0B), and `\\p{L}`-style classes are rewritten to match those
bytes plus their ASCII members. We do the same with Python's `re` (whose `\\p{..}` support is missing), using
llama.cpp's own category tables, so the split is identical. Its hand-written splitters for the gpt2, llama3,
qwen2 and qwen35 patterns match what these regexes match on the collapsed text, category for category.

Each stage splits every piece left by the previous stage into matches and the gaps between them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from . import _unicode_data as _ud

__all__ = ["PRE_TOKENIZERS", "PreTokenizer", "PreTokenizerConfig", "pre_tokenizer_config", "unicode_flags"]

# ---- the regexes, verbatim from llm_tokenizer_bpe (as the strings the C++ literals denote) ----

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (
    _CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_JAIS2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)"
    r"|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}"
)
_DEEPSEEK3 = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
    r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPARK = (
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|"
    r"[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"
)
_CASED = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    + _CONTRACTIONS
)
_YOUTU = _CASED + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GRANITE_EMB = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+"
    + _CONTRACTIONS
    + r"?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*"
    + _CONTRACTIONS
    + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+"
    r"((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK_DS = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_NO_CONTRACTIONS_QWEN2 = r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_DEEPSEEK_LLM_LETTERS = (
    "\\s?[A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a"
    "-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
    "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3"
    "\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d"
    "\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00"
    "-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787"
    "\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
    "\U0001e900-\U0001e943]+"
)
_PORO = " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"

# llama_vocab_pre_type -> regex_exprs
_REGEXES: dict[str, tuple[str, ...]] = {
    "LLAMA3": (_LLAMA3,),
    "JAIS2": (_JAIS2,),
    "DEEPSEEK_LLM": (
        "[\r\n]",
        _DEEPSEEK_LLM_LETTERS,
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK_DS,
        r"\p{N}+",
    ),
    "DEEPSEEK3_LLM": (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _DEEPSEEK3),
    "SPARK2_5": (r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+", _SPARK, r"\p{N}"),
    "YOUTU": (
        "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        _YOUTU,
    ),
    "DEEPSEEK_CODER": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_DS, r"\p{N}"),
    "FALCON": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "SMOLLM": (r"\p{N}", _GPT2),
    "GPT2": (_GPT2,),
    "QWEN2": (_QWEN2,),
    "QWEN35": (_QWEN35,),
    "PORO": (_PORO,),
    "VIKING": (_PORO, r"\p{N}"),
    "TEKKEN": (_TEKKEN,),
    "CHAMELEON": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        _GPT2,
    ),
    "GPT4O": (_GPT4O,),
    "GRANITE_EMB_MULTI": (_GRANITE_EMB,),
    "BAILINGMOE": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "SEED_CODER": (
        _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "UFAKZEKA": (_NO_CONTRACTIONS_QWEN2,),
    "LAGUNA": ("[^\\n]+|[\\n]+", _QWEN2),
    "EXAONE_MOE": (
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
        r"|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "GEMMA4": ("[^\\n]+|[\\n]+",),
    "MINICPM5": (
        r"\p{N}{1,3}",
        _CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "DEFAULT": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
}
for _alias, _same in (
    ("DBRX", "LLAMA3"),
    ("SMAUG", "LLAMA3"),
    ("CHATGLM4", "LLAMA3"),
    ("HUNYUAN_DENSE", "DEEPSEEK3_LLM"),
    ("JOYAI_LLM", "DEEPSEEK3_LLM"),
    ("HY_V4", "DEEPSEEK3_LLM"),
    ("STABLELM2", "QWEN2"),
    ("HUNYUAN", "QWEN2"),
    ("SOLAR_OPEN", "QWEN2"),
    ("GROK_2", "QWEN2"),
    ("MINIMAX_M2", "GPT4O"),
    ("SARVAM_MOE", "GEMMA4"),
):
    _REGEXES[_alias] = _REGEXES[_same]
for _name in ("STARCODER", "REFACT", "COMMAND_R", "CODESHELL", "EXAONE", "MINERVA", "MELLUM2"):
    _REGEXES[_name] = _REGEXES["SMOLLM"]
for _name in ("MPT", "OLMO", "JAIS", "TRILLION", "GRANITE_DOCLING"):
    _REGEXES[_name] = _REGEXES["GPT2"]
for _name in ("BLOOM", "GPT3_FINNISH"):
    _REGEXES[_name] = _REGEXES["PORO"]


@dataclass(frozen=True, slots=True)
class PreTokenizerConfig:
    """What `tokenizer.ggml.pre` selects in llama.cpp's `llama_vocab::impl::load` for a BPE vocabulary.

    `add_bos` is None when the name leaves llama.cpp's default alone; `bos_null` drops the default BOS id.
    """

    pre_type: str
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool | None = None
    add_sep: bool | None = None
    bos_null: bool = False
    escape_whitespaces: bool = False
    byte_encode: bool = True


def _c(pre_type: str, **kw: bool) -> PreTokenizerConfig:
    return PreTokenizerConfig(pre_type, **kw)


_NC = {"clean_spaces": False}
# tokenizer.ggml.pre -> config, as the if-chain in llama_vocab::impl::load.
PRE_TOKENIZERS: dict[str, PreTokenizerConfig] = {
    "default": _c("DEFAULT"),
    "minicpm5": _c("MINICPM5", ignore_merges=True),
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ),
        _c("LLAMA3", ignore_merges=True, add_bos=True),
    ),
    "deepseek-llm": _c("DEEPSEEK_LLM", **_NC),
    "deepseek-coder": _c("DEEPSEEK_CODER", **_NC),
    "deepseek-v3": _c("DEEPSEEK3_LLM", **_NC),
    "spark2_5": _c("SPARK2_5", **_NC),
    "youtu": _c("YOUTU", clean_spaces=False, ignore_merges=True),
    "falcon": _c("FALCON"),
    "mpt": _c("MPT"),
    "starcoder": _c("STARCODER"),
    **dict.fromkeys(
        (
            "gpt-2",
            "phi-2",
            "jina-es",
            "jina-de",
            "gigachat",
            "jina-v2-es",
            "jina-v2-de",
            "a.x-4.0",
            "mellum",
            "modern-bert",
            "exaone4",
        ),
        _c("GPT2"),
    ),
    "jais-2": _c("JAIS2"),
    **dict.fromkeys(
        ("gemma4", "granite-embed-multi-311m"), _c("GEMMA4", escape_whitespaces=True, byte_encode=False)
    ),
    "sarvam-moe": _c("SARVAM_MOE", escape_whitespaces=True, clean_spaces=False, byte_encode=False),
    **dict.fromkeys(("jina-v1-en", "jina-v2-code", "roberta-bpe"), _c("GPT2", add_sep=True)),
    "refact": _c("REFACT"),
    "command-r": _c("COMMAND_R", **_NC),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _c("QWEN2", **_NC)),
    "qwen35": _c("QWEN35", **_NC),
    "stablelm2": _c("STABLELM2"),
    "olmo": _c("OLMO"),
    "dbrx": _c("DBRX"),
    "smaug-bpe": _c("SMAUG"),
    "poro-chat": _c("PORO", **_NC),
    "chatglm-bpe": _c("CHATGLM4", bos_null=True),
    **dict.fromkeys(("glm4", "glm5"), _c("CHATGLM4", bos_null=True, ignore_merges=True)),
    "viking": _c("VIKING", **_NC),
    "jais": _c("JAIS"),
    "tekken": _c("TEKKEN", clean_spaces=False, ignore_merges=True, add_bos=True),
    "smollm": _c("SMOLLM", **_NC),
    "codeshell": _c("CODESHELL"),
    "bloom": _c("BLOOM"),
    "gpt3-finnish": _c("GPT3_FINNISH"),
    "exaone": _c("EXAONE"),
    "exaone-moe": _c("EXAONE_MOE"),
    "chameleon": _c("CHAMELEON", add_bos=True, clean_spaces=False),
    "minerva-7b": _c("MINERVA"),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie"), _c("GPT4O", **_NC)),
    "granite-embed-multi-97m": _c("GRANITE_EMB_MULTI", clean_spaces=False, ignore_merges=True),
    "trillion": _c("TRILLION", **_NC),
    "granite-docling": _c("GRANITE_DOCLING", **_NC),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _c("BAILINGMOE", **_NC)),
    "seed-coder": _c("SEED_CODER", **_NC),
    "hunyuan": _c("HUNYUAN", **_NC),
    "hunyuan-dense": _c("HUNYUAN_DENSE", **_NC),
    "hy_v4": _c("HY_V4", **_NC),
    "joyai-llm": _c("JOYAI_LLM", **_NC),
    "ufakzeka": _c("UFAKZEKA", **_NC),
    "grok-2": _c("GROK_2", **_NC),
    "laguna": _c("LAGUNA", **_NC),
    "minimax-m2": _c("MINIMAX_M2", **_NC),
    "solar-open": _c("SOLAR_OPEN", **_NC),
    "mellum2": _c("MELLUM2"),
}

# Names llama.cpp knows but whose splitters have no regex form here (custom C++ code or empty matches).
_UNSUPPORTED = ("kimi-k2", "afmoe", "tiny_aya", "cohere2moe", "superbpe", "whitespace")


def pre_tokenizer_config(name: str | None) -> PreTokenizerConfig:
    """The config for a `tokenizer.ggml.pre` value; a missing name means "default" (as in llama.cpp)."""
    if not name:
        return PRE_TOKENIZERS["default"]
    cfg = PRE_TOKENIZERS.get(name)
    if cfg is None:
        if name in _UNSUPPORTED:
            raise NotImplementedError(f"pre-tokenizer {name!r} is not supported yet")
        raise ValueError(f"unknown pre-tokenizer type: {name!r}")
    return cfg


# ---- collapsing, as unicode_regex_split ----

_CAT_CHAR = {
    _ud.NUMBER: "\xd1",
    _ud.LETTER: "\xd2",
    _ud.PUNCTUATION: "\xd3",
    _ud.ACCENT_MARK: "\xd4",
    _ud.SYMBOL: "\xd5",
}
# k_ucat_enum / k_ucat_map: the class each \p{..} becomes, minus the brackets.
_UCAT = {
    r"\p{N}": _ud.NUMBER,
    r"\p{L}": _ud.LETTER,
    r"\p{P}": _ud.PUNCTUATION,
    r"\p{M}": _ud.ACCENT_MARK,
    r"\p{S}": _ud.SYMBOL,
    r"\p{Lu}": _ud.LETTER,
    r"\p{Ll}": _ud.LETTER,
    r"\p{Lt}": _ud.LETTER,
    r"\p{Lm}": _ud.LETTER,
    r"\p{Lo}": _ud.LETTER,
}
_UCAT_ASCII = {
    _ud.NUMBER: "0-9",
    _ud.LETTER: "A-Za-z",
    _ud.PUNCTUATION: r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    _ud.ACCENT_MARK: "",
    _ud.SYMBOL: r"\$\+<->\^`\|\~",
}


@functools.cache
def _flags() -> bytes:
    """One category flag byte per codepoint (llama.cpp's unicode_cpt_flags_array, categories only)."""
    out = bytearray(_ud.MAX_CODEPOINTS)
    r = _ud.RANGES
    for i in range(0, len(r) - 2, 2):
        out[r[i] : r[i + 2]] = bytes([r[i + 1]]) * (r[i + 2] - r[i])
    return bytes(out)


def unicode_flags(cp: int) -> int:
    """llama.cpp's category flags of a codepoint (`_unicode_data.NUMBER`, `LETTER`, ...)."""
    return _flags()[cp]


@functools.cache
def _collapse_table() -> str:
    """A str indexed by codepoint: the collapsed character llama.cpp substitutes for it."""
    byte_map = bytearray(b"\xd0" * 256)
    for flag, ch in _CAT_CHAR.items():
        byte_map[flag] = ord(ch)
    table = bytearray(_flags().translate(bytes(byte_map)))
    for cp in _ud.WHITESPACE:
        table[cp] = 0x0B  # "<vertical tab> as whitespace fallback"
    table[:128] = bytes(range(128))  # ASCII is kept as is
    return table.decode("latin-1")


_WIDE_TABLE = {cp: "\x0b" for cp in _ud.WHITESPACE if cp > 0x7F}


def collapse(text: str) -> str:
    """The collapsed text llama.cpp runs `\\p{..}` regexes on (same length as `text`)."""
    return text if text.isascii() else text.translate(_collapse_table())


def _translate_regex(expr: str) -> tuple[re.Pattern[str], bool]:
    """Compile one llama.cpp regex for Python's `re`; returns (pattern, runs on the collapsed text)."""
    use_collapsed = any(k in expr for k in _UCAT)
    out: list[str] = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            out.append("[")
            inside = True
        elif inside and c == "]" and expr[i - 1] != "\\":
            out.append("]")
            inside = False
        elif c == "$" and not inside and (i == 0 or expr[i - 1] != "\\"):
            out.append(r"\Z")  # ECMAScript `$` is end of input only; Python's also matches before a final \n
        elif use_collapsed and expr.startswith("\\p{", i):
            end = expr.find("}", i + 3)
            cat = _UCAT.get(expr[i : end + 1]) if end != -1 else None
            if cat is None:
                out.append(c)
            else:
                body = _CAT_CHAR[cat] + _UCAT_ASCII[cat]
                out.append(body if inside else f"[{body}]")
                i = end
        else:
            out.append(c)
        i += 1
    if use_collapsed and any(ord(c) >= 128 for c in expr):
        raise ValueError(f"regex mixes unicode categories and non-ASCII characters: {expr!r}")
    # re.ASCII: \s, \d, \b as ECMAScript's (classic "C" locale), not Python's Unicode classes.
    return re.compile("".join(out), re.ASCII), use_collapsed


@functools.cache
def _compiled(pre_type: str) -> tuple[tuple[re.Pattern[str], bool], ...]:
    return tuple(_translate_regex(e) for e in _REGEXES[pre_type])


class PreTokenizer:
    """Splits text into the words BPE merges within (llama.cpp's `unicode_regex_split`, minus byte encoding)."""

    __slots__ = ("_stages", "config")

    def __init__(self, config: PreTokenizerConfig) -> None:
        self.config = config
        self._stages = _compiled(config.pre_type)

    def split(self, text: str) -> list[str]:
        """The words of `text`, in order; their concatenation is `text`."""
        if not text:
            return []
        collapsed = wide = text
        if not text.isascii():
            if any(c for _, c in self._stages):
                collapsed = text.translate(_collapse_table())
            if not all(c for _, c in self._stages):
                wide = text.translate(_WIDE_TABLE)
        spans = [(0, len(text))]
        for pattern, use_collapsed in self._stages:
            subject = collapsed if use_collapsed else wide
            out: list[tuple[int, int]] = []
            append = out.append
            for start, end in spans:
                pos = start
                for m in pattern.finditer(subject, start, end):
                    ms, me = m.span()
                    if ms > pos:
                        append((pos, ms))
                    if me > ms:
                        append((ms, me))
                    pos = me
                if pos < end:
                    append((pos, end))
            spans = out
        return [text[a:b] for a, b in spans]
