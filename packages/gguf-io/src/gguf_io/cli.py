"""`gguf-io info FILE` and `gguf-io dump --json FILE`.

argparse rather than click: gguf-io stays a plain library with no CLI framework in its dependencies.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import Any

import msgspec

from .constants import GGUFValueType
from .errors import GGUFError
from .file import GGUFFile
from .file import open as open_gguf
from .reader import Field

__all__ = ["main"]

_ARRAY_PREVIEW = 8
_STRING_PREVIEW = 120


def _short(value: Any) -> str:
    s = repr(value)
    return s if len(s) <= _STRING_PREVIEW else s[: _STRING_PREVIEW - 3] + "..."


def _describe_field(f: Field) -> tuple[str, str]:
    if f.value_type == GGUFValueType.ARRAY:
        assert f.array_type is not None
        items = f.to_python()
        head = ", ".join(_short(v) for v in items[:_ARRAY_PREVIEW])
        more = f", ... ({len(items)} items)" if len(items) > _ARRAY_PREVIEW else ""
        return f"[{f.array_type.name}]", f"[{head}{more}]"
    return f.value_type.name, _short(f.value)


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


def _info(f: GGUFFile, out: Any) -> None:
    w = out.write
    w(f"file:      {', '.join(f.paths)}\n")
    w(f"version:   {f.version}    alignment: {f.alignment}    ")
    w(f"metadata: {len(f.fields)} keys    tensors: {len(f.tensors)}\n")
    try:
        h = f.header
        w(
            f"model:     {h.architecture} '{h.name or ''}'  layers={h.block_count} embd={h.embedding_length} "
            f"heads={h.head_count}/{h.head_count_kv} ctx={h.context_length} vocab={h.vocab_size}\n"
        )
    except GGUFError as e:
        w(f"model:     (no usable model header: {e})\n")
    w("\nmetadata:\n")
    width = max((len(k) for k in f.fields), default=0)
    for f_ in f.fields.values():
        type_name, value = _describe_field(f_)
        w(f"  {f_.name:<{width}}  {type_name:<10} {value}\n")
    w("\ntensors:\n")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    name_w = max((len(n) for n in f.tensors), default=0)
    for t in f.tensors.values():
        w(f"  {t.name:<{name_w}}  {t.ggml_type.name:<8} {list(t.shape)!s:<24} {_human(t.nbytes):>12}\n")
        acc = totals[t.ggml_type.name]
        acc[0] += 1
        acc[1] += t.n_elements
        acc[2] += t.nbytes
    w("\ntotals per type:\n")
    for name, (count, elems, nbytes) in sorted(totals.items(), key=lambda kv: -kv[1][2]):
        bpw = nbytes * 8 / elems if elems else 0.0
        w(f"  {name:<8} {count:>5} tensors {elems:>14,} weights {_human(nbytes):>12}  {bpw:6.3f} bpw\n")
    elems = sum(v[1] for v in totals.values())
    nbytes = sum(v[2] for v in totals.values())
    w(f"  {'all':<8} {len(f.tensors):>5} tensors {elems:>14,} weights {_human(nbytes):>12}")
    w(f"  {nbytes * 8 / elems if elems else 0:6.3f} bpw\n")


def _dump(f: GGUFFile) -> dict[str, Any]:
    def enc(fl: Field) -> dict[str, Any]:
        d: dict[str, Any] = {"type": fl.value_type.name, "value": fl.to_python()}
        if fl.array_type is not None:
            d["array_type"] = fl.array_type.name
        return d

    return {
        "files": f.paths,
        "version": f.version,
        "alignment": f.alignment,
        "metadata": {k: enc(fl) for k, fl in f.fields.items()},
        "tensors": [
            {
                "name": t.name,
                "type": t.ggml_type.name,
                "shape": list(t.shape),
                "offset": t.offset,
                "nbytes": t.nbytes,
                "shard": t.shard,
            }
            for t in f.tensors.values()
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gguf-io", description="Inspect GGUF model files.")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="header summary, metadata, tensor table and totals per type")
    p_info.add_argument("file")
    p_dump = sub.add_parser("dump", help="the whole header as JSON")
    p_dump.add_argument("--json", action="store_true", required=True, help="output JSON (the only format)")
    p_dump.add_argument("file")
    args = parser.parse_args(argv)
    try:
        with open_gguf(args.file) as f:
            if args.command == "info":
                _info(f, sys.stdout)
            else:
                data = _dump(f)
                sys.stdout.write(msgspec.json.encode(data).decode() + "\n")
    except GGUFError as e:
        print(f"gguf-io: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
