"""Hub ids and local paths given on a command line: a model or dataset that cannot be had fails at once, in one line.

Two traps this avoids. With no network, ``huggingface_hub`` retries the hub (about a minute here) before
transformers or datasets give up. And a local path that does not exist yet, such as ``outputs/gsm8k-tools-grpo``
before the recipe that writes it has run, has the shape of a hub id (``owner/name``) and was looked up on the hub,
reported as a connection failure. So: a path that can only be a path and is missing is "no such directory" without
any request; otherwise one request, without retry, tells whether the hub answers (:func:`hub_reachable`); when it
does not, a model already in the Hugging Face cache is loaded from it, and anything else stops with the fix.
``HF_HUB_OFFLINE=1`` skips the request: the libraries then read only the cache, at once.
"""

from __future__ import annotations

import functools
import os

from .errors import TaskConfigError


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only be a local path, not a hub id (``owner/name`` or ``name``): absolute, starting with
    ``.`` or ``~``, with a backslash, a trailing slash or more than one ``/``."""
    return (os.path.isabs(name) or name.startswith((".", "~")) or "\\" in name or name.endswith("/")
            or name.count("/") > 1)


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` is set: the hub is never asked, the libraries read only their caches."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


@functools.cache
def hub_reachable(timeout: float = 5.0) -> tuple[bool, str]:
    """``(answers, why not)``: one ``HEAD`` request to the hub's endpoint (``HF_ENDPOINT``) with ``huggingface_hub``'s
    own HTTP client (its proxies and certificates), no retry; any HTTP answer counts. Asked once per process."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - whatever the transport raises, the hub did not answer
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        return False, f"the hub ({constants.ENDPOINT}) cannot be reached ({reason})"
    return True, ""


def resolve_model(name: str, flag: str, revision: str | None = None) -> str:
    """Where to load the model ``name`` from: a local directory as it is; a hub id as it is when the hub answers or
    ``HF_HUB_OFFLINE`` is set (the libraries then read the cache); else its snapshot in the Hugging Face cache.

    Raises:
        TaskConfigError: a path that is no directory, or a hub id the hub cannot serve now and the cache does not hold.
    """
    if os.path.isdir(os.path.expanduser(name)):
        return name
    if looks_like_path(name):
        raise TaskConfigError(f"{flag} {name}: no such directory; pass {flag} with a local model directory or a hub id "
                              "such as Qwen/Qwen2.5-0.5B-Instruct")
    if hub_offline():
        return name
    answers, why = hub_reachable()
    if answers:
        return name
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache (or not a valid id): the one-line error below
        raise TaskConfigError(
            f"could not load the model {name!r}: no such directory here, it is not in the Hugging Face cache, and "
            f"{why}; offline? pass {flag} with a local model directory (with no network, HF_HUB_OFFLINE=1 skips the "
            "hub)"
        ) from None


def check_hub_dataset(name: str, flag: str) -> None:
    """Before ``datasets.load_dataset(name)`` of a hub id: stop at once when the hub does not answer and
    ``HF_HUB_OFFLINE`` is not set (``datasets`` would retry for a minute, then fail)."""
    if hub_offline():
        return
    answers, why = hub_reachable()
    if not answers:
        raise TaskConfigError(
            f"could not load the dataset {name!r}: no such file or folder here, and {why}; offline? pass {flag} with a "
            "local .jsonl/.parquet file or folder (or set HF_HUB_OFFLINE=1 to read the datasets cache)"
        )


def load_failure(name: str, what: str, flag: str, exc: Exception, local: str) -> TaskConfigError:
    """The one-line error of a model or dataset that ``from_pretrained`` / ``load_dataset`` could not load
    (``local``: the kind of local source to pass instead)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    where = ""
    if not os.path.exists(os.path.expanduser(name)):
        where = ": no such directory here" + (" and HF_HUB_OFFLINE=1 reads only the Hugging Face cache"
                                              if hub_offline() else "")
    return TaskConfigError(f"could not load the {what} {name!r} ({reason[:160]}){where}; offline? pass {flag} with "
                           f"{local}")
