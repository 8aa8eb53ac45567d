"""The catalogue: every model the router can start, by name, merged from the download cache,
`--models-dir` and `--models-preset` (router.md §2, §3).

Precedence for an entry's options: the router's command line > its preset section > the preset's `[*]` >
what its source implies (cache `hf-repo`, models-dir paths).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from llama_tools.hub.cache import list_cached, resolve_cached

from . import options as opts
from .cluster import ClusterError, ClusterSpec, parse_cluster
from .keep_alive import KeepAliveError, parse_keep_alive
from .preset import PresetError, canonical_name, parse_ini, render_ini

__all__ = ["CatalogueError", "Entry", "build_catalogue", "parse_keys", "read_key_file", "scan_models_dir"]

log = logging.getLogger("llama_router")

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")
# never passed from a preset (router.md §5.2); the command line additionally keeps CLI_RESERVED for itself
RESERVED = frozenset(
    {"ssl-key-file", "ssl-cert-file", "api-key", "api-key-file", "models-dir", "models-max", "models-preset",
     "models-autoload", "host", "port"}
)  # fmt: skip
CLI_RESERVED = RESERVED | {"model", "mmproj", "alias", "hf-repo", "log-file", "tags"}
DEFAULT_STOP_TIMEOUT = 10.0
REMOTE_KEY_OPTIONS = frozenset({"remote-api-key", "remote-api-key-file"})
_HEADER_SAFE = re.compile(r"[\x21-\x7e]*")  # printable ASCII without space: a token in one header line


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
    pinned: bool = False  # `pin = true`: never unloaded by keep-alive nor evicted (llama_router.keep_alive)
    keep_alive: float | None = None  # `keep-alive`: this model's default (None: the router's)
    dedup: bool = False
    hidden: bool = False
    remote: tuple[str, ...] = ()  # URLs of remote llama-servers serving this model (no local child)
    remote_keys: tuple[str, ...] = field(default=(), repr=False)  # () or one API key per `remote` URL
    cluster: ClusterSpec | None = None  # replicas on a Ray cluster (`replicas`, `min-replicas`, ...)

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
        return (tuple(sorted(self.options.items())), self.remote, self.remote_keys, self.cluster)

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


def parse_keys(value: str) -> tuple[str, ...]:
    """A comma list of API keys, in order; an empty item stands for no key at its place."""
    return tuple(k.strip() for k in value.split(","))


def read_key_file(path: str) -> tuple[str, ...]:
    """API keys from a file, one per line (blank lines and `#` comments skipped), as `--api-key-file`.
    Raises CatalogueError naming the file, never its content."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise CatalogueError(f"cannot read API key file {path}: {reason}") from None
    lines = (line.strip() for line in text.splitlines())
    return tuple(line for line in lines if line and not line.startswith("#"))


def build_catalogue(
    models_dir: str | None,
    preset_path: str | None,
    cli: dict[str, str],
    *,
    startup: bool = True,
    remote_keys: tuple[str, ...] = (),
) -> dict[str, Entry]:
    """The merged catalogue, keyed by name. `remote_keys` are the API keys of remote entries that name
    none (one for every replica, or one per URL). Raises CatalogueError on any problem."""
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
        o, own = _section(name, raw)
        inherited = glob_special
        if REMOTE_KEY_OPTIONS & own.keys():  # the section's key (inline or file) replaces `[*]`'s
            inherited = {k: v for k, v in glob_special.items() if k not in REMOTE_KEY_OPTIONS}
        special = {**inherited, **own}
        entry = entries.get(name) or Entry(name, "preset", dict(glob_opts))
        entry.options.update(o)
        entry.source = "preset"
        _apply_special(entry, special, startup)
        if REMOTE_KEY_OPTIONS & own.keys() and not entry.remote:
            raise CatalogueError(f"preset '{name}': remote-api-key(-file) is only for an entry with remote")
        entry.remote_keys = _remote_keys(name, entry.remote, special, remote_keys)
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
    entry.pinned = opts.parse_bool(special.get("pin", "false")) is True
    try:
        entry.keep_alive = parse_keep_alive(special["keep-alive"]) if "keep-alive" in special else None
    except KeepAliveError as e:
        raise CatalogueError(f"[{entry.name}] keep-alive: {e}") from None
    entry.remote = _split_list(special.get("remote"))
    try:
        entry.cluster = parse_cluster(entry.name, special)
    except ClusterError as e:
        raise CatalogueError(str(e)) from None
    if entry.cluster and entry.remote:
        raise CatalogueError(f"preset '{entry.name}': remote URLs and Ray replicas are two ways; give one")


def _remote_keys(
    name: str, remote: tuple[str, ...], special: dict[str, str], default: tuple[str, ...]
) -> tuple[str, ...]:
    """An entry's replica keys, one per URL (or none at all). Messages never quote a key."""
    inline, path = special.get("remote-api-key"), special.get("remote-api-key-file")
    if inline is not None and path is not None:
        raise CatalogueError(f"preset '{name}': give remote-api-key or remote-api-key-file, not both")
    if not remote:
        return ()
    keys = read_key_file(path) if path is not None else parse_keys(inline) if inline is not None else default
    if not any(keys):
        return ()
    if not all(_HEADER_SAFE.fullmatch(k) for k in keys):
        raise CatalogueError(
            f"preset '{name}': a remote API key holds spaces or characters not allowed in a header"
        )
    if len(keys) == 1:
        return keys * len(remote)
    if len(keys) != len(remote):
        raise CatalogueError(
            f"preset '{name}': {len(keys)} remote API keys for {len(remote)} remote URLs "
            "(give one key for every replica, or one per URL in the same order)"
        )
    return keys


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
