"""Load a saved index, BM25 or dense, from the type recorded in its ``trl_agentic_index.json``.

Kept apart from :mod:`.corpus`, which both retrievers import, so that no module imports one that imports it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .bm25 import BM25Retriever
from .corpus import INDEX_META_FILE
from .dense import DenseRetriever

__all__ = ["load_retriever"]


def load_retriever(index_dir: str | os.PathLike, **kwargs: Any) -> BM25Retriever | DenseRetriever:
    """Load a saved index, BM25 or dense, from the type written in its ``trl_agentic_index.json``.
    Keyword arguments go to the loader (e.g. ``encoder=`` for a dense index, ``mmap=True`` for BM25)."""
    meta_path = Path(index_dir) / INDEX_META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(
            f"{index_dir} is not a trl_agentic index (no {INDEX_META_FILE}); build one with "
            "BM25Retriever(...).save(dir) or DenseRetriever(...).save(dir)"
        )
    kind = json.loads(meta_path.read_text(encoding="utf-8")).get("type")
    if kind == "bm25":
        return BM25Retriever.load(index_dir, **kwargs)
    if kind == "dense":
        return DenseRetriever.load(index_dir, **kwargs)
    raise ValueError(f"unknown index type {kind!r} in {meta_path}")
