"""Dense retrieval: a transformers encoder (e5-style) and a faiss flat inner-product index.

Needs ``pip install trl-agentic[retrieval]`` (``faiss-cpu``, ``numpy``) and, for :class:`TransformerEncoder`,
``transformers`` and ``torch`` (core dependencies). Search-R1 uses ``intfloat/e5-base-v2``: passages are encoded
as ``"passage: " + contents`` and queries as ``"query: " + query``, mean-pooled over the attention mask and
L2-normalised, so inner product = cosine similarity.

Example::

    retriever = DenseRetriever("intfloat/e5-base-v2", corpus=docs)   # any local path or hub id you have
    retriever.save("indexes/wiki-e5")
    retriever = DenseRetriever.load("indexes/wiki-e5")               # reloads the encoder from the saved path
    retriever.search(["who wrote hamlet"], topk=3)

``encoder=`` also accepts any callable ``list[str] -> array (n, dim)``, e.g. for tests or an embedding service.
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

__all__ = ["DenseRetriever", "TransformerEncoder"]

_INDEX_FILE = "index.faiss"


def _faiss() -> Any:
    try:
        import faiss
    except ImportError as exc:
        raise ImportError("DenseRetriever needs faiss: pip install trl-agentic[retrieval] (faiss-cpu)") from exc
    return faiss


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as exc:  # pragma: no cover - numpy comes with torch
        raise ImportError("DenseRetriever needs numpy: pip install trl-agentic[retrieval]") from exc
    return numpy


class TransformerEncoder:
    """Texts -> L2-normalised float32 embeddings with a Hugging Face encoder (BERT, e5, MiniLM...).

    Args:
        model_name_or_path: Local directory (or hub id when the hub is reachable) of the model and tokenizer.
        pooling: ``"mean"`` (masked mean over tokens, e5), ``"cls"`` (first token) or ``"pooler"``.
        max_length: Truncation length in tokens.
        batch_size: Texts per forward pass.
        device: ``"cpu"``, ``"cuda"``... (default: cuda when available).
        fp16: Half precision on CUDA.
        normalize: L2-normalise the embeddings.
    """

    def __init__(
        self,
        model_name_or_path: str | os.PathLike,
        *,
        pooling: str = "mean",
        max_length: int = 256,
        batch_size: int = 64,
        device: str | None = None,
        fp16: bool = False,
        normalize: bool = True,
    ):
        try:
            import torch
            from transformers import AutoModel, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - core dependencies
            raise ImportError("TransformerEncoder needs torch and transformers") from exc
        if pooling not in ("mean", "cls", "pooler"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'pooler', not {pooling!r}")
        self.model_name_or_path = str(model_name_or_path)
        self.pooling, self.max_length, self.batch_size, self.normalize = pooling, max_length, batch_size, normalize
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name_or_path)
        self.model = AutoModel.from_pretrained(self.model_name_or_path).to(self.device).eval()
        if fp16 and self.device.startswith("cuda"):
            self.model = self.model.half()
        self._torch = torch

    def __call__(self, texts: Sequence[str]) -> Any:
        np = _numpy()
        torch = self._torch
        outputs = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + self.batch_size]),
                    max_length=self.max_length,
                    padding=True,
                    truncation=True,
                    return_tensors="pt",
                ).to(self.device)
                out = self.model(**batch)
                if self.pooling == "pooler" and getattr(out, "pooler_output", None) is not None:
                    emb = out.pooler_output
                elif self.pooling == "cls":
                    emb = out.last_hidden_state[:, 0]
                else:
                    mask = batch["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
                    emb = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                if self.normalize:
                    emb = torch.nn.functional.normalize(emb.float(), dim=-1)
                outputs.append(emb.float().cpu().numpy())
        if not outputs:
            return np.zeros((0, int(self.model.config.hidden_size)), dtype="float32")
        return np.concatenate(outputs).astype("float32")


class DenseRetriever:
    """Flat inner-product faiss index over encoder embeddings.

    Args:
        encoder: A model path/id (loaded with :class:`TransformerEncoder`) or a callable ``list[str] -> (n, d)``.
        corpus: Documents to index now, or None to call :meth:`index` / :meth:`load` later.
        query_prefix, passage_prefix: Prepended before encoding (e5: ``"query: "`` / ``"passage: "``).
        normalize: L2-normalise embeddings (also those returned by a callable encoder).
        batch_size: Passages encoded per call to the encoder while indexing.
        encoder_kwargs: Passed to :class:`TransformerEncoder` when ``encoder`` is a path.
        show_progress: Progress bars (tqdm, on stderr) while encoding the passages and loading the documents.
    """

    def __init__(
        self,
        encoder: str | os.PathLike | Callable[[list[str]], Any],
        corpus: Iterable[Any] | None = None,
        *,
        query_prefix: str = "query: ",
        passage_prefix: str = "passage: ",
        normalize: bool = True,
        batch_size: int = 256,
        encoder_kwargs: dict[str, Any] | None = None,
        show_progress: bool = True,
    ):
        self.encoder_kwargs = dict(encoder_kwargs or {})
        self.show_progress = show_progress
        if callable(encoder):
            self.encoder = encoder
            self.encoder_path: str | None = None
        else:
            self.encoder_path = str(encoder)
            self.encoder = TransformerEncoder(self.encoder_path, **self.encoder_kwargs)
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self.normalize, self.batch_size = normalize, int(batch_size)
        self.documents: list[dict[str, Any]] = []
        self._index: Any = None
        if corpus is not None:
            self.index(corpus)

    def _encode(self, texts: list[str]) -> Any:
        np = _numpy()
        emb = np.ascontiguousarray(np.asarray(self.encoder(texts), dtype="float32"))
        if emb.ndim != 2 or emb.shape[0] != len(texts):
            raise ValueError(f"the encoder returned shape {emb.shape} for {len(texts)} texts; expected (n, dim)")
        if self.normalize:
            norms = np.linalg.norm(emb, axis=1, keepdims=True)
            emb = emb / np.maximum(norms, 1e-12)
        return np.ascontiguousarray(emb, dtype="float32")

    def index(self, corpus: Iterable[Any]) -> "DenseRetriever":
        """(Re)build the index: encode every passage (with ``passage_prefix``) and add it to a flat IP index."""
        from tqdm.auto import tqdm

        faiss = _faiss()
        self.documents = index_documents(corpus)
        index = None
        with tqdm(total=len(self.documents), unit="passage", desc="encoding", disable=not self.show_progress) as bar:
            for start in range(0, len(self.documents), self.batch_size):
                batch = self.documents[start : start + self.batch_size]
                emb = self._encode([self.passage_prefix + doc["contents"] for doc in batch])
                if index is None:
                    index = faiss.IndexFlatIP(emb.shape[1])
                index.add(emb)
                bar.update(len(batch))
        self._index = index
        return self

    def __len__(self) -> int:
        return len(self.documents)

    def search(self, queries: Sequence[str] | str, topk: int = 3) -> list[list[dict[str, Any]]]:
        """For each query, the ``topk`` nearest passages as ``{"document": {...}, "score": float}``, best first."""
        if self._index is None:
            raise RuntimeError("the dense index is empty: call index(corpus) or load(dir) first")
        return search_documents(self.documents, queries, topk, self._retrieve)

    def _retrieve(self, queries: list[str], k: int) -> tuple[Any, Any]:
        scores, ids = self._index.search(self._encode([self.query_prefix + q for q in queries]), k)
        return ids, scores

    def save(self, directory: str | os.PathLike) -> None:
        """Write the faiss index, the documents and the settings (the encoder's path, if it has one)."""
        if self._index is None:
            raise RuntimeError("nothing to save: the index is empty")
        faiss = _faiss()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._index, str(path / _INDEX_FILE))
        meta = {
            "type": "dense",
            "num_documents": len(self.documents),
            "dim": int(self._index.d),
            "encoder": self.encoder_path,
            "encoder_kwargs": self.encoder_kwargs,
            "query_prefix": self.query_prefix,
            "passage_prefix": self.passage_prefix,
            "normalize": self.normalize,
        }
        write_index_files(path, self.documents, meta)

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike,
        encoder: str | os.PathLike | Callable[[list[str]], Any] | None = None,
        show_progress: bool = True,
    ) -> "DenseRetriever":
        """Load an index written by :meth:`save`. ``encoder`` overrides the saved encoder path (required when the
        index was built with a callable encoder)."""
        faiss = _faiss()
        path = Path(directory)
        meta = read_index_meta(directory, "dense", "DenseRetriever", "dense")
        encoder = encoder if encoder is not None else meta.get("encoder")
        if encoder is None:
            raise ValueError(f"the index in {directory} was built with a callable encoder: pass encoder=... to load it")
        self = cls(
            encoder,
            query_prefix=meta.get("query_prefix", "query: "),
            passage_prefix=meta.get("passage_prefix", "passage: "),
            normalize=meta.get("normalize", True),
            encoder_kwargs=meta.get("encoder_kwargs") or {},
            show_progress=show_progress,
        )
        self._index = faiss.read_index(str(path / _INDEX_FILE))
        self.documents = load_corpus(path / INDEX_DOCS_FILE, show_progress=show_progress)
        if self._index.ntotal != len(self.documents):
            raise ValueError(f"index has {self._index.ntotal} vectors but {len(self.documents)} documents")
        return self
