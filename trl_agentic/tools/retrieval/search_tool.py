"""The search tool of Search-R1: a query in, the top passages formatted as Search-R1 renders them out.

Observation format (Search-R1's ``_passages2string``, one line per passage)::

    Doc 1(Title: "Paris") Paris is the capital and largest city of France ...
    Doc 2(Title: ...) ...

The title is the first line of ``contents`` and the text the remaining lines. Search-R1 keeps wiki-18's quotes
around the title; ``strip_title_quotes=True`` removes them. The tag environment wraps the text in
``<information>...</information>`` (the rollout engine's concern, not the tool's).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ..base import Tool, ToolOutput, truncate_middle
from .corpus import split_title

__all__ = ["SearchTool", "format_search_results"]


def format_search_results(hits: Sequence[Any], strip_title_quotes: bool = False) -> str:
    """Render one query's hits (``{"document": {...}, "score"}`` or bare documents) as Search-R1 does, without
    the trailing newline."""
    lines = []
    for idx, hit in enumerate(hits):
        doc = hit.get("document", hit) if isinstance(hit, dict) else hit
        contents = doc.get("contents", "") if isinstance(doc, dict) else str(doc)
        title, text = split_title(str(contents), strip_quotes=strip_title_quotes)
        lines.append(f"Doc {idx + 1}(Title: {title}) {text}")
    return "\n".join(lines)


class SearchTool(Tool):
    """``query -> formatted passages`` over any retriever (BM25, dense, or a :class:`RetrievalClient`).

    Args:
        retriever: Anything with ``search(queries: list[str], topk) -> list[list[hit]]``.
        topk: Passages per query (Search-R1: 3).
        max_query_chars: Longer queries are cut to this length.
        max_output_chars: Observation size limit (None: no limit; Search-R1 truncates to 500 *tokens*, which the
            engine does with the tokenizer).
        strip_title_quotes: Remove the quotes around wiki-18 titles (Search-R1 keeps them).
        empty_message: Observation when nothing is found.

    Errors (server down, empty query) return ``"Error: ..."`` text and are counted in :attr:`num_errors`;
    :attr:`last_error` holds the latest message. :meth:`search_batch` sends the queries of many trajectories in one
    request, as Search-R1 does.
    """

    name = "search"

    def __init__(
        self,
        retriever: Any,
        topk: int = 3,
        *,
        max_query_chars: int = 1000,
        max_output_chars: int | None = None,
        strip_title_quotes: bool = False,
        empty_message: str = "No results found.",
    ):
        if not callable(getattr(retriever, "search", None)):
            raise TypeError("retriever must have a search(queries, topk) method")
        self.retriever = retriever
        self.topk = int(topk)
        self.max_query_chars = int(max_query_chars)
        self.max_output_chars = max_output_chars
        self.strip_title_quotes = strip_title_quotes
        self.empty_message = empty_message
        self._lock = threading.Lock()
        self.num_calls = 0
        self.num_errors = 0
        self.last_error: str | None = None

    def _record(self, calls: int, error: str | None) -> None:
        with self._lock:
            self.num_calls += calls
            if error is not None:
                self.num_errors += calls
                self.last_error = error

    def _render(self, hits: Sequence[Any]) -> ToolOutput:
        if not hits:
            return ToolOutput(observation=self.empty_message, info={"num_results": 0})
        text = format_search_results(hits, self.strip_title_quotes)
        text, truncated = truncate_middle(text, self.max_output_chars)
        return ToolOutput(observation=text, observation_truncated=truncated, info={"num_results": len(hits)})

    def search_batch(self, queries: Sequence[str]) -> list[ToolOutput]:
        """One retriever call for all ``queries``; one :class:`ToolOutput` per query (never raises)."""
        cleaned = [str(q).strip()[: self.max_query_chars] if q is not None else "" for q in queries]
        outputs: list[ToolOutput | None] = [None] * len(cleaned)
        todo = [i for i, q in enumerate(cleaned) if q]
        for i, q in enumerate(cleaned):
            if not q:
                outputs[i] = ToolOutput(observation="Error: empty search query.", error=True)
                self._record(1, "empty search query")
        if todo:
            try:
                results = self.retriever.search([cleaned[i] for i in todo], self.topk)
                if len(results) != len(todo):
                    raise ValueError(f"the retriever returned {len(results)} results for {len(todo)} queries")
            except Exception as exc:  # noqa: BLE001 - the training loop must never see it
                message = f"{type(exc).__name__}: {exc}"
                self._record(len(todo), message)
                for i in todo:
                    outputs[i] = ToolOutput(observation=f"Error: search failed ({message})", error=True)
            else:
                self._record(len(todo), None)
                for i, hits in zip(todo, results):
                    outputs[i] = self._render(hits)
        return [out for out in outputs if out is not None]

    def invoke(self, text: str) -> ToolOutput:
        return self.search_batch([text])[0]
