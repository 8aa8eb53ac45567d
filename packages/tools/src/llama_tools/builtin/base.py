"""How a built-in tool is declared: its parameters (one declaration gives both the JSON schema of its
OpenAI definition and the request check), its flags, and the coroutine that runs it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from .io import PathError, ToolsIO

__all__ = ["Param", "ParamError", "Tool", "opt", "req"]

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


class ParamError(ValueError):
    """A required parameter missing or of the wrong type: `POST /tools` answers 400."""


@dataclass(frozen=True, slots=True)
class Param:
    name: str
    type: str  # a JSON schema type name
    description: str
    required: bool = False
    default: Any = None
    items: dict[str, Any] | None = None  # the item schema of an array

    def schema(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "description": self.description}
        if self.items is not None:
            out["items"] = self.items
        return out

    def matches(self, value: Any) -> bool:
        if self.type == "integer" and isinstance(value, bool):
            return False
        if self.type == "integer" and isinstance(value, float) and value.is_integer():
            return True
        return isinstance(value, _JSON_TYPES[self.type])


def req(name: str, type: str, description: str, items: dict[str, Any] | None = None) -> Param:
    return Param(name, type, description, required=True, items=items)


def opt(name: str, type: str, description: str, default: Any = None) -> Param:
    return Param(name, type, description, default=default)


Invoke = Callable[
    [dict[str, Any], ToolsIO, Callable[[str], Awaitable[None]] | None], Awaitable[dict[str, Any]]
]


@dataclass(frozen=True, slots=True)
class Tool:
    """One built-in tool as `GET /tools` lists it and `POST /tools` runs it."""

    name: str
    display_name: str
    description: str
    params: tuple[Param, ...]
    run: Invoke
    write: bool = False
    stream: bool = False
    extra_schema: dict[str, Any] = field(default_factory=dict)

    def definition(self) -> dict[str, Any]:
        """The OpenAI function-tool object (usable in `/v1/chat/completions`)."""
        parameters: dict[str, Any] = {
            "type": "object",
            "properties": {p.name: p.schema() for p in self.params},
        }
        required = [p.name for p in self.params if p.required]
        if required:
            parameters["required"] = required
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": parameters},
        }

    def listing(self) -> dict[str, Any]:
        """The entry of `GET /tools`."""
        return {
            "display_name": self.display_name,
            "tool": self.name,
            "type": "server",
            "permissions": {"write": self.write},
            "uses_cwd": True,
            "definition": self.definition(),
        }

    async def call(
        self, args: dict[str, Any], io: ToolsIO, on_chunk: Callable[[str], Awaitable[None]] | None = None
    ) -> dict[str, Any]:
        """Run with `args` (from `arguments`): a path outside the tools directory is the tool's error
        (`{"error": ...}`, HTTP 200), nothing read or written."""
        try:
            return await self.run(args, io, on_chunk)
        except PathError as e:
            if on_chunk is not None:
                raise
            return {"error": str(e)}

    def arguments(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with defaults filled in: a required parameter missing or of the wrong type raises
        ParamError; an optional one of the wrong type takes its default (as llama.cpp's `json_value`)."""
        out = dict(params)
        for p in self.params:
            value = params.get(p.name)
            if p.required:
                if p.name not in params:
                    raise ParamError(f'missing required parameter "{p.name}" for tool "{self.name}"')
                if not p.matches(value):
                    raise ParamError(f'parameter "{p.name}" of tool "{self.name}" must be of type {p.type}')
            elif value is None or not p.matches(value):
                out[p.name] = p.default
            if p.type == "integer" and isinstance(out[p.name], float):
                out[p.name] = int(out[p.name])
        return out
