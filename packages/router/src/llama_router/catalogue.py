"""The catalogue: every model the router can start, by name, merged from the download cache,
`--models-dir` and `--models-preset` (router.md §2, §3).

Precedence for an entry's options: the router's command line > its preset section > the preset's `[*]` >
what its source implies (cache `hf-repo`, models-dir paths).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from llama_tools.hub.cache import list_cached, resolve_cached

from . import options as opts
from .preset import PresetError, canonical_name, parse_ini, render_ini

__all__ = ["CatalogueError", "Entry", "build_catalogue", "scan_models_dir"]

log = logging.getLogger("llama_router")

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
# never passed from a preset (router.md §5.2); the command line additionally keeps CLI_RESERVED for itself
RESERVED = frozenset(
    {"ssl-key-file", "ssl-cert-file", "api-key", "api-key-file", "models-dir", "models-max", "models-preset",
     "models-autoload", "host", "port"}
)  # fmt: skip
CLI_RESERVED = RESERVED | {"model", "mmproj", "alias", "hf-repo", "log-file", "tags"}
DEFAULT_STOP_TIMEOUT = 10.0


class CatalogueError(ValueError):
    """A catalogue that cannot be built (bad preset, name collision, missing models-dir)."""


@dataclass(slots=True)
class Entry:
    """One model: its routing name, where it came from, and the options its child is started with."""

    name: str
    source: str  # cache | models_dir | preset
    options: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float = DEFAULT_STOP_TIMEOUT
    dedup: bool = False
    hidden: bool = False
    remote: tuple[str, ...] = ()  # URLs of remote llama-servers serving this model (no local child)

    def child_args(self) -> list[str]:
        """The child's option arguments (no host/port/alias: the spawner adds those). A cached `hf-repo`
        is passed as its local file, so the child needs no network."""
        o = dict(self.options)
        if "hf-repo" in o and "model" not in o:
            cached = resolve_cached(o["hf-repo"])
            if cached is not None:
                del o["hf-repo"]
                o = {"model": str(cached.path), **o}
        return opts.render(o)

    def preset_text(self) -> str:
        return render_ini(self.name, self.options)

    def identity(self) -> tuple[object, ...]:
        """What a reload compares to decide whether a running child must restart."""
        return (tuple(sorted(self.options.items())), self.remote)

    def modalities(self) -> list[str]:
        """Input modalities known offline: a projector file means images."""
        return ["text", "image"] if self.options.get("mmproj") else ["text"]


def scan_models_dir(path: str) -> dict[str, dict[str, str]]:
    """`--models-dir` entries: top-level `*.gguf` files and sub-directories holding a model (§2.2)."""
    root = Path(path).expanduser().absolute()
    if not root.is_dir():
        raise CatalogueError(f"models directory does not exist or is not a directory: {path}")
    found: dict[str, dict[str, str]] = {}
    for item in sorted(root.iterdir()):
        name = item.name
        if item.is_file() and name.endswith(".gguf"):
            if "mmproj" in name or name.startswith(DRAFT_PREFIXES):
                continue
            found[name[:-5]] = {"model": str(item)}
        elif item.is_dir():
            o = _scan_subdir(item)
            if o:
                found[name] = o
    return found


def _scan_subdir(folder: Path) -> dict[str, str]:
    model = first_shard = mmproj = draft = None
    for f in sorted(folder.iterdir()):
        if not (f.is_file() and f.name.endswith(".gguf")):
            continue
        if "mmproj" in f.name:
            mmproj = mmproj or f
        elif f.name.startswith(DRAFT_PREFIXES):
            draft = draft or f
        elif "-00001-of-" in f.name:
            first_shard = first_shard or f
        else:
            model = model or f
    chosen = first_shard or model
    if chosen is None:
        return {}
    o = {"model": str(chosen)}
    if mmproj:
        o["mmproj"] = str(mmproj)
    if draft:
        o["spec-draft-model"] = str(draft)
    return o


def _section(name: str, raw: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(child options, preset-only keys) of one section, option keys canonicalised."""
    options: dict[str, str] = {}
    special: dict[str, str] = {}
    for key, value in raw.items():
        if key in opts.PRESET_ONLY:
            special[key] = value
            continue
        try:
            k, v = opts.canonical(key, value)
        except opts.UnknownOption:
            raise CatalogueError(f"option '{key}' not recognized in preset '{name}'") from None
        except ValueError as e:
            raise CatalogueError(f"{e} in preset '{name}'") from None
        if k in RESERVED:
            log.warning("preset '%s': option '%s' is reserved for the router and ignored", name, key)
            continue
        if k in ("model", "mmproj", "model-draft", "spec-draft-model", "slot-save-path", "chat-template-file", "grammar-file",
                 "json-schema-file"):  # fmt: skip
            v = str(Path(v).expanduser().absolute())  # relative to the router's working directory
        options[k] = v
    return options, special


def _split_list(value: str | None) -> tuple[str, ...]:
    return tuple(s.strip() for s in (value or "").split(",") if s.strip())


def build_catalogue(
    models_dir: str | None, preset_path: str | None, cli: dict[str, str], *, startup: bool = True
) -> dict[str, Entry]:
    """The merged catalogue, keyed by name. Raises CatalogueError on any problem."""
    sections: dict[str, dict[str, str]] = {}
    if preset_path:
        try:
            text = Path(preset_path).read_text(encoding="utf-8")
        except OSError as e:
            raise CatalogueError(f"cannot read preset file {preset_path}: {e}") from None
        try:
            sections = parse_ini(text, preset_path)
        except PresetError as e:
            raise CatalogueError(str(e)) from None
    glob_opts, glob_special = _section("*", sections.pop("*", {}))
    entries: dict[str, Entry] = {}
    for cached in list_cached():
        source = {"hf-repo": cached.name} if cached.repo else {"model": str(cached.path)}  # a URL download
        entries[cached.name] = Entry(cached.name, "cache", {**glob_opts, **source})
    if models_dir:
        for name, o in scan_models_dir(models_dir).items():
            entries[name] = Entry(name, "models_dir", {**glob_opts, **o})
    for raw_name, raw in sections.items():
        name = canonical_name(raw_name)
        o, special = _section(name, raw)
        special = {**glob_special, **special}
        entry = entries.get(name) or Entry(name, "preset", dict(glob_opts))
        entry.options.update(o)
        entry.source = "preset"
        _apply_special(entry, special, startup)
        if not ({"model", "hf-repo"} & entry.options.keys()) and not entry.remote:
            raise CatalogueError(f"preset '{name}' has no model source (model, hf-repo or remote)")
        entries[name] = entry
    if glob_special.get("dedup-cache-models"):
        for item in entries.values():
            if item.source != "preset":
                item.dedup = item.dedup or opts.parse_bool(glob_special["dedup-cache-models"]) is True
    for item in entries.values():
        item.aliases = _split_list(item.options.pop("alias", None))
        item.tags = _split_list(item.options.pop("tags", None))
        for k, v in cli.items():
            if k not in CLI_RESERVED:
                item.options[k] = v
    _hide_dedup(entries)
    _check_names(entries)
    return entries


def _apply_special(entry: Entry, special: dict[str, str], startup: bool) -> None:
    entry.load_on_startup = startup and opts.parse_bool(special.get("load-on-startup", "false")) is True
    try:
        entry.stop_timeout = float(special.get("stop-timeout", DEFAULT_STOP_TIMEOUT))
    except ValueError:
        entry.stop_timeout = DEFAULT_STOP_TIMEOUT
    if entry.stop_timeout < 0:
        entry.stop_timeout = DEFAULT_STOP_TIMEOUT
    entry.dedup = opts.parse_bool(special.get("dedup-cache-models", "false")) is True
    entry.remote = _split_list(special.get("remote"))


def _hide_dedup(entries: dict[str, Entry]) -> None:
    """A preset with `dedup-cache-models` hides the cache entries resolving to its hf-repo/draft files."""
    for e in list(entries.values()):
        if e.source != "preset" or not e.dedup:
            continue
        for key in ("hf-repo", "hf-repo-draft"):
            spec = e.options.get(key)
            if not spec:
                continue
            try:
                cached = resolve_cached(spec)
            except ValueError:
                continue
            if cached is not None and cached.name in entries and entries[cached.name].source == "cache":
                entries[cached.name].hidden = True


def _check_names(entries: dict[str, Entry]) -> None:
    seen: dict[str, str] = {}
    for e in entries.values():
        for n in (e.name, *e.aliases):
            if n in seen and seen[n] != e.name:
                raise CatalogueError(f"model name or alias '{n}' is used by both '{seen[n]}' and '{e.name}'")
            seen[n] = e.name
