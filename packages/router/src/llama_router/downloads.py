"""Model downloads into the cache (router.md §5.5, §5.6): placeholder until the downloader lands."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .models import Instance, LoadError

if TYPE_CHECKING:
    from .models import ModelManager

__all__ = ["Downloads"]


class Downloads:
    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    async def start(self, spec: str) -> None:
        raise LoadError(501, "downloads are not available", "not_supported_error")

    async def cancel(self, inst: Instance) -> None:
        return None

    async def remove(self, name: str) -> None:
        raise LoadError(501, "downloads are not available", "not_supported_error")

    async def shutdown(self) -> None:
        return None
