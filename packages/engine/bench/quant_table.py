"""The quantization table of docs/quantization.md: every file type llama-quant writes, for SmolLM2-135M, with
and without an importance matrix, measured by the project's own tools.

    nice -n 10 python packages/engine/bench/quant_table.py [--types Q4_K_M,IQ2_M] [--redo]

The base is the packaged Q4_1 SmolLM2 converted to F16 by llama-quant (as bench_speculative does). The
importance matrix comes from our llama-imatrix on the F16 model over a fixed calibration text; perplexity and
KL divergence from our llama-perplexity (``--kl-divergence`` against the F16 model's logits, saved once with
``--kl-divergence-base``) over another fixed text; decode tok/s from the engine (greedy, one stream). Both
texts are the docstrings of Python standard-library modules, so they are the same on every machine with the
same Python minor version. Each measurement is stored in ~/.cache/llama-py/quant-table/results.json as soon
as it is done and skipped on the next run (``--redo`` measures again), so an interrupted run resumes; after
each one the table in docs/quantization.md (between the ``quant-table`` markers) and the plot
docs/images/quantization-smollm2.png are rewritten from all results. Needs matplotlib (the engine's
``bench`` extra).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "quantization.md"
PNG = ROOT / "docs" / "images" / "quantization-smollm2.png"
WORK = Path.home() / ".cache" / "llama-py" / "quant-table"
sys.path.insert(0, str(Path(__file__).parent))

# the KLD run: chunks of N_CTX tokens, the second half of each scored (N_CHUNKS * (N_CTX/2 - 1) positions)
N_CTX, N_CHUNKS, N_BATCH = 256, 3, 512
IMATRIX_CHUNKS = 6
N_DECODE = 32
EVAL_MODULES = ("textwrap", "string", "json")
CALIBRATION_MODULES = ("functools", "itertools", "collections", "statistics")
# a spread of sizes first, so a short run already covers the range (aliases Q3_K/Q4_K/Q5_K and COPY left out)
TYPES = [
    *(
        "F16",
        "Q8_0",
        "Q6_K",
        "Q5_K_M",
        "Q4_K_M",
        "Q4_0",
        "IQ4_XS",
        "Q3_K_M",
        "IQ3_M",
        "Q2_K",
        "IQ2_M",
        "IQ1_M",
    ),
    *("Q5_K_S", "Q5_1", "Q5_0", "Q4_K_S", "Q4_1", "IQ4_NL", "Q3_K_L", "Q3_K_S", "IQ3_S", "IQ3_XS", "IQ3_XXS"),
    *(
        "Q2_K_S",
        "IQ2_S",
        "IQ2_XS",
        "IQ2_XXS",
        "IQ1_S",
        "TQ2_0",
        "TQ1_0",
        "Q2_0",
        "Q1_0",
        "MXFP4_MOE",
        "BF16",
        "F32",
    ),
]
MARK_START, MARK_END = "<!-- quant-table:start -->", "<!-- quant-table:end -->"


def docstring_text(modules: tuple[str, ...]) -> str:
    """The docstrings of the modules and their public members, in name order."""
    parts = []
    for name in modules:
        mod = __import__(name)
        parts.append(inspect.getdoc(mod) or "")
        for attr in sorted(a for a in dir(mod) if not a.startswith("_")):
            doc = inspect.getdoc(getattr(mod, attr))
            if doc and getattr(getattr(mod, attr), "__module__", name) == name:
                parts.append(f"{attr}\n{doc}")
    return "\n\n".join(parts) + "\n"


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    return str(exe) if exe.exists() else (shutil.which(name) or name)


def _run(cmd: list[str], timeout: float = 3600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _config_key() -> str:
    text = docstring_text(EVAL_MODULES) + docstring_text(CALIBRATION_MODULES)
    spec = f"{N_CTX}/{N_CHUNKS}/{N_BATCH}/{IMATRIX_CHUNKS}/{N_DECODE}/{sys.version_info[:2]}"
    return hashlib.sha256((spec + text).encode()).hexdigest()[:16]


def prepare() -> dict[str, Path]:
    """The F16 base, the texts, the imatrix and the base logits (each made once)."""
    from bench_speculative import smollm2_f16

    WORK.mkdir(parents=True, exist_ok=True)
    f16 = smollm2_f16()
    paths = {"f16": f16, "eval": WORK / "eval.txt", "cal": WORK / "calibration.txt"}
    paths["eval"].write_text(docstring_text(EVAL_MODULES))
    paths["cal"].write_text(docstring_text(CALIBRATION_MODULES))
    paths["imatrix"] = WORK / "imatrix.gguf"
    if not paths["imatrix"].exists():
        print("collecting the importance matrix (llama-imatrix, F16)", flush=True)
        r = _run([_tool("llama-imatrix"), "-m", str(f16), "-f", str(paths["cal"]), "-o", str(paths["imatrix"]),
                  "-c", str(N_CTX), "-b", str(N_BATCH), "--chunks", str(IMATRIX_CHUNKS)])  # fmt: skip
        if r.returncode:
            sys.exit(f"llama-imatrix failed:\n{r.stderr[-3000:]}")
    paths["base"] = WORK / "f16-logits.bin"
    if not paths["base"].exists():
        print("saving the F16 logits (llama-perplexity --kl-divergence-base)", flush=True)
        tmp = paths["base"].with_suffix(".tmp")
        r = _run([_tool("llama-perplexity"), "-m", str(f16), "-f", str(paths["eval"]), "-c", str(N_CTX),
                  "-b", str(N_BATCH), "--chunks", str(N_CHUNKS), "--kl-divergence-base", str(tmp)])  # fmt: skip
        if r.returncode:
            sys.exit(f"llama-perplexity failed:\n{r.stderr[-3000:]}")
        tmp.rename(paths["base"])
    return paths


def quantize(paths: dict[str, Path], qtype: str, imatrix: bool) -> tuple[Path | None, dict]:
    """The quantized file (None when llama-quant refuses) and its size figures."""
    out = WORK / f"{qtype}{'-imatrix' if imatrix else ''}.gguf"
    cmd = [_tool("llama-quant"), "--allow-requantize"]
    if imatrix:
        cmd += ["--imatrix", str(paths["imatrix"])]
    t = time.perf_counter()
    r = _run([*cmd, str(paths["f16"]), str(out), qtype])
    secs = time.perf_counter() - t
    text = r.stdout + r.stderr
    if r.returncode:
        out.unlink(missing_ok=True)
        refused = "requires an importance matrix" in text or "requires an imatrix" in text
        return None, {"error": "needs an imatrix" if refused else text.strip().splitlines()[-1][:200]}
    m = re.search(r"quant size\s*=\s*([0-9.]+) MiB \(([0-9.]+) BPW\)", text)
    assert m, text[-2000:]
    digest = _tensor_digest(out)
    return out, {"mib": float(m.group(1)), "bpw": float(m.group(2)), "quant_s": secs, "sha256": digest}


def _tensor_digest(path: Path) -> str:
    """SHA-256 of the tensor data (the metadata names the imatrix file, so it differs even when the
    matrix changed nothing)."""
    import gguf_io

    with gguf_io.open(path) as f:
        offset = f.data_offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        return hashlib.file_digest(fh, "sha256").hexdigest()


def kld(paths: dict[str, Path], model: Path) -> dict:
    """PPL(Q), PPL(base), mean KLD, 99% KLD and same-top-token rate from llama-perplexity's report."""
    r = _run([_tool("llama-perplexity"), "-m", str(model), "--kl-divergence", "--kl-divergence-base",
              str(paths["base"]), "-c", str(N_CTX), "-b", str(N_BATCH)])  # fmt: skip
    if r.returncode:
        return {"error": r.stderr.strip().splitlines()[-1][:200]}
    out = r.stdout

    def grab(label: str) -> float:
        found = re.search(re.escape(label) + r"\s*:\s*(-?[0-9.]+)", out)
        assert found, out[-3000:]
        return float(found.group(1))

    return {
        "ppl": grab("Mean PPL(Q)"),
        "ppl_base": grab("Mean PPL(base)"),
        "kld": grab("Mean    KLD"),
        "kld99": grab("99.0%   KLD"),
        "same_top": grab("Same top p"),
    }


def decode_speed(model: str) -> float:
    """Greedy single-stream decode tok/s (the engine's timings, best of two after a warm-up)."""
    from llama_engine import LLM

    prompt = docstring_text(EVAL_MODULES)[:400]
    with LLM(model, n_ctx=512, n_parallel=1, n_batch=512) as llm:
        list(llm.generate(prompt, max_tokens=8, temperature=0.0, ignore_eos=True))
        best = 0.0
        for _ in range(2):
            list(llm.generate(prompt, max_tokens=N_DECODE, temperature=0.0, ignore_eos=True))
            assert llm.last is not None
            best = max(best, llm.last.timings.predicted_n / (llm.last.timings.predicted_ms / 1e3))
    return best


def measure(paths: dict[str, Path], qtype: str, imatrix: bool, done: dict[str, dict]) -> dict:
    """One row: quantize, and (unless the bytes equal an already measured file) PPL/KLD and decode speed."""
    if qtype == "F16":
        model: Path | None = paths["f16"]
        row: dict = {"mib": round(os.path.getsize(paths["f16"]) / 2**20, 2), "bpw": 16.0}
    else:
        model, row = quantize(paths, qtype, imatrix)
    if model is None:
        return row
    twin = next((v for v in done.values() if row.get("sha256") and v.get("sha256") == row["sha256"]), None)
    if twin is not None:  # llama-quant ignored the imatrix for this type: the same file
        row |= {k: twin[k] for k in ("ppl", "ppl_base", "kld", "kld99", "same_top", "tok_s") if k in twin}
        row["same_as_other"] = True
    else:
        row |= kld(paths, model)
        r = _run([sys.executable, __file__, "--decode", str(model)])
        row["tok_s"] = float(r.stdout.split()[-1]) if r.returncode == 0 else None
    if model != paths["f16"]:
        model.unlink(missing_ok=True)
    return row


def _cell(row: dict) -> list[str]:
    if "error" in row:
        return ["refused: " + row["error"]] + [""] * 6
    return [
        f"{row['mib']:.1f}" if row.get("mib") else "",
        f"{row['bpw']:.2f}",
        f"{row['ppl']:.4f}" if "ppl" in row else "",
        f"{row['kld']:.6f}" if "kld" in row else "",
        f"{row['kld99']:.4f}" if "kld99" in row else "",
        f"{row['same_top']:.2f}" if "same_top" in row else "",
        f"{row['tok_s']:.1f}" if row.get("tok_s") else "",
    ]


def table(results: dict[str, dict], meta: dict) -> str:
    """The markdown block written between the markers."""
    head = ["file type", "imatrix", "size MiB", "bits/weight", "PPL", "mean KLD", "KLD 99%", "same top %",
            "decode tok/s"]  # fmt: skip
    lines = [MARK_START, "", "| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for t in TYPES:
        for im in (False, True):
            row = results.get(f"{t}/{int(im)}")
            if row is None or (t == "F16" and im):
                continue
            note = "yes" if im else "no"
            if row.get("same_as_other"):
                note += " (same file)"
            lines.append("| " + " | ".join([t, note, *_cell(row)]) + " |")
    lines += ["", f"Measured {meta['when']} on {meta['host']}; {meta['note']}", "", MARK_END]
    return "\n".join(lines)


def plot(results: dict[str, dict]) -> None:
    """Mean KLD against bits per weight, with and without the imatrix (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for im, style, label in ((False, "o", "without imatrix"), (True, "s", "with imatrix")):
        pts = [(r["bpw"], r["kld"], k.split("/")[0]) for k, r in results.items()
               if k.endswith(f"/{int(im)}") and r.get("kld", 0) > 0 and r["bpw"] < 9]  # fmt: skip
        if not pts:
            continue
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label, alpha=0.8)
        for x, y, name in pts:
            ax.annotate(name, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    ax.set_xlim(right=9)  # the 16- and 32-bit files sit far right with KLD near 0: left off
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight")
    ax.set_ylabel("mean KL divergence to F16 (log)")
    ax.set_title(f"SmolLM2-135M: quantization cost ({N_CHUNKS} chunks of {N_CTX} tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    PNG.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(PNG)
    plt.close(fig)


def write_doc(results: dict[str, dict], meta: dict) -> None:
    """Replace the block between the markers in docs/quantization.md (appended when missing)."""
    text = DOC.read_text()
    block = table(results, meta)
    if MARK_START in text:
        text = text[: text.index(MARK_START)] + block + text[text.index(MARK_END) + len(MARK_END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOC.write_text(text)
    plot(results)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default="", help="comma-separated file types (default: all)")
    ap.add_argument("--redo", action="store_true", help="measure again what is stored")
    ap.add_argument("--decode", default="", help=argparse.SUPPRESS)  # the decode measurement, in a child
    args = ap.parse_args()
    if args.decode:
        print(f"{decode_speed(args.decode):.2f}")
        return
    store = WORK / "results.json"
    key = _config_key()
    saved = json.loads(store.read_text()) if store.exists() else {}
    results: dict[str, dict] = saved.get("results", {}) if saved.get("key") == key and not args.redo else {}
    paths = prepare()
    load = os.getloadavg()[0]
    meta = {
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
        "host": f"{_cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.machine()}",
        "note": f"load average about {load:.0f} when the run started (shared machine: tok/s are rough).",
    }
    types = [t for t in TYPES if not args.types or t in args.types.split(",")]
    for t in types:
        for im in (False, True) if t != "F16" else (False,):
            k = f"{t}/{int(im)}"
            if k in results:
                continue
            t0 = time.perf_counter()
            row = measure(paths, t, im, results)
            print(f"{k}: {row} ({time.perf_counter() - t0:.0f} s)", flush=True)
            if row.get("error", "needs an imatrix") != "needs an imatrix" or row.get("tok_s", 0) is None:
                continue  # a failure, not a result: measured again on the next run
            results[k] = row
            store.write_text(json.dumps({"key": key, "results": results}, indent=1))
            write_doc(results, meta)
    write_doc(results, meta)


if __name__ == "__main__":
    main()
