"""DenseRetriever mechanics: a tiny randomly initialised BERT with a tokenizer trained on the spot (no hub), and a
callable encoder. These check the plumbing (prefixes, pooling, normalisation, faiss, save/load), not quality."""

from __future__ import annotations

import hashlib

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("faiss")

from trl_agentic.tools import SearchTool  # noqa: E402
from trl_agentic.tools.retrieval import DenseRetriever, RetrievalClient, RetrievalServer, load_retriever  # noqa: E402

PASSAGES = [
    '"Alpha"\nalpha beta gamma delta epsilon',
    '"Zeta"\nzeta eta theta iota kappa',
    '"Lambda"\nlambda mu nu xi omicron',
    '"Pi"\npi rho sigma tau upsilon',
    '"Phi"\nphi chi psi omega alpha',
    '"Numbers"\none two three four five six',
]
DOCS = [{"id": str(i), "contents": c} for i, c in enumerate(PASSAGES)]


def hashing_encoder(texts):
    """Bag of words hashed into 64 dims (prefix words included), a deterministic stand-in encoder."""
    out = np.zeros((len(texts), 64), dtype="float32")
    for i, text in enumerate(texts):
        for word in text.replace('"', " ").replace(":", " ").split():
            out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
    return out


def test_callable_encoder_mechanics(tmp_path):
    seen = []

    def encoder(texts):
        seen.extend(texts)
        return hashing_encoder(texts)

    retriever = DenseRetriever(encoder, DOCS, batch_size=4)
    assert seen[0].startswith("passage: ") and len(seen) == len(DOCS)
    for doc in DOCS:
        hits = retriever.search([doc["contents"]], topk=3)[0]
        assert hits[0]["document"]["id"] == doc["id"]
        assert hits[0]["score"] == pytest.approx(max(h["score"] for h in hits))
        assert hits[0]["score"] <= 1.0 + 1e-5  # normalised: inner product is a cosine
    assert seen[-1].startswith("query: ")
    assert len(retriever.search(["x"], topk=100)[0]) == len(DOCS)
    retriever.save(tmp_path / "dense")
    with pytest.raises(ValueError, match="encoder="):
        DenseRetriever.load(tmp_path / "dense")
    loaded = load_retriever(tmp_path / "dense", encoder=hashing_encoder)
    queries = ["zeta theta", "one two", "omega"]
    assert loaded.search(queries, topk=3) == retriever.search(queries, topk=3)


def test_encoder_with_wrong_shape_is_reported():
    with pytest.raises(ValueError, match="shape"):
        DenseRetriever(lambda texts: np.zeros((1, 4)), DOCS)


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    path = tmp_path_factory.mktemp("tiny-bert")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(PASSAGES + ["query: passage:"] * 3, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    fast.save_pretrained(path)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    transformers.BertModel(config).save_pretrained(path)
    return str(path)


def test_tiny_bert_mechanics(tiny_bert_dir, tmp_path):
    retriever = DenseRetriever(tiny_bert_dir, DOCS, encoder_kwargs={"device": "cpu", "max_length": 32})
    emb = retriever.encoder(["query: alpha", "passage: zeta"])
    assert emb.shape == (2, 32) and emb.dtype == np.float32
    assert np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    for doc in DOCS:
        assert retriever.search([doc["contents"]], topk=2)[0][0]["document"]["id"] == doc["id"]
    retriever.save(tmp_path / "index")
    loaded = load_retriever(tmp_path / "index")  # reloads the encoder from the saved path
    assert loaded.encoder_path == tiny_bert_dir
    queries = [d["contents"] for d in DOCS]
    a, b = loaded.search(queries, topk=3), retriever.search(queries, topk=3)
    assert [[h["document"]["id"] for h in row] for row in a] == [[h["document"]["id"] for h in row] for row in b]
    assert np.allclose([h["score"] for row in a for h in row], [h["score"] for row in b for h in row], atol=1e-5)
    # cls pooling also works
    cls = DenseRetriever(tiny_bert_dir, DOCS[:2], encoder_kwargs={"device": "cpu", "pooling": "cls"})
    assert len(cls.search(["alpha"], topk=2)[0]) == 2


def test_dense_behind_the_server(tmp_path):
    retriever = DenseRetriever(hashing_encoder, DOCS)
    with RetrievalServer(retriever, port=0) as server:
        tool = SearchTool(RetrievalClient(server.url), topk=1)
        assert tool("lambda mu nu").startswith('Doc 1(Title: "Lambda") lambda mu nu xi omicron')


def test_encoding_shows_progress_only_when_asked(capfd):
    DenseRetriever(hashing_encoder, DOCS, batch_size=2, show_progress=False)
    assert capfd.readouterr().err == ""
    DenseRetriever(hashing_encoder, DOCS, batch_size=2, show_progress=True)
    err = capfd.readouterr().err
    assert "encoding" in err and f"{len(DOCS)}/{len(DOCS)}" in err
