"""The model cache and downloads shared by `llama-router` and `llama-server -hf`."""

from .cache import CachedModel, cache_dir, list_cached, remove_cached, repo_dir, resolve_cached
from .download import Downloaded, download_model, is_url, plan_model, url_file_name
from .http import HubError, hub_client, model_endpoint
from .names import best_model_file, split_info, split_spec, valid_repo_id
from .remote import Plan
from .transfer import Cancelled

__all__ = [
    "CachedModel",
    "Cancelled",
    "Downloaded",
    "HubError",
    "Plan",
    "best_model_file",
    "cache_dir",
    "download_model",
    "hub_client",
    "is_url",
    "list_cached",
    "model_endpoint",
    "plan_model",
    "remove_cached",
    "repo_dir",
    "resolve_cached",
    "split_info",
    "split_spec",
    "url_file_name",
    "valid_repo_id",
]
