"""The ``llama-quant`` command: llama-quantize's command line, plus ``llama-quant compare A.gguf B.gguf``.

    llama-quant [options] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]
    llama-quant compare A.gguf B.gguf

Options come before the positional arguments. When the second positional is a file type the output is
``<input folder>/ggml-model-<TYPE>.gguf``. With ``--keep-split`` the output name is a prefix (a ``.gguf`` in
it is cut off, as llama-quantize does) and the shards are ``PREFIX-0000i-of-0000N.gguf``, also for an
unsplit input. Errors print one line and exit with status 1.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Sequence

import click
import numpy as np

import gguf_io
from gguf_io import GGUFError
from llama_quant import dequantize
from llama_quant.imatrix import load_imatrix
from llama_quant.mixture import FILE_TYPES, FileType, MixtureParams, parse_file_type, parse_ggml_type
from llama_quant.plan import QuantizeError, QuantizeOptions, describe, ensure_distinct, run_quantize
from llama_quant.progress import TensorProgress
from llama_quant.rewrite import parse_kv_override, parse_prune_layers

__all__ = ["compare_files", "main"]


class _Fail(Exception):
    """A one-line error for the user."""


def _usage_text() -> str:
    lines = [
        "usage: llama-quant [options] INPUT.gguf [OUTPUT.gguf] TYPE [NTHREADS]",
        "       llama-quant compare A.gguf B.gguf",
        "",
        "allowed quantization types:",
    ]
    for ft in FILE_TYPES:
        num = f"{ft.ftype:2d}  or  " if ft.name != "COPY" else "          "
        lines.append(f"  {num}{ft.name:<7s} : {ft.desc}")
    return "\n".join(lines)


def _input_mib(path: str) -> float:
    """The input's tensor data in MiB (what the progress bar counts)."""
    with gguf_io.open(path) as f:
        return sum(t.nbytes for t in f.tensors.values()) / 1048576


def _ggml_type(value: str, what: str):
    t = parse_ggml_type(value)
    if t is None:
        raise _Fail(f"invalid ggml type {value!r} for {what}")
    return t


def _tensor_type(spec: str) -> tuple[str, object]:
    """``NAME=TYPE``: NAME is a regex searched in tensor names (lower-cased, as llama-quantize does)."""
    name, sep, type_name = spec.partition("=")
    if not sep:
        raise _Fail(f"malformed tensor type {spec!r} (expected NAME=TYPE)")
    if not name:
        raise _Fail(f"missing tensor name in {spec!r}")
    if not type_name:
        raise _Fail(f"missing quantization type in {spec!r}")
    try:
        re.compile(name.lower())
    except re.error as e:
        raise _Fail(f"invalid tensor name pattern {name!r}: {e}") from None
    return name.lower(), _ggml_type(type_name, "--tensor-type")


def _resolve_positionals(
    args: Sequence[str], dry_run: bool, keep_split: bool = False
) -> tuple[str, str | None, FileType, int]:
    if len(args) < 2:
        raise click.UsageError("bad arguments: need INPUT.gguf and TYPE")
    inp = args[0]
    ft = parse_file_type(args[1])
    rest: Sequence[str]
    if ft is not None:
        # with --keep-split the name is a prefix: the shards add -0000i-of-0000N.gguf
        suffix = "" if keep_split else ".gguf"
        out = None if dry_run else os.path.join(os.path.dirname(inp), f"ggml-model-{ft.name}{suffix}")
        rest = args[2:]
    else:
        out = args[1]
        if keep_split and ".gguf" in out:  # quantize.cpp drops the last five characters
            out = out[:-5]
        if len(args) < 3:
            raise _Fail("missing ftype")
        ft = parse_file_type(args[2])
        if ft is None:
            raise _Fail(f"invalid ftype {args[2]!r}")
        rest = args[3:]
        out = None if dry_run else out
    nthread = 0
    if rest:
        m = re.match(r"\s*[+-]?\d+", rest[0])
        if m is None:
            raise _Fail(f"invalid nthread {rest[0]!r}")
        nthread = int(m.group())
    if len(rest) > 1:
        raise click.UsageError(f"unexpected argument {rest[1]!r}")
    return inp, out, ft, nthread


@click.command(
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
    epilog="Types: " + ", ".join(ft.name for ft in FILE_TYPES),
)
@click.option("--allow-requantize", is_flag=True, help="Allow quantizing tensors that are already quantized.")
@click.option("--leave-output-tensor", is_flag=True, help="Do not (re)quantize output.weight.")
@click.option("--pure", is_flag=True, help="No k-quant mixtures: every tensor gets the same type.")
@click.option("--imatrix", "imatrix_file", metavar="FILE", help="Importance matrix (GGUF or legacy .dat).")
@click.option("--include-weights", multiple=True, metavar="NAME", help="Use the imatrix only for these.")
@click.option("--exclude-weights", multiple=True, metavar="NAME", help="Do not use the imatrix for these.")
@click.option("--output-tensor-type", metavar="TYPE", help="ggml type for output.weight.")
@click.option("--token-embedding-type", metavar="TYPE", help="ggml type for the token embeddings.")
@click.option("--tensor-type", multiple=True, metavar="NAME=TYPE", help="Per-tensor type (regex NAME).")
@click.option("--tensor-type-file", metavar="FILE", help="Many NAME=TYPE entries, whitespace-separated.")
@click.option("--prune-layers", metavar="L0,L1,...", help="Remove these blocks; the rest are renumbered.")
@click.option("--keep-split", is_flag=True, help="Write a split input as the same shards.")
@click.option(
    "--override-kv", multiple=True, metavar="KEY=TYPE:VALUE", help="Set metadata (int/float/bool/str)."
)
@click.option("--max-buffer-size", metavar="MIB", help="Bytes of rows converted at a time, in MiB.")
@click.option("--dry-run", is_flag=True, help="Print the per-tensor plan and sizes; write nothing.")
@click.argument("args", nargs=-1, required=True)
def quantize_command(
    allow_requantize: bool,
    leave_output_tensor: bool,
    pure: bool,
    imatrix_file: str | None,
    include_weights: tuple[str, ...],
    exclude_weights: tuple[str, ...],
    output_tensor_type: str | None,
    token_embedding_type: str | None,
    tensor_type: tuple[str, ...],
    tensor_type_file: str | None,
    prune_layers: str | None,
    keep_split: bool,
    override_kv: tuple[str, ...],
    max_buffer_size: str | None,
    dry_run: bool,
    args: tuple[str, ...],
) -> None:
    """Quantize INPUT.gguf to TYPE, as llama.cpp's llama-quantize does."""
    if include_weights and exclude_weights:
        raise click.UsageError("--include-weights and --exclude-weights cannot be used together")
    specs = list(tensor_type)
    if tensor_type_file:
        try:
            with open(tensor_type_file, encoding="utf-8") as fh:
                specs += fh.read().split()
        except (OSError, UnicodeDecodeError) as e:
            raise _Fail(f"failed to read tensor type file {tensor_type_file!r}: {e}") from None
    mixture = MixtureParams(
        ftype=0,
        output_tensor_type=_ggml_type(output_tensor_type, "--output-tensor-type")
        if output_tensor_type
        else None,
        token_embedding_type=(
            _ggml_type(token_embedding_type, "--token-embedding-type") if token_embedding_type else None
        ),
        quantize_output_tensor=not leave_output_tensor,
        pure=pure,
        tensor_types=[_tensor_type(s) for s in specs],  # type: ignore[misc]
    )
    try:
        overrides = [parse_kv_override(s) for s in override_kv]
        prune = parse_prune_layers(prune_layers) if prune_layers is not None else ()
    except ValueError as e:
        raise _Fail(str(e)) from None
    max_buf = 0
    if max_buffer_size is not None:
        m = re.match(r"\s*[+-]?\d+", max_buffer_size)  # atoi
        mib = int(m.group()) if m else 0
        if mib <= 0:
            raise _Fail(f"invalid --max-buffer-size {max_buffer_size!r}")
        max_buf = mib << 20
    inp, out, ft, nthread = _resolve_positionals(args, dry_run, keep_split)
    mixture.ftype = ft.ftype
    mixture.only_copy = ft.name == "COPY"
    imat = None
    if imatrix_file:
        imat = load_imatrix(imatrix_file).select(include_weights, exclude_weights)
        if not imat.entries:
            imat = None
        else:
            click.echo(f"have {len(imat.entries)} importance matrix entries from {imatrix_file}")
    mixture.has_imatrix = imat is not None
    if out is not None and not keep_split:
        ensure_distinct(inp, out)
    opts = QuantizeOptions(
        mixture,
        allow_requantize,
        imat,
        imatrix_file or "",
        nthread,
        keep_split=keep_split,
        prune_layers=prune,
        kv_overrides=overrides,
        max_buf_size=max_buf,
    )
    action = "calculating quantization size for" if out is None else "quantizing"
    target = "" if out is None else f" to '{out}'"
    threads = f" using {nthread} threads" if nthread > 0 else ""
    click.echo(f"{action} '{inp}'{target} as {ft.name}{threads}")
    progress = TensorProgress(click.echo, _input_mib(inp))
    try:
        summary = run_quantize(inp, out, ft.ftype, opts, log=progress)
    finally:
        progress.close()
    for line in describe(summary):
        click.echo(line)


def compare_files(a: str, b: str) -> list[tuple[str, str, str, float, float]]:
    """(name, type in A, type in B, RMSE, max abs error) of every tensor of A that B has, dequantized."""
    rows = []
    with gguf_io.open(a) as fa, gguf_io.open(b) as fb:
        for name, ta in fa.tensors.items():
            tb = fb.tensors.get(name)
            if tb is None:
                continue
            if ta.n_elements != tb.n_elements or ta.shape[0] != tb.shape[0]:
                raise _Fail(f"tensor {name}: shapes differ ({list(ta.shape)} vs {list(tb.shape)})")
            ne0 = ta.shape[0]
            nrows = ta.n_elements // ne0 if ne0 else 0
            slab = max(1, (1 << 22) // max(ne0, 1))
            sq, mx = 0.0, 0.0
            ra, rb = fa.tensor_bytes(name), fb.tensor_bytes(name)
            rowa, rowb = ta.nbytes // max(nrows, 1), tb.nbytes // max(nrows, 1)
            for r in range(0, nrows, slab):
                n = min(slab, nrows - r)
                xa = dequantize(ra[r * rowa : (r + n) * rowa], ta.ggml_type, (n, ne0)).astype(np.float64)
                xb = dequantize(rb[r * rowb : (r + n) * rowb], tb.ggml_type, (n, ne0)).astype(np.float64)
                d = xb - xa
                sq += float(np.sum(d * d))
                mx = max(mx, float(np.max(np.abs(d))) if d.size else 0.0)
            rmse = math.sqrt(sq / ta.n_elements) if ta.n_elements else 0.0
            rows.append((name, ta.ggml_type.name, tb.ggml_type.name, rmse, mx))
    return rows


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("a", type=click.Path(dir_okay=False))
@click.argument("b", type=click.Path(dir_okay=False))
def compare_command(a: str, b: str) -> None:
    """Per-tensor RMSE and max abs error of B against A, both dequantized to f32."""
    rows = compare_files(a, b)
    click.echo(f"{'tensor':<40s} {'A':>7s} {'B':>7s} {'rmse':>12s} {'max_abs':>12s}")
    for name, ta, tb, rmse, mx in rows:
        click.echo(f"{name:<40s} {ta:>7s} {tb:>7s} {rmse:12.6g} {mx:12.6g}")
    with gguf_io.open(a) as fa, gguf_io.open(b) as fb:
        missing = [n for n in fa.tensors if n not in fb.tensors]
        extra = [n for n in fb.tensors if n not in fa.tensors]
    if missing:
        click.echo(f"{len(missing)} tensor(s) of A missing from B: {', '.join(missing[:8])}")
    if extra:
        click.echo(f"{len(extra)} tensor(s) only in B: {', '.join(extra[:8])}")
    worst = max(rows, key=lambda r: r[3], default=None)
    if worst is not None:
        click.echo(f"compared {len(rows)} tensors; largest RMSE {worst[3]:.6g} ({worst[0]})")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns (and exits with) the status."""
    # Threads that wait sleep instead of spinning: llama-quant runs hundreds of short parallel loops, and
    # on a busy machine a spinning OpenMP barrier burns the core its partner thread needs (measured: 2-4x
    # slower wall time under load, nothing lost on an idle machine). Read when the OpenMP runtime loads,
    # i.e. at the first parallel kernel; the user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = list(sys.argv[1:] if argv is None else argv)
    command = compare_command if args[:1] == ["compare"] else quantize_command
    if command is compare_command:
        args = args[1:]
    prog = "llama-quant compare" if command is compare_command else "llama-quant"
    try:
        command.main(args, prog_name=prog, standalone_mode=False)
        status = 0
    except click.exceptions.Exit as e:  # --help
        status = e.exit_code
    except click.UsageError as e:
        click.echo(f"error: {e.format_message()}", err=True)
        if command is quantize_command:
            click.echo(_usage_text(), err=True)
        status = 1
    except (_Fail, QuantizeError, GGUFError) as e:
        if getattr(e, "banner", ""):
            click.echo(e.banner, err=True)  # type: ignore[union-attr]
        click.echo(f"error: {e}", err=True)
        status = 1
    except FileNotFoundError as e:
        click.echo(f"error: no such file: {e.filename}", err=True)
        status = 1
    except OSError as e:
        click.echo(f"error: {e.strerror or e}: {getattr(e, 'filename', '') or ''}".rstrip(": "), err=True)
        status = 1
    except click.Abort:
        click.echo("aborted", err=True)
        status = 1
    if argv is None:
        sys.exit(status)
    return status


if __name__ == "__main__":
    main()
