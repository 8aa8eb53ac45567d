"""The seven built-in tools of `POST /tools`, in the fixed order of `GET /tools`."""

from __future__ import annotations

from .base import ParamError, Tool
from .files import EDIT_FILE, READ_FILE, WRITE_FILE
from .io import PathError, RuntimeSpecError, ToolsIO, make_io
from .search import FILE_GLOB_SEARCH, GREP_SEARCH
from .shell import EXEC_SHELL_COMMAND, GET_INFO

__all__ = ["BUILTIN_TOOLS", "ParamError", "PathError", "RuntimeSpecError", "Tool", "ToolsIO", "make_io"]

BUILTIN_TOOLS: dict[str, Tool] = {
    t.name: t
    for t in (READ_FILE, FILE_GLOB_SEARCH, GREP_SEARCH, EXEC_SHELL_COMMAND, WRITE_FILE, EDIT_FILE, GET_INFO)
}
