"""Talking to the Hugging Face Hub: offline mode, the token, a reachable endpoint, the repository.

Every problem becomes one `HubPushError` that says what to do, within seconds: huggingface_hub's own client
retries for ~20 s without network and its HTTP client has no timeout, so a quick authenticated request
(`connect`) checks the endpoint, the token and its write access before anything is created or uploaded.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterator
from typing import Any

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers, get_session, validate_repo_id

__all__ = ["HubPushError", "check_repo_id", "connect", "create_repo", "hub_errors", "prepare_hub_repo"]

_TRUE_VALUES = {"1", "ON", "YES", "TRUE"}


class HubPushError(RuntimeError):
    """A push cannot happen: offline mode, no or a rejected token, an unreachable endpoint, a Hub refusal.

    The message says what went wrong and what to do; nothing was uploaded when it is raised before the commit.
    """


def check_repo_id(repo_id: str, require_namespace: bool = True) -> str:
    """``repo_id`` if valid (``user/name``); a ``ValueError`` naming the problem otherwise."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"Invalid repo id {repo_id!r}: {error}") from error
    if require_namespace and repo_id.count("/") != 1:
        raise ValueError(f"repo id must be 'user/name' (or 'organization/name'), got {repo_id!r}.")
    return repo_id


def _offline_mode() -> bool:
    """huggingface_hub reads HF_HUB_OFFLINE once at import; the environment is read again here so that setting it
    later (e.g. in a launcher script) is honoured too."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((value or "").upper() in _TRUE_VALUES for value in flags)


def _offline_error(endpoint: str) -> HubPushError:
    return HubPushError(
        f"Cannot push to {endpoint}: offline mode is on (HF_HUB_OFFLINE=1). Unset HF_HUB_OFFLINE on a machine with "
        "network access, or write the upload folder with `sage-push OUTPUT_DIR --repo-id USER/NAME --dry-run DIR` "
        "and upload it later with `hf upload USER/NAME DIR`."
    )


def _resolve_token(token: str | None) -> str:
    token = token or get_token()  # HF_TOKEN, then the login cache (`hf auth login`)
    if not token:
        raise HubPushError(
            "No Hugging Face token: run `hf auth login`, set the HF_TOKEN environment variable, or pass --token "
            "(hub_token for the trainer). The token needs write access: https://huggingface.co/settings/tokens"
        )
    return token


def _whoami(endpoint: str, token: str, timeout: float) -> dict[str, Any]:
    """One quick authenticated request: checks the endpoint answers and the token is valid and can write.

    huggingface_hub's own client has no timeout, and its upload step retries for ~20 s: this request fails
    within ``timeout`` seconds instead.
    """
    url = f"{endpoint}/api/whoami-v2"
    try:
        response = get_session().get(url, headers=build_hf_headers(token=token), timeout=timeout)
    except OfflineModeIsEnabled as error:
        raise _offline_error(endpoint) from error
    except Exception as error:  # the HTTP backend's connection and timeout errors (httpx or requests)
        raise HubPushError(
            f"Cannot reach the Hugging Face Hub at {endpoint} ({type(error).__name__}: {error}). Check the network, "
            "proxy settings (HTTPS_PROXY) or --endpoint / HF_ENDPOINT; on a machine without network use --dry-run."
        ) from error
    if response.status_code == 401:
        raise HubPushError(
            f"The Hub at {endpoint} rejected the token (401 Unauthorized): it is invalid or expired. Create a write "
            "token at https://huggingface.co/settings/tokens and run `hf auth login` or set HF_TOKEN."
        )
    if response.status_code >= 400:
        raise HubPushError(
            f"The Hub at {endpoint} answered {response.status_code} to {url}: {response.text[:300]}"
        )
    user = response.json()
    role = ((user.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubPushError("The token is read-only; pushing needs a token with write access (role 'write').")
    return user


@contextlib.contextmanager
def hub_errors(action: str, repo_id: str) -> Iterator[None]:
    """Turn huggingface_hub's errors during ``action`` into one `HubPushError` that says what to do."""
    try:
        yield
    except OfflineModeIsEnabled as error:
        raise _offline_error(constants.ENDPOINT) from error
    except HfHubHTTPError as error:
        status = error.response.status_code if error.response is not None else None
        hint = {
            401: "the token was rejected; log in again with a write token",
            403: f"the token cannot write to {repo_id}; check the namespace and the token's permissions",
            404: f"{repo_id} was not found; check the repo id",
        }.get(status, "see the Hub's message above")
        raise HubPushError(f"Could not {action} {repo_id} ({status}): {hint}.\n{error}") from error


def connect(
    repo_id: str, *, token: str | None = None, endpoint: str | None = None, timeout: float = 10.0
) -> tuple[HfApi, str]:
    """Check that a push can happen, without creating anything; returns ``(api, full repo id)``.

    Fails at once with one `HubPushError` when offline mode is on (``HF_HUB_OFFLINE=1``), no token is found
    (argument, ``HF_TOKEN``, login cache), the endpoint does not answer within ``timeout`` seconds, or the token is
    rejected or read-only. A bare ``name`` resolves to the token owner's namespace.
    """
    check_repo_id(repo_id, require_namespace=False)
    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    if _offline_mode():
        raise _offline_error(endpoint)
    token = _resolve_token(token)
    user = _whoami(endpoint, token, timeout)
    full_id = repo_id if "/" in repo_id else f"{user['name']}/{repo_id}"
    return HfApi(
        endpoint=endpoint, token=token, library_name="sage-grpo", library_version=_package_version()
    ), full_id


def create_repo(api: HfApi, repo_id: str, private: bool | None) -> str:
    with hub_errors("create the repository", repo_id):
        return api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model").repo_id


def prepare_hub_repo(
    repo_id: str,
    *,
    token: str | None = None,
    private: bool | None = None,
    endpoint: str | None = None,
    timeout: float = 10.0,
) -> tuple[HfApi, str]:
    """`connect_to_hub`, then create ``repo_id`` (a model repo; an existing one is fine); returns
    ``(api, full repo id)``. ``private`` has no effect on an existing repository."""
    api, full_id = connect(repo_id, token=token, endpoint=endpoint, timeout=timeout)
    return api, create_repo(api, full_id, private)


def _package_version() -> str:
    try:
        return importlib.metadata.version("sage-grpo")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
