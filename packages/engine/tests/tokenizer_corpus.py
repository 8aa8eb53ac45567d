"""A deterministic corpus of hostile and ordinary strings for tokenizer parity tests.

`corpus()` returns the same list on every run and machine (seeded `random.Random`): English, code, CJK,
emoji, many scripts, combining marks, control characters, unusual and recently assigned code points,
whitespace runs, numbers of many lengths and special-token texts of both real models.
"""

from __future__ import annotations

import random

__all__ = ["SPECIAL_TEXTS", "corpus", "unusual_codepoints"]

SPECIAL_TEXTS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<repo_name>",
    "<reponame>",
    "<file_sep>",
    "<jupyter_code>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<bos>",
    "<eos>",
    "<pad>",
    "<unk>",
    "<mask>",
    "<unused0>",
    "<unused42>",
    "[multimodal]",
    "<start_of_image>",
    "<table>",
    "</td>",
    "<b>",
    "</s>",
    "<s>",
    "<0x41>",
    "<0x0A>",
    "\u2581",
    "<|im_start",
    "im_end|>",
    "<start_of_turn",
    "<<|im_start|>>",
    "<|eot_id|>",
)

ENGLISH = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! How are you today?",
    "It's a beautiful day; isn't it? I'd say we'll go, they've been, you're right, I'm here.",
    "IT'S LOUD. DON'T SHOUT. WE'LL SEE. THEY'VE GONE. YOU'RE OUT. I'M IN. HE'D GO.",
    'She said: "No way!" -- and left... (again) [sic] {ok} <tag> a/b\\c',
    "e-mail me at someone@example.com or visit https://example.org/path?q=1&r=2#frag",
    "Once upon a time, in a land far, far away, there lived a curious tokenizer.",
    "GPT-2 uses byte-level BPE; SentencePiece uses \u2581 for spaces.",
)
CODE = (
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}\n",
    '{"key": [1, 2.5, -3e10, null, true], "nested": {"a": "b"}}',
    "<html><body><table><tr><td>cell</td></tr></table></body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';",
    "if __name__ == '__main__':\r\n    main()\r\n",
    "x=>x+1; a!==b && c||d ?? e; $var @decorator #include <stdio.h>",
    "    indented\n        more\n\t\ttabs\n \t mixed \t \n",
)
SCRIPTS = (
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다. 안녕하세요!",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "مرحبا بالعالم! هذا نص عربي.",
    "नमस्ते दुनिया! यह हिंदी पाठ है।",
    "สวัสดีชาวโลก นี่คือข้อความภาษาไทย",
    "Γειά σου Κόσμε! Ελληνικά.",
    "שלום עולם! זה טקסט בעברית.",
    "Tiếng Việt có dấu: Xin chào thế giới.",
    "ქართული ენა, Հայերեն, አማርኛ, ᏣᎳᎩ, ᚠᚢᚦ",
    "Ζ͑ͫ̓ͪ̂ͫ̽͏̴̙̤̞͉͚̯̞̠͍A̴̵̜̰͔ͫ͗͢L̠ͨͧͩ͘G̴̻͈͍͔̹̑͗̎̅͛́Ǫ̵̹̻̝̳͂̌̌͘",
    "e\u0301 n\u0303 a\u0308 \u00e9 \u00f1 \u00e4 cafe\u0301 naïve façade",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟙𝟚𝟛 ①②③ Ⅻ ½ ¾ ²³",
)
EMOJI = (
    "😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ☺︎ 🏳️‍🌈 🧑🏿‍🚀",
    "I ❤️ 🍕 and 🍣!! 🎉🎉🎉",
    "keycaps: 1️⃣ #️⃣ *️⃣ flags: 🏴󠁧󠁢󠁳󠁣󠁴󠁿",
)
CONTROL = "\x00\x01\x07\x08\x0b\x0c\x1b\x1c\x1d\x1e\x1f\x7f\x85\xa0\xad\u200b\u200c\u200d\u200e\u2028\u2029\u202f\u205f\u3000\ufeff\ufffd"
WHITESPACE = (
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\r\n",
    "\n\n",
    " \n",
    "\t\t",
    "\u3000",
    "\xa0",
    "\u2003",
    "\x0b",
    "\x0c",
)


def unusual_codepoints() -> list[str]:
    """Code points where Unicode versions or category tables disagree, plus odd planes."""
    cps = [
        0x0CF3, 0x0ECE, 0x2FFC, 0x31EF, 0x10EFD, 0x1123F, 0x11241, 0x11B00, 0x11F00, 0x11F02, 0x11F04,
        0x11F34, 0x11F43, 0x11F50, 0x11F59, 0x1342F, 0x13439, 0x13440, 0x13441, 0x13447, 0x1B132, 0x1D2C0,
        0x1DF25, 0x1E030, 0x1E08F, 0x1E4D0, 0x1E4EC, 0x1E4F0, 0x1F6DC, 0x1FA75, 0x1FABF, 0x2B739, 0x2EBF0,
        0x31350, 0x323AF, 0xE000, 0xF8FF, 0xFDD0, 0xFFFE, 0xFFFF, 0x10FFFD, 0x10FFFF, 0xE0041, 0xE0100,
        0xFE0F, 0x0378, 0x0530, 0x1D400, 0x1F100, 0x2070, 0x00B2, 0x0660, 0x06F0, 0x0966, 0x0E50, 0xFF10,
        0x1D7CE, 0x16A60, 0x0345, 0x0488, 0x20DD, 0x1AB0, 0x00AA, 0x02B0, 0x01C5, 0x2160, 0x3007, 0x00B5,
    ]  # fmt: skip
    return [chr(c) for c in cps]


def _number(rng: random.Random) -> str:
    n = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 20, 31])
    digits = "".join(rng.choice("0123456789") for _ in range(n))
    style = rng.randrange(6)
    if style == 0:
        return digits
    if style == 1:
        return f"{digits}.{rng.randrange(1000)}"
    if style == 2:
        return f"-{digits}"
    if style == 3:
        return f"{int(digits):,}"
    if style == 4:
        return digits.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    return f"{digits}e-{rng.randrange(30)}"


def _random_mix(rng: random.Random, pool: list[str], length: int) -> str:
    return "".join(rng.choice(pool) for _ in range(length))


def _random_codepoint(rng: random.Random) -> str:
    while True:
        c = rng.randrange(0x110000) if rng.random() < 0.3 else rng.randrange(0x30000)
        if not 0xD800 <= c < 0xE000:
            return chr(c)


def corpus(seed: int = 20240531, n_random: int = 1900) -> list[str]:
    """The full corpus: fixed samples, their combinations and `n_random` seeded random strings."""
    rng = random.Random(seed)
    fixed = [*ENGLISH, *CODE, *SCRIPTS, *EMOJI, *SPECIAL_TEXTS, *WHITESPACE, CONTROL, *unusual_codepoints()]
    out = list(fixed)
    out += ["", " ", "a", "A", "'", "'s", " 's", "''", "'S", "'ll", "'Ve", "x'd", "\u2581\u2581a", "▁hello"]
    out += [str(10**k) for k in range(25)] + ["".join(str(i % 10) for i in range(k)) for k in range(1, 40)]
    for ws in WHITESPACE:
        out += [
            ws + "word",
            "word" + ws,
            "a" + ws + "b",
            ws * 3 + "x" + ws * 2,
            "1" + ws + "2",
            "." + ws + ",",
        ]
    for sp in SPECIAL_TEXTS:
        out += [f"{sp}user\nhi{sp}", f" {sp} ", f"a{sp}b", f"{sp}{sp}", f"\n{sp}\n", f"{sp} hello"]
    words = [w for s in ENGLISH + SCRIPTS for w in s.split()] + ["'s", "'t", "'re", "n't", "'LL", "–", "—"]
    pool = (
        list("abcXYZ019 '\t\n\r.,;:!?-_()[]{}<>|/\\\"@#$%^&*+=~`")
        + list(CONTROL)
        + list("你好世界日本語한국어мирعربيहिंदीไทยΕλλάδα")
        + ["😀", "👍🏽", "👨‍👩‍👧", "❤️", "\u0301", "\u0308", "\u2581", "  ", "   ", "\n\n", "\r\n"]
        + unusual_codepoints()
        + list(SPECIAL_TEXTS)
    )
    for _ in range(n_random):
        kind = rng.randrange(7)
        if kind == 0:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randrange(1, 15))))
        elif kind == 1:
            out.append(_random_mix(rng, pool, rng.randrange(1, 40)))
        elif kind == 2:
            out.append("".join(_random_codepoint(rng) for _ in range(rng.randrange(1, 12))))
        elif kind == 3:
            parts = [rng.choice(words), _number(rng), rng.choice(WHITESPACE), rng.choice(SPECIAL_TEXTS)]
            rng.shuffle(parts)
            out.append("".join(parts))
        elif kind == 4:
            out.append(rng.choice(fixed) + rng.choice(WHITESPACE) + rng.choice(fixed))
        elif kind == 5:
            out.append(" ".join(_number(rng) for _ in range(rng.randrange(1, 6))))
        else:
            out.append(
                rng.choice(WHITESPACE) * rng.randrange(1, 9) + rng.choice(words) + rng.choice(WHITESPACE)
            )
    # long documents: many of the above joined by random whitespace
    short = list(out)
    for _ in range(30):
        parts = [rng.choice(short) for _ in range(rng.randrange(20, 80))]
        out.append("".join(p + rng.choice(WHITESPACE) for p in parts))
    return out
