"""HTTP client for a Search-R1 style retrieval server (ours, or Search-R1's own ``retrieval_server.py``).

Standard library only (``urllib``). Each call makes at most ``retries + 1`` attempts within a total ``deadline``:
connection errors (refused, reset, closed without an answer), timeouts, truncated or garbled responses, HTTP 429 and
5xx are retried with exponential backoff; a 4xx answer, a response over ``max_response_bytes`` and an answer that
is not JSON are not. Retries are counted per call, so a call never costs more than ``retries + 1`` requests.
When the call fails the client raises :class:`RetrievalServerError`, whose message names the URL, the attempts, the
last error and how to start the server. :class:`~.search_tool.SearchTool` turns that into an error observation, so
the training loop never sees it.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Sequence

__all__ = ["RetrievalClient", "RetrievalServerError"]

_START_HINT = "start it with: python -m trl_agentic.tools.retrieval.server --index INDEX_DIR --port {port}"
_READ_SIZE = 1 << 16


class RetrievalServerError(ConnectionError):
    """The retrieval server could not answer (down, unreachable, timing out, or returning an error).

    Attributes:
        url: The endpoint that was called.
        status: The HTTP status of the last answer, if any.
        attempts: How many requests were made.
    """

    def __init__(self, message: str, url: str, status: int | None = None, attempts: int = 1):
        super().__init__(message)
        self.url = url
        self.status = status
        self.attempts = attempts


class _Failure(Exception):
    """One failed attempt: ``retry`` says whether another attempt may help, ``unreachable`` that no connection was
    made (refused, no route, unknown host)."""

    def __init__(self, message: str, retry: bool, status: int | None = None, unreachable: bool = False):
        message = " ".join(message.split())  # one line, whatever the server sent
        super().__init__(message)
        self.message, self.retry, self.status, self.unreachable = message, retry, status, unreachable


def _normalise_url(url: str) -> str:
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else "/retrieve"
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


class RetrievalClient:
    """Calls ``POST /retrieve`` of a retrieval server; usable wherever a retriever is (``search(queries, topk)``).

    Args:
        url: Endpoint URL; ``http://host:port`` alone means ``http://host:port/retrieve``.
        timeout: Seconds per blocking socket operation of one attempt (connect, each read).
        retries: Extra attempts after the first one fails with a retryable error, per call.
        backoff: First wait between attempts, seconds; doubled each time up to ``max_backoff`` (plus up to
            ``jitter`` of it at random, to spread simultaneous clients).
        deadline: Seconds for a whole call, attempts and waits included (None: no limit). No attempt starts after
            it; a response still arriving is abandoned (it is checked between reads, so a call can overrun it by at
            most one ``timeout``; a server trickling its *headers* byte by byte is bounded by ``timeout`` per byte
            only).
        max_response_bytes: Largest response body read; a larger one (declared or received) fails at once, with an
            error naming this limit.
        use_env_proxy: Honour ``http_proxy``/``https_proxy`` from the environment (off by default: a proxy would
            intercept requests to 127.0.0.1).
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000/retrieve",
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 8.0,
        jitter: float = 0.1,
        deadline: float | None = 60.0,
        max_response_bytes: int = 64 << 20,
        use_env_proxy: bool = False,
    ):
        self.url = _normalise_url(url)
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.jitter = float(jitter)
        self.deadline = None if deadline is None else float(deadline)
        self.max_response_bytes = int(max_response_bytes)
        handlers = [] if use_env_proxy else [urllib.request.ProxyHandler({})]
        self._opener = urllib.request.build_opener(*handlers)

    def _hint(self) -> str:
        port = urllib.parse.urlsplit(self.url).port or 8000
        return _START_HINT.format(port=port)

    def _post(self, url: str, payload: dict[str, Any]) -> Any:
        data = json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
        return self._send(request)

    def _send(self, request: urllib.request.Request) -> Any:
        """Up to ``retries + 1`` attempts within the deadline; the parsed JSON answer or a RetrievalServerError."""
        url = request.full_url
        start = time.monotonic()
        deadline = start + self.deadline if self.deadline is not None else math.inf
        attempts, status, last_error, out_of_time, unreachable = 0, None, "", False, False
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out_of_time = True
                break
            attempts += 1
            try:
                body = self._attempt(request, min(self.timeout, remaining), deadline)
            except _Failure as failure:
                status, last_error, unreachable = failure.status, failure.message, failure.unreachable
                if not failure.retry:
                    raise RetrievalServerError(
                        f"retrieval server at {url} {failure.message}", url, status=status, attempts=attempts
                    ) from None
            else:
                try:
                    return json.loads(body.decode("utf-8"))
                except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                    raise RetrievalServerError(
                        f"retrieval server at {url} returned invalid JSON: {exc}", url, attempts=attempts
                    ) from None
            if attempt < self.retries:
                delay = min(self.max_backoff, self.backoff * (2**attempt)) * (1 + self.jitter * random.random())
                if time.monotonic() + delay >= deadline:
                    out_of_time = True
                    break
                time.sleep(delay)
        out_of_time = out_of_time or time.monotonic() >= deadline
        limit = f", deadline of {self.deadline:g} s reached" if out_of_time else ""
        outcome = "is unreachable" if unreachable else "failed"
        hint = f"; is it running? {self._hint()}" if unreachable else ""
        raise RetrievalServerError(
            f"retrieval server at {url} {outcome} after {attempts} attempt(s) in {time.monotonic() - start:.1f} s"
            f"{limit} (last error: {last_error}){hint}",
            url,
            status=status,
            attempts=attempts,
        )

    def _attempt(self, request: urllib.request.Request, timeout: float, deadline: float) -> bytes:
        """One request; the response body, or a :class:`_Failure` saying whether to retry."""
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return self._read_body(response, deadline)
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            message = f"HTTP {exc.code}{': ' + detail if detail else ''}"
            if exc.code == 429 or exc.code >= 500:
                raise _Failure(message, retry=True, status=exc.code) from None
            raise _Failure(f"rejected the request: {message}", retry=False, status=exc.code) from None
        except urllib.error.URLError as exc:  # raised while connecting or sending the request
            reason = exc.reason
            unreachable = not isinstance(reason, (ConnectionResetError, BrokenPipeError))
            if isinstance(reason, TimeoutError):
                reason = f"timed out after {timeout:.3g} s connecting or sending"
            else:
                reason = f"{type(reason).__name__}: {reason}"
            raise _Failure(reason, retry=True, unreachable=unreachable) from None
        except TimeoutError:
            raise _Failure(f"timed out after {timeout:.3g} s waiting for the answer", retry=True) from None
        except http.client.IncompleteRead as exc:
            raise _Failure(f"truncated response ({exc!r})", retry=True) from None
        except http.client.RemoteDisconnected as exc:
            raise _Failure(f"connection closed without an answer ({exc})", retry=True) from None
        except http.client.HTTPException as exc:
            raise _Failure(f"not an HTTP response ({type(exc).__name__}: {exc})", retry=True) from None
        except OSError as exc:
            raise _Failure(f"{type(exc).__name__}: {exc}", retry=True) from None

    def _read_body(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        """The body, read in pieces: within ``max_response_bytes`` and the deadline, and complete."""
        limit = self.max_response_bytes
        too_large = (
            f"sent a response larger than the client's limit of {limit} bytes (max_response_bytes): "
            "{size}; ask for fewer queries or a smaller topk per request, or raise max_response_bytes"
        )
        if response.length is not None and response.length > limit:
            raise _Failure(too_large.format(size=f"{response.length} bytes declared"), retry=False)
        chunks, size = [], 0
        while chunk := response.read1(_READ_SIZE):
            size += len(chunk)
            if size > limit:
                raise _Failure(too_large.format(size=f"more than {limit} bytes received"), retry=False)
            if time.monotonic() > deadline:
                raise _Failure(f"was still sending its answer at the deadline ({size} bytes received)", retry=True)
            chunks.append(chunk)
        if response.length:  # the connection closed before Content-Length bytes came
            raise _Failure(f"truncated response ({size} bytes read, {response.length} more expected)", retry=True)
        return b"".join(chunks)

    def retrieve(self, queries: Sequence[str], topk: int | None = 3, return_scores: bool = True) -> list[list[Any]]:
        """The raw ``result`` list of ``POST /retrieve`` (hits with scores, or bare documents)."""
        payload = {"queries": list(queries), "topk": topk, "return_scores": bool(return_scores)}
        answer = self._post(self.url, payload)
        if not isinstance(answer, dict) or not isinstance(answer.get("result"), list):
            raise RetrievalServerError(
                f"retrieval server at {self.url} returned an unexpected answer (no 'result' list)", self.url
            )
        if len(answer["result"]) != len(payload["queries"]):
            raise RetrievalServerError(
                f"retrieval server at {self.url} returned {len(answer['result'])} results for "
                f"{len(payload['queries'])} queries",
                self.url,
            )
        return answer["result"]

    def search(self, queries: Sequence[str] | str, topk: int = 3) -> list[list[dict[str, Any]]]:
        """Same contract as the in-process retrievers: ``[[{"document", "score"}, ...], ...]``."""
        if isinstance(queries, str):
            queries = [queries]
        if not queries:
            return []
        return [[_as_hit(item) for item in row] for row in self.retrieve(queries, topk, return_scores=True)]

    def health(self) -> dict[str, Any]:
        """``GET /health`` of our server (Search-R1's own server has no such route)."""
        parts = urllib.parse.urlsplit(self.url)
        url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/health", "", ""))
        return self._send(urllib.request.Request(url, method="GET"))

    def check(self, timeout: float = 5.0) -> None:
        """Fail fast, before training, when the server does not answer: ``GET /health`` with one retry (at most
        ``timeout`` seconds per attempt). A server that answers without that route (Search-R1's own, 404) is up.

        Raises:
            RetrievalServerError: nothing answered, or the server failed; the message says how to start it.
        """
        probe = RetrievalClient(self.url, timeout=timeout, retries=1, backoff=0.2, deadline=2 * timeout + 1)
        probe._opener = self._opener  # the same proxy settings
        try:
            probe.health()
        except RetrievalServerError as exc:
            if exc.status not in (404, 405):
                raise


def _as_hit(item: Any) -> dict[str, Any]:
    if isinstance(item, dict) and "document" in item:
        return {"document": item["document"], "score": item.get("score")}
    return {"document": item, "score": None}


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read(2000).decode("utf-8", errors="replace")
    except Exception:  # noqa: BLE001
        return ""
    try:
        payload = json.loads(body)
        if isinstance(payload, dict):
            return str(payload.get("error") or payload.get("detail") or body)
    except json.JSONDecodeError:
        pass
    return body.strip()
