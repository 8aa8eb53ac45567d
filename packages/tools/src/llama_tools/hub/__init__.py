"""The model cache and downloads shared by `llama-router` and `llama-server -hf`."""

from .cache import CachedModel, cache_dir, list_cached, remove_cached, repo_dir, resolve_cached
from .names import best_model_file, split_info, split_spec, valid_repo_id

__all__ = [
    "CachedModel",
    "best_model_file",
    "cache_dir",
    "list_cached",
    "remove_cached",
    "repo_dir",
    "resolve_cached",
    "split_info",
    "split_spec",
    "valid_repo_id",
]
