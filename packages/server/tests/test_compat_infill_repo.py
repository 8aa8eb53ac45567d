"""/infill's extra context as llama-server's format_infill lays it out (endpoints.md §15): the repo form
`<FIM_REP>myproject\\n<FIM_SEP>{filename}\\n{text}...<FIM_SEP>filename\\n` when the model has those tokens,
snippet separators when it has not, and the extra context cut to `n_ctx - n_batch - 2 * n_predict` tokens.
Tiny byte-level models whose FIM tokens are the control bytes 1-5, so the echoed `prompt` shows each one."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import start_server, stop_server

from gguf_io import GGUFValueType

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "engine" / "tests"))
from tiny_models import write_tiny_model

PRE, SUF, MID, REP, SEP = "\x01", "\x02", "\x03", "\x04", "\x05"
EXTRA = [{"filename": "a.py", "text": "x = 1\n"}, {"text": "y"}]


def _fim_model(path: Path, repo: bool) -> Path:
    ids = {"pre": 1, "suf": 2, "mid": 3, **({"rep": 4, "sep": 5} if repo else {})}

    def extra(w, rng) -> None:
        for k, v in ids.items():
            w.add_metadata(f"tokenizer.ggml.fim_{k}_token_id", v, GGUFValueType.UINT32)

    return write_tiny_model(path, "llama", extra=extra)


def _server(tmp: Path, repo: bool, *args: str) -> Iterator[httpx.Client]:
    model = _fim_model(tmp / "fim.gguf", repo)
    s = start_server(tmp, "-m", str(model), "-c", "512", "-np", "1", *args)
    with s.client() as c:
        yield c
    stop_server(s)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from _server(tmp_path_factory.mktemp("fim-repo"), True, "-b", "64")


@pytest.fixture(scope="module")
def snippets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    yield from _server(tmp_path_factory.mktemp("fim-snip"), False, "-b", "64")


def _prompt(c: httpx.Client, **body) -> dict:
    r = c.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")", "n_predict": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_repo_form_names_each_file(repo: httpx.Client) -> None:
    body = _prompt(repo, input_extra=EXTRA)
    extra = f"{REP}myproject\n{SEP}a.py\nx = 1\n{SEP}tmp\ny{SEP}filename\n"
    assert body["prompt"] == f"{extra}{PRE}def f({SUF}){MID}"
    assert body["tokens_evaluated"] == len(body["prompt"].encode())  # one token per byte, no BOS


def test_repo_form_without_extra_still_names_the_project(repo: httpx.Client) -> None:
    body = _prompt(repo, prompt="x")
    assert body["prompt"] == f"{REP}myproject\n{SEP}filename\n{PRE}def f(x{SUF}){MID}"


def test_extra_context_keeps_its_last_tokens(repo: httpx.Client) -> None:
    """The slot's n_ctx (256: -c 512 is capped at the model's training context) - n_batch 64
    - 2 * n_predict (-1 on the server) = 194 tokens of extra context, as llama-server cuts it."""
    body = _prompt(repo, input_extra=[{"filename": "big.txt", "text": "z" * 600}])
    extra = body["prompt"][: body["prompt"].index(PRE)]
    assert len(extra.encode()) == 194 and extra == ("z" * 600 + f"{SEP}filename\n")[-194:]


def test_snippet_form_without_repo_tokens(snippets: httpx.Client) -> None:
    body = _prompt(snippets, input_extra=EXTRA)
    sep = "\n\n--- snippet ---\n\n"
    assert body["prompt"] == f"{sep}x = 1\n{sep}y{PRE}def f({SUF}){MID}"
