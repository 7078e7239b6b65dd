"""Command line of the retrieval server (:mod:`.serving`), which it re-exports for ``from ...server import``.

    python -m trl_agentic.tools.retrieval.server --index indexes/wiki-bm25 --port 8000
    python -m trl_agentic.tools.retrieval.server --corpus corpus.jsonl --port 8000        # BM25 built at start

The package imports :mod:`.serving`, never this module, so that ``python -m`` runs it without importing it twice
(which made ``runpy`` warn on every start).
"""

from __future__ import annotations

import argparse
import logging

from .serving import RetrievalServer, serve

__all__ = ["RetrievalServer", "serve", "main"]


def main(argv: list[str] | None = None) -> None:
    """Serve a saved index (``--index``) or a JSONL corpus indexed with BM25 at start (``--corpus``)."""
    parser = argparse.ArgumentParser(prog="python -m trl_agentic.tools.retrieval.server",
                                     description="Serve a retrieval index with Search-R1's HTTP API.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", help="directory written by BM25Retriever.save or DenseRetriever.save")
    source.add_argument("--corpus", help="JSONL corpus ({'id','contents'} rows) to index with BM25 at start-up")
    parser.add_argument("--encoder", default=None, help="encoder path for a dense index (overrides the saved one)")
    parser.add_argument("--save-index", default=None, help="with --corpus: also save the built BM25 index here")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=3, help="default topk when a request has none")
    args = parser.parse_args(argv)
    logging.basicConfig(format="%(levelname)s: %(message)s")  # warnings of every library; info of ours only
    logging.getLogger("trl_agentic").setLevel(logging.INFO)
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs its steps at DEBUG
    if args.index:
        from .loader import load_retriever

        kwargs = {"encoder": args.encoder} if args.encoder else {}
        retriever = load_retriever(args.index, **kwargs)
    else:
        from .bm25 import BM25Retriever

        retriever = BM25Retriever.from_jsonl(args.corpus)
        if args.save_index:
            retriever.save(args.save_index)
    serve(retriever, args.host, args.port, default_topk=args.topk, block=True)


if __name__ == "__main__":
    main()
