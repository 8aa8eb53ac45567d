"""The catalogue without processes: INI syntax, models-dir layout, cache entries, precedence, aliases."""

from __future__ import annotations

from pathlib import Path

import pytest
from llama_tools.hub import list_cached, remove_cached, resolve_cached

from llama_router.catalogue import CatalogueError, build_catalogue, scan_models_dir
from llama_router.cli import parse_child_options
from llama_router.options import render
from llama_router.preset import PresetError, canonical_name, parse_ini


def test_ini_syntax() -> None:
    text = "version = 1\r\n; comment\n[*]\nc = 8192 ; trailing\n\n[a:q4_k_m]\r# x\njinja = true # y\nk=v;notcomment\n"
    s = parse_ini(text)
    assert "default" not in s
    assert s["*"] == {"c": "8192"}
    assert s["a:q4_k_m"] == {"jinja": "true", "k": "v;notcomment"}
    assert parse_ini("c = 1\n[x]\nm = 2\n")["default"] == {"c": "1"}
    for bad in ("[broken\n", "novalue\n", "9key = 1\n"):
        with pytest.raises(PresetError):
            parse_ini(bad)


def test_tag_canonicalisation() -> None:
    assert canonical_name("repo/x:q4_k_m") == "repo/x:Q4_K_M"
    assert canonical_name("repo/x:model-q8_0") == "repo/x:Q8_0"
    assert canonical_name("plain") == "plain"


def test_models_dir_layout(tmp_path: Path) -> None:
    (tmp_path / "top.gguf").write_bytes(b"x")
    (tmp_path / "top-mmproj.gguf").write_bytes(b"x")
    (tmp_path / "mtp-draft.gguf").write_bytes(b"x")
    sub = tmp_path / "multi"
    sub.mkdir()
    for f in ("m-00002-of-00002.gguf", "m-00001-of-00002.gguf", "mmproj-f16.gguf", "mtp-d.gguf", "notes.txt"):
        (sub / f).write_bytes(b"x")
    (tmp_path / "empty").mkdir()
    found = scan_models_dir(str(tmp_path))
    assert set(found) == {"top", "multi"}
    assert found["multi"]["model"].endswith("m-00001-of-00002.gguf")
    assert found["multi"]["mmproj"].endswith("mmproj-f16.gguf")
    assert found["multi"]["spec-draft-model"].endswith("mtp-d.gguf")
    with pytest.raises(CatalogueError):
        scan_models_dir(str(tmp_path / "missing"))


def _cache(root: Path, repo: str, files: list[str]) -> None:
    snap = root / ("models--" + repo.replace("/", "--")) / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for f in files:
        (snap / f).write_bytes(b"x")


def test_cache_entries_and_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    _cache(cache, "org/tiny-GGUF", ["tiny-Q8_0.gguf", "tiny-F16.gguf", "mmproj-tiny.gguf"])
    assert [m.name for m in list_cached()] == ["org/tiny-GGUF:F16", "org/tiny-GGUF:Q8_0"]
    hit = resolve_cached("org/tiny-GGUF:q8_0")
    assert hit is not None and hit.path.name == "tiny-Q8_0.gguf" and hit.mmproj is not None
    preset = tmp_path / "p.ini"
    preset.write_text(
        "[*]\nc = 100\nn-gpu-layers = 8\n"
        "[org/tiny-GGUF:q8_0]\nc = 200\nno-jinja = false\nload-on-startup = true\nstop-timeout = x\nalias = t8, tee\n"
        "tags = small\n[custom]\nmodel = rel.gguf\nLLAMA_ARG_CACHE_RAM = 0\napi-key = leaked\n"
    )
    cat = build_catalogue(
        None, str(preset), parse_child_options(["-c", "300", "--temp", "0.5", "--no-slots"])
    )
    e = cat["org/tiny-GGUF:Q8_0"]
    assert e.source == "preset" and e.aliases == ("t8", "tee") and e.tags == ("small",)
    assert e.options["ctx-size"] == "300"  # the command line wins over the section and [*]
    assert e.options["jinja"] == "true"  # `no-jinja = false` means jinja on
    assert e.options["hf-repo"] == "org/tiny-GGUF:Q8_0" and e.load_on_startup and e.stop_timeout == 10
    assert (
        cat["org/tiny-GGUF:F16"].source == "cache" and cat["org/tiny-GGUF:F16"].options["gpu-layers"] == "8"
    )
    custom = cat["custom"]
    assert Path(custom.options["model"]).is_absolute() and "api-key" not in custom.options
    args = e.child_args()
    assert (
        args[:2] == ["--model", str(hit.path)]
        and "--no-slots" in args
        and "load-on-startup" not in " ".join(args)
    )
    assert render({"jinja": "false", "swa-full": "false"}) == ["--no-jinja"]
    assert remove_cached("org/tiny-GGUF:F16") and [m.name for m in list_cached()] == ["org/tiny-GGUF:Q8_0"]


def test_preset_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "none"))
    p = tmp_path / "p.ini"
    p.write_text("[m]\nmodel = /x.gguf\nnot-an-option = 1\n")
    with pytest.raises(CatalogueError, match="option 'not-an-option' not recognized in preset 'm'"):
        build_catalogue(None, str(p), {})
    p.write_text("[m]\nctx-size = 1\n")
    with pytest.raises(CatalogueError, match="no model source"):
        build_catalogue(None, str(p), {})
    p.write_text("[m]\nmodel = /x.gguf\nalias = n\n[n]\nmodel = /y.gguf\n")
    with pytest.raises(CatalogueError, match="'n'"):
        build_catalogue(None, str(p), {})


def test_dedup_hides_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    _cache(cache, "org/a", ["a-Q8_0.gguf"])
    _cache(cache, "org/b", ["b-Q4_K_M.gguf"])
    p = tmp_path / "p.ini"
    p.write_text("[*]\ndedup-cache-models = 1\n[mine]\nhf-repo = org/a\n")
    cat = build_catalogue(None, str(p), {})
    assert cat["org/a:Q8_0"].hidden and not cat["org/b:Q4_K_M"].hidden and not cat["mine"].hidden


def test_router_options_cover_the_server() -> None:
    """Every option of llama-server is known to the router, with the same value/flag kind."""
    import llama_server.cli as server_cli  # the router tests run with the server installed (they start it)
    from llama_router.options import lookup

    for p in server_cli.main.params:
        for name in (*p.opts, *p.secondary_opts):
            opt, _ = lookup(name)
            assert opt.value == (not p.is_flag), name


def test_single_dash_options_keep_their_meaning() -> None:
    """`-hf`, `-no-kvu`, `-ctv` are not clusters of `-h`/`-v` flags; values that look like options stay."""
    from llama_router.cli import long_form_args

    got = long_form_args(
        ["-no-kvu", "-np", "4", "-hf", "a/b:q", "-ctv", "f16", "-n", "-10", "-to", "5", "-c=3"]
    )
    assert got == ["--no-kv-unified", "--parallel", "4", "--hf-repo", "a/b:q", "--cache-type-v", "f16",
                   "-n", "-10", "--timeout", "5", "--ctx-size=3"]  # fmt: skip
    assert long_form_args(["--alias", "-np", "-v"]) == ["--alias", "-np", "-v"]
