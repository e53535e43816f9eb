"""What went wrong talking to a server, in one line a user can act on.

The `openai` SDK raises one exception type per HTTP status and wraps transport failures
(refused, DNS, TLS, timeouts) in `APIConnectionError`; this turns each into a `RemoteError`
whose message names the server and what to check. The API key never appears in a message.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

from ..errors import RemoteError


class RemoteExtraMissing(RemoteError):
    """The `openai` SDK is not installed."""


def import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise RemoteExtraMissing(
            "a remote backend needs the openai package: pip install 'velo-chat[remote]'"
        ) from exc
    return openai


def _causes(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _transport(exc: BaseException, base_url: str) -> str:
    host = urlsplit(base_url).netloc or base_url
    chain = _causes(exc)
    text = " | ".join(str(e) for e in chain).lower()
    if any(isinstance(e, ssl.SSLError) for e in chain) or "ssl" in text or "certificate" in text:
        detail = next((str(e) for e in chain if isinstance(e, ssl.SSLError)), "")
        return f"TLS error talking to {host}: {detail or 'the certificate or protocol was refused'}"
    if any(
        s in text
        for s in (
            "name or service not known",
            "nodename nor servname",
            "temporary failure in name resolution",
            "no address associated",
            "getaddrinfo failed",
        )
    ):
        return f"cannot resolve the server's host name {urlsplit(base_url).hostname!r} (DNS)"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "connection refused" in text:
        return f"connection refused by {host}: is the server running and listening there?"
    return f"cannot reach {host}: {chain[-1]}"


def describe(exc: BaseException, base_url: str, model: str, retries: int) -> RemoteError:
    """A `RemoteError` for an exception from the `openai` SDK (or the transport under it)."""
    if isinstance(exc, RemoteError):
        return exc
    openai = import_openai()
    where = f"the server at {base_url}"
    after = f" (after {retries} retries)" if retries else ""
    if isinstance(exc, openai.AuthenticationError):
        return RemoteError(f"{where} refused the API key (401): check backend.api_key_env")
    if isinstance(exc, openai.PermissionDeniedError):
        return RemoteError(f"{where} denied access (403): check the API key's permissions")
    if isinstance(exc, openai.NotFoundError):
        what = f"model {model!r}" if model else "the model"
        return RemoteError(f"{where} does not know {what} or has no chat endpoint (404): check backend.model")
    if isinstance(exc, openai.RateLimitError):
        return RemoteError(f"{where} is busy (429){after}; try again later")
    if isinstance(exc, openai.APITimeoutError):
        return RemoteError(f"{where} did not answer in time{after}; raise backend.timeout_s or check it")
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code >= 500:
            return RemoteError(f"{where} failed ({exc.status_code}){after}: {_message(exc)}")
        return RemoteError(f"{where} answered {exc.status_code}: {_message(exc)}")
    if isinstance(exc, openai.APIConnectionError):
        return RemoteError(_transport(exc, base_url) + after)
    return RemoteError(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"]).splitlines()[0][:200]
        if isinstance(err, str):
            return err.splitlines()[0][:200]
    text = str(getattr(exc, "message", "") or exc)
    return text.splitlines()[0][:200] if text else "no details"
