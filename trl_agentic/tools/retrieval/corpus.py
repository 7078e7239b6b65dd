"""Corpus files in Search-R1's format, the retriever protocol, and the index files the retrievers share.

A corpus is a JSONL file, one passage per line: ``{"id": "0", "contents": "\\"Title\\"\\ntext ..."}`` (wiki-18 as
distributed with Search-R1: the first line of ``contents`` is the title in double quotes). Other fields are kept
and returned with the document.

A *retriever* is anything with ``search(queries: list[str], topk: int) -> list[list[hit]]`` where a hit is
``{"document": {"id": ..., "contents": ...}, "score": float}``: :class:`~.bm25.BM25Retriever`,
:class:`~.dense.DenseRetriever`, and :class:`~.client.RetrievalClient` (the HTTP API).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, Sequence, runtime_checkable

__all__ = [
    "Retriever",
    "load_corpus",
    "write_corpus",
    "split_title",
    "make_document",
    "INDEX_META_FILE",
]

INDEX_META_FILE = "trl_agentic_index.json"
INDEX_DOCS_FILE = "documents.jsonl"


@runtime_checkable
class Retriever(Protocol):
    """What :class:`~.search_tool.SearchTool` and the server need."""

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict[str, Any]]]: ...


def make_document(doc: Any, index: int | None = None) -> dict[str, Any]:
    """Normalise a corpus row to ``{"id": str, "contents": str, ...}``.

    Accepts Search-R1 rows (``contents``), ``{"title", "text"}`` rows (joined as ``"\\"title\\"\\ntext"``), or a
    plain string (id = its position).
    """
    if isinstance(doc, str):
        return {"id": str(index if index is not None else 0), "contents": doc}
    if not isinstance(doc, dict):
        raise TypeError(f"a corpus row must be a dict or a string, not {type(doc).__name__}")
    out = dict(doc)
    if "contents" not in out:
        if "text" in out:
            title = out.get("title")
            out["contents"] = f'"{title}"\n{out["text"]}' if title else str(out["text"])
        else:
            raise ValueError(f"corpus row without 'contents' (or 'text'): keys {sorted(out)}")
    out["contents"] = str(out["contents"])
    if "id" not in out:
        out["id"] = str(index if index is not None else 0)
    return out


def load_corpus(path: str | os.PathLike, show_progress: bool = False) -> list[dict[str, Any]]:
    """Read a JSONL corpus (UTF-8, blank lines skipped); rows are normalised with :func:`make_document`.
    ``show_progress`` shows a progress bar (bytes read) on stderr."""
    from tqdm.auto import tqdm

    docs = []
    bar = tqdm(
        total=os.path.getsize(path),
        unit="B",
        unit_scale=True,
        desc=f"reading {Path(path).name}",
        disable=not show_progress,
    )
    with open(path, "rb") as fh, bar:
        for line_no, line in enumerate(fh, start=1):
            bar.update(len(line))
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{path}:{line_no}: invalid JSON: {exc}") from None
            docs.append(make_document(row, len(docs)))
    return docs


def write_corpus(docs: Iterable[dict[str, Any]], path: str | os.PathLike) -> None:
    """Write documents as JSONL (one per line)."""
    with open(path, "w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps(doc, ensure_ascii=False) + "\n")


def split_title(contents: str, strip_quotes: bool = False) -> tuple[str, str]:
    """``(title, text)`` as Search-R1 splits ``contents``: the first line, and the other lines joined.

    Search-R1 keeps the quotes of wiki-18 titles (``Doc 1(Title: "Paris") ...``); ``strip_quotes=True`` removes
    one pair of surrounding double quotes.
    """
    lines = contents.split("\n")
    title, text = lines[0], "\n".join(lines[1:])
    if strip_quotes and len(title) >= 2 and title.startswith('"') and title.endswith('"'):
        title = title[1:-1]
    return title, text


# -- shared by the retrievers (BM25Retriever, DenseRetriever) ----------------------------------------------------


def index_documents(corpus: Iterable[Any]) -> list[dict[str, Any]]:
    """The rows of ``corpus`` as documents (:func:`make_document`, ids defaulting to positions); raises
    ``ValueError`` for an empty corpus."""
    documents = [make_document(doc, i) for i, doc in enumerate(corpus)]
    if not documents:
        raise ValueError("cannot index an empty corpus")
    return documents


def search_documents(
    documents: Sequence[dict[str, Any]],
    queries: Sequence[str] | str,
    topk: int,
    retrieve: Callable[[list[str], int], tuple[Any, Any]],
) -> list[list[dict[str, Any]]]:
    """A retriever's ``search``: normalise ``queries`` (one string or many) and ``topk`` (clamped to the number of
    documents), call ``retrieve(queries, k) -> (ids, scores)`` (one row per query, best first) and turn the rows
    into hits ``{"document": {...}, "score": float}``. Negative ids (faiss pads missing results with -1) are
    skipped."""
    if isinstance(queries, str):
        queries = [queries]
    queries = [str(q) for q in queries]
    if not queries:
        return []
    k = max(0, min(int(topk), len(documents)))
    if k == 0:
        return [[] for _ in queries]
    ids, scores = retrieve(queries, k)
    return [
        [{"document": documents[int(i)], "score": float(s)} for i, s in zip(row_ids, row_scores) if i >= 0]
        for row_ids, row_scores in zip(ids, scores)
    ]


def write_index_files(path: Path, documents: Iterable[dict[str, Any]], meta: dict[str, Any]) -> None:
    """Write a saved index's documents (``documents.jsonl``) and settings (``trl_agentic_index.json``) to ``path``."""
    write_corpus(documents, path / INDEX_DOCS_FILE)
    (path / INDEX_META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")


def read_index_meta(directory: str | os.PathLike, kind: str, owner: str, label: str) -> dict[str, Any]:
    """The settings of the index saved in ``directory``; raises ``FileNotFoundError`` when it has none and
    ``ValueError`` when its type is not ``kind`` (``owner``/``label`` name the expected index in the messages)."""
    meta_path = Path(directory) / INDEX_META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{directory} has no {INDEX_META_FILE}: not a {owner} index")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("type") != kind:
        raise ValueError(f"{directory} holds a {meta.get('type')!r} index, not a {label} one")
    return meta
