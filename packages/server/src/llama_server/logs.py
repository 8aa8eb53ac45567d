"""Logging set up from llama-server's `--log-*` flags.

`--log-disable` silences everything; `-lv N` picks the level (0-1 errors, 2 warnings, 3 info, 4 and more
or `-v` debug); `--log-file` also writes to a file; `--log-jsonl` writes JSON lines; `--log-timestamps`
starts each line with its time; `--no-log-prefix` drops the level and logger name before the message;
`--log-colors on|off|auto` colours the level name (auto: when stderr is a terminal).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import click

__all__ = ["log_options", "setup_logging"]

_COLOURS = {"DEBUG": "36", "INFO": "32", "WARNING": "33", "ERROR": "31", "CRITICAL": "31;1"}
_ON = ("on", "enabled", "true", "1")
_OFF = ("off", "disabled", "false", "0")


def log_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """`--log-colors`, `--log-prefix/--no-log-prefix`, `--log-timestamps/--no-log-timestamps`."""
    options = [
        click.option("--log-colors", default="auto", envvar="LLAMA_LOG_COLORS", help="on, off or auto."),
        click.option("--log-prefix/--no-log-prefix", default=True, envvar="LLAMA_LOG_PREFIX"),
        click.option("--log-timestamps/--no-log-timestamps", default=False, envvar="LLAMA_LOG_TIMESTAMPS"),
    ]
    for option in reversed(options):
        f = option(f)
    return f


class _Coloured(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        code = _COLOURS.get(record.levelname)
        if code is None:
            return super().format(record)
        plain = record.levelname
        record.levelname = f"\x1b[{code}m{plain}\x1b[0m"
        try:
            return super().format(record)
        finally:
            record.levelname = plain


def _colours(value: str) -> bool:
    v = value.strip().lower()
    if v in _ON:
        return True
    if v in _OFF:
        return False
    if v != "auto":
        raise click.BadParameter(f"unknown value for --log-colors: '{value}'", param_hint="--log-colors")
    return sys.stderr.isatty()


def _format(kw: dict[str, Any]) -> str:
    if kw["log_jsonl"]:
        time = '"time":"%(asctime)s",' if kw["log_timestamps"] else ""
        return "{" + time + '"level":"%(levelname)s","msg":"%(message)s"}'
    fmt = "%(levelname)s %(name)s: %(message)s" if kw["log_prefix"] else "%(message)s"
    return ("%(asctime)s " + fmt) if kw["log_timestamps"] else fmt


def setup_logging(kw: dict[str, Any]) -> str:
    """Configure the root logger from the parsed flags; returns the level's name (for uvicorn)."""
    if kw["log_disable"]:
        logging.disable(logging.CRITICAL)
        return "critical"
    level = logging.DEBUG if kw["verbose"] or kw["verbosity"] >= 4 else logging.INFO
    if kw["verbosity"] <= 1:
        level = logging.ERROR
    elif kw["verbosity"] == 2:
        level = logging.WARNING
    fmt = _format(kw)
    console = logging.StreamHandler(sys.stderr)
    if _colours(kw["log_colors"]) and not kw["log_jsonl"]:
        console.setFormatter(_Coloured(fmt))
    handlers: list[logging.Handler] = [console]
    if kw["log_file"]:
        handlers.append(logging.FileHandler(kw["log_file"]))
    logging.basicConfig(level=level, format=fmt, handlers=handlers, force=True)
    return logging.getLevelName(level).lower()
