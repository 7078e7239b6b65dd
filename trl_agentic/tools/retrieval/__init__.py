"""Retrieval for search agents (Search-R1): BM25 and dense retrievers, a Search-R1 compatible HTTP server and
client, and the search tool.

Importing this package is cheap: ``bm25s``, ``faiss``, ``numpy``, ``torch`` and ``transformers`` are imported only
by the classes that need them (``pip install trl-agentic[retrieval]``).
"""

from .bm25 import BM25Retriever
from .client import RetrievalClient, RetrievalServerError
from .corpus import Retriever, load_corpus, make_document, split_title, write_corpus
from .dense import DenseRetriever, TransformerEncoder
from .loader import load_retriever
from .search_tool import SearchTool, format_search_results
from .serving import RetrievalServer, serve

__all__ = [
    "BM25Retriever",
    "DenseRetriever",
    "TransformerEncoder",
    "RetrievalClient",
    "RetrievalServerError",
    "RetrievalServer",
    "serve",
    "SearchTool",
    "format_search_results",
    "Retriever",
    "load_corpus",
    "write_corpus",
    "load_retriever",
    "make_document",
    "split_title",
]
