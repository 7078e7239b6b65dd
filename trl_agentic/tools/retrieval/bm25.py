"""Sparse retrieval with BM25 (the ``bm25s`` package, part of ``pip install trl-agentic[retrieval]``).

Example::

    retriever = BM25Retriever.from_jsonl("wiki-18.jsonl")
    retriever.save("indexes/wiki-bm25")
    retriever = BM25Retriever.load("indexes/wiki-bm25")
    retriever.search(["capital of france"], topk=3)
    # [[{"document": {"id": "17", "contents": "\\"Paris\\"\\nParis is ..."}, "score": 7.1}, ...]]
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .corpus import (
    INDEX_DOCS_FILE,
    index_documents,
    load_corpus,
    read_index_meta,
    search_documents,
    write_index_files,
)

__all__ = ["BM25Retriever"]

_HINT = "BM25Retriever needs the bm25s package: pip install trl-agentic[retrieval]"


def _bm25s() -> Any:
    try:
        import bm25s
    except ImportError as exc:
        raise ImportError(_HINT) from exc
    return bm25s


def _make_stemmer(name: str | None) -> Callable[[list[str]], list[str]] | None:
    if not name:
        return None
    try:
        import Stemmer  # PyStemmer
    except ImportError as exc:
        raise ImportError(
            f"stemmer={name!r} needs the PyStemmer package: pip install PyStemmer (or use stemmer=None)"
        ) from exc
    return Stemmer.Stemmer(name).stemWords


class BM25Retriever:
    """BM25 over a corpus of Search-R1 documents (``{"id", "contents"}``).

    Args:
        corpus: Documents to index now (rows as accepted by :func:`~.corpus.make_document`), or None to call
            :meth:`index` later.
        k1, b, method: BM25 parameters and variant (``"lucene"``, ``"robertson"``, ``"atire"``, ``"bm25l"``,
            ``"bm25+"``), as in ``bm25s``.
        stopwords: Stop-word list name for ``bm25s.tokenize`` (``"en"``) or None.
        stemmer: A PyStemmer language (``"english"``) or None (default: no stemming, no extra dependency).
        lower: Lowercase before tokenizing.
        show_progress: Progress bars (tqdm, on stderr) while reading, tokenizing, indexing and loading.
    """

    def __init__(
        self,
        corpus: Iterable[Any] | None = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        stopwords: str | None = "en",
        stemmer: str | None = None,
        lower: bool = True,
        show_progress: bool = True,
    ):
        self.k1, self.b, self.method = float(k1), float(b), method
        self.stopwords, self.stemmer_name, self.lower = stopwords, stemmer, lower
        self.show_progress = show_progress
        self._stemmer = _make_stemmer(stemmer)
        self.documents: list[dict[str, Any]] = []
        self._model: Any = None
        if corpus is not None:
            self.index(corpus)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike, show_progress: bool = True, **kwargs: Any) -> "BM25Retriever":
        """Index a JSONL corpus file (keyword arguments as for the constructor)."""
        return cls(load_corpus(path, show_progress), show_progress=show_progress, **kwargs)

    def _tokenize(self, texts: Sequence[str], show_progress: bool = False) -> list[list[str]]:
        bm25s = _bm25s()
        return bm25s.tokenize(
            list(texts),
            lower=self.lower,
            stopwords=self.stopwords or [],
            stemmer=self._stemmer,
            return_ids=False,
            show_progress=show_progress,
        )

    def index(self, corpus: Iterable[Any]) -> "BM25Retriever":
        """(Re)build the index over ``corpus``."""
        bm25s = _bm25s()
        self.documents = index_documents(corpus)
        tokens = self._tokenize([doc["contents"] for doc in self.documents], show_progress=self.show_progress)
        if not any(tokens):
            raise ValueError(
                f"cannot index a corpus without a single indexable word ({len(self.documents)} passages, all empty "
                f"or stop words only with stopwords={self.stopwords!r}); check the 'contents' of the corpus"
            )
        model = bm25s.BM25(k1=self.k1, b=self.b, method=self.method)
        model.index(tokens, show_progress=self.show_progress)
        self._model = model
        return self

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, queries: Sequence[str] | str, topk: int = 3) -> list[list[dict[str, Any]]]:
        """For each query, up to ``topk`` best documents as ``{"document": {...}, "score": float}``, best first. A
        document that shares no word with the query (BM25 score 0) is no hit: fewer than ``topk`` come back then."""
        if self._model is None:
            raise RuntimeError("the BM25 index is empty: call index(corpus) or load(dir) first")
        return [[hit for hit in row if hit["score"] > 0]
                for row in search_documents(self.documents, queries, topk, self._retrieve)]

    def _retrieve(self, queries: list[str], k: int) -> tuple[Any, Any]:
        return self._model.retrieve(self._tokenize(queries), k=k, show_progress=False)

    def save(self, directory: str | os.PathLike) -> None:
        """Write the index, the documents and the settings to ``directory`` (created if needed)."""
        if self._model is None:
            raise RuntimeError("nothing to save: the index is empty")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self._model.save(str(path), show_progress=False)
        meta = {
            "type": "bm25",
            "num_documents": len(self.documents),
            "k1": self.k1,
            "b": self.b,
            "method": self.method,
            "stopwords": self.stopwords,
            "stemmer": self.stemmer_name,
            "lower": self.lower,
        }
        write_index_files(path, self.documents, meta)

    @classmethod
    def load(cls, directory: str | os.PathLike, mmap: bool = False, show_progress: bool = True) -> "BM25Retriever":
        """Load an index written by :meth:`save` (``mmap=True`` maps the matrices instead of reading them)."""
        bm25s = _bm25s()
        path = Path(directory)
        meta = read_index_meta(directory, "bm25", "BM25Retriever", "BM25")
        self = cls(
            k1=meta["k1"],
            b=meta["b"],
            method=meta["method"],
            stopwords=meta.get("stopwords"),
            stemmer=meta.get("stemmer"),
            lower=meta.get("lower", True),
            show_progress=show_progress,
        )
        self._model = bm25s.BM25.load(str(path), mmap=mmap, load_corpus=False, show_progress=show_progress)
        self.documents = load_corpus(path / INDEX_DOCS_FILE, show_progress=show_progress)
        return self
