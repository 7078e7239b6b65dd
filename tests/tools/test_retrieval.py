"""BM25, the Search-R1 HTTP API (server and client), and the search tool."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from trl_agentic.tools import SearchTool
from trl_agentic.tools.retrieval import (
    BM25Retriever,
    RetrievalClient,
    RetrievalServer,
    RetrievalServerError,
    format_search_results,
    load_corpus,
    load_retriever,
    make_document,
    split_title,
    write_corpus,
)

pytest.importorskip("bm25s")

DOCS = [
    {"id": "0", "contents": '"Paris"\nParis is the capital and most populous city of France.'},
    {"id": "1", "contents": '"Berlin"\nBerlin is the capital and largest city of Germany.'},
    {"id": "2", "contents": '"Python (programming language)"\nPython is a high-level programming language.'},
    {"id": "3", "contents": '"Mount Everest"\nMount Everest is the highest mountain above sea level.\nIt is in Nepal.'},
    {"id": "4", "contents": '"Amazon River"\nThe Amazon river in South America is the largest river by discharge.'},
    {"id": "5", "contents": '"Jupiter"\nJupiter is the fifth planet from the Sun and the largest in the Solar System.'},
    {"id": "6", "contents": '"Photosynthesis"\nPhotosynthesis converts light energy into chemical energy in plants.'},
    {"id": "7", "contents": '"Hamlet"\nHamlet is a tragedy written by William Shakespeare.'},
]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    write_corpus(DOCS, path)
    return path


@pytest.fixture(scope="module")
def bm25(corpus_file):
    return BM25Retriever.from_jsonl(corpus_file)


def test_corpus_helpers(corpus_file, tmp_path):
    docs = load_corpus(corpus_file)
    assert docs == DOCS
    assert split_title(DOCS[3]["contents"]) == (
        '"Mount Everest"',
        "Mount Everest is the highest mountain above sea level.\nIt is in Nepal.",
    )
    assert split_title(DOCS[0]["contents"], strip_quotes=True)[0] == "Paris"
    assert make_document({"title": "T", "text": "body"}, 4) == {
        "title": "T",
        "text": "body",
        "contents": '"T"\nbody',
        "id": "4",
    }
    assert make_document("plain text", 2) == {"id": "2", "contents": "plain text"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "x"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_corpus(bad)


def test_bm25_finds_the_right_passage(bm25):
    results = bm25.search(["capital of France", "who wrote Hamlet", "largest planet solar system"], topk=3)
    assert [r[0]["document"]["id"] for r in results] == ["0", "7", "5"]
    assert all(1 <= len(r) <= 3 and all(h["score"] > 0 for h in r) for r in results)  # matching documents only
    hit = results[0][0]
    assert set(hit) == {"document", "score"} and isinstance(hit["score"], float) and hit["score"] > 0
    assert hit["document"] == DOCS[0]
    scores = [h["score"] for h in results[0]]
    assert scores == sorted(scores, reverse=True)


def test_bm25_edge_cases(bm25):
    assert len(bm25.search(["capital"], topk=100)[0]) == 2  # topk larger than the corpus: every matching document
    assert bm25.search(["zzzz unknownword"], topk=2) == [[]]  # no word in common: no hit
    assert bm25.search(["the of and"], topk=2) and bm25.search([], topk=2) == []
    assert bm25.search("capital of Germany", topk=1)[0][0]["document"]["id"] == "1"
    assert bm25.search(["x"], topk=0) == [[]]
    with pytest.raises(ValueError):
        BM25Retriever([])
    with pytest.raises(RuntimeError):
        BM25Retriever().search(["q"])


def test_bm25_save_load_gives_the_same_results(bm25, tmp_path):
    bm25.save(tmp_path / "index")
    loaded = BM25Retriever.load(tmp_path / "index")
    queries = ["capital city", "highest mountain Nepal", "programming language", "river discharge"]
    assert loaded.search(queries, topk=4) == bm25.search(queries, topk=4)
    assert len(loaded) == len(bm25)
    auto = load_retriever(tmp_path / "index")
    assert isinstance(auto, BM25Retriever)
    assert auto.search(queries, topk=2) == bm25.search(queries, topk=2)
    mmapped = BM25Retriever.load(tmp_path / "index", mmap=True)
    assert mmapped.search(queries, topk=2) == bm25.search(queries, topk=2)
    with pytest.raises(FileNotFoundError):
        load_retriever(tmp_path)


def test_format_matches_search_r1(bm25):
    hits = bm25.search(["Mount Everest Nepal, the largest river"], topk=2)[0]
    text = format_search_results(hits)
    first = text.split("\n")[0]
    assert first == 'Doc 1(Title: "Mount Everest") Mount Everest is the highest mountain above sea level.'
    # multi-line texts keep their newlines, as Search-R1's "\n".join(lines[1:])
    assert text.startswith(
        'Doc 1(Title: "Mount Everest") Mount Everest is the highest mountain above sea level.\nIt is in Nepal.\nDoc 2('
    )
    assert format_search_results(hits, strip_title_quotes=True).startswith("Doc 1(Title: Mount Everest) ")
    # bare documents (return_scores=False answers) render the same way
    assert format_search_results([h["document"] for h in hits]) == text


def test_search_tool_in_process(bm25):
    tool = SearchTool(bm25, topk=2)
    text = tool("capital of Germany")
    assert text.startswith('Doc 1(Title: "Berlin") Berlin is the capital')
    assert text.count("Doc ") == 2 and not text.endswith("\n")
    out = tool.invoke("   ")
    assert out.error and "empty" in out.observation and tool.num_errors == 1
    outs = tool.search_batch(["Hamlet", "", "Jupiter"])
    assert [o.error for o in outs] == [False, True, False]
    assert "Shakespeare" in outs[0].observation and "Jupiter" in outs[2].observation
    assert "Jupiter" in __import__("asyncio").run(tool.acall("Jupiter planet"))
    small = SearchTool(bm25, topk=3, max_output_chars=60).invoke("capital")
    assert small.observation_truncated and len(small.observation) < 120
    with pytest.raises(TypeError):
        SearchTool(object())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_server_client_round_trip(bm25):
    with RetrievalServer(bm25, port=0) as server:
        assert server.host == "127.0.0.1" and server.url.endswith("/retrieve")
        client = RetrievalClient(server.url, timeout=5)
        queries = ["capital of France", "Shakespeare tragedy"]
        assert client.search(queries, topk=3) == bm25.search(queries, topk=3)
        assert client.health() == {"status": "ok", "documents": len(DOCS)}
        # raw Search-R1 answers
        with_scores = client.retrieve(queries, topk=2, return_scores=True)
        assert set(with_scores[0][0]) == {"document", "score"}
        without = client.retrieve(queries, topk=2, return_scores=False)
        assert without[0][0] == DOCS[0] and "score" not in without[0][0]
        default_topk = client.retrieve(["the largest city, capital or planet"], topk=None)
        assert len(default_topk[0]) == 3  # server default, as Search-R1's "if not request.topk"
        # base URL without path works too
        assert RetrievalClient(f"127.0.0.1:{server.port}").search(["Berlin"], 1)[0][0]["document"]["id"] == "1"
        # the tool over HTTP gives the same text as in process
        assert SearchTool(client, topk=3)("Amazon river") == SearchTool(bm25, topk=3)("Amazon river")


def test_server_speaks_search_r1_json_exactly(bm25):
    with RetrievalServer(bm25, port=0, default_topk=2) as server:
        body = json.dumps({"queries": ["Everest"], "topk": 1, "return_scores": True}).encode()
        req = urllib.request.Request(server.url, data=body, headers={"Content-Type": "application/json"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=5) as resp:
            payload = json.loads(resp.read())
        assert list(payload) == ["result"]
        assert payload["result"][0][0]["document"] == DOCS[3]
        body = json.dumps({"queries": ["Everest highest capital"]}).encode()  # no topk, no return_scores (defaults)
        with opener.open(urllib.request.Request(server.url, data=body), timeout=5) as resp:
            payload = json.loads(resp.read())
        assert payload["result"][0][0] == DOCS[3] and len(payload["result"][0]) == 2


def test_bad_requests_are_400_and_not_retried(bm25):
    with RetrievalServer(bm25, port=0) as server:
        client = RetrievalClient(server.url, retries=3, backoff=0.01)
        for payload in ({"queries": "not a list of str", "topk": "3"}, {"queries": [1, 2]}, {"topk": 3}):
            with pytest.raises(RetrievalServerError) as info:
                client._post(client.url, payload)
            assert info.value.status == 400 and info.value.attempts == 1
        with pytest.raises(RetrievalServerError) as info:
            RetrievalClient(server.url.replace("/retrieve", "/nope"), retries=2, backoff=0.01).search(["x"])
        assert info.value.status == 404 and info.value.attempts == 1


def test_client_against_a_closed_port_fails_fast_with_a_hint():
    port = _free_port()
    client = RetrievalClient(f"http://127.0.0.1:{port}/retrieve", timeout=0.5, retries=2, backoff=0.01)
    start = time.monotonic()
    with pytest.raises(RetrievalServerError) as info:
        client.search(["anything"])
    assert time.monotonic() - start < 3
    err = info.value
    assert err.attempts == 3 and err.url == f"http://127.0.0.1:{port}/retrieve"
    message = str(err)
    assert f"127.0.0.1:{port}" in message and "unreachable" in message
    assert "python -m trl_agentic.tools.retrieval.server" in message and f"--port {port}" in message
    # as a tool: an error text, counted, never an exception
    tool = SearchTool(client)
    out = tool.invoke("who wrote hamlet")
    assert out.error and out.observation.startswith("Error: search failed (RetrievalServerError")
    assert tool.num_errors == 1 and "unreachable" in tool.last_error


def test_client_times_out_on_a_silent_server():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (backlog) but never answers
    try:
        client = RetrievalClient(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.3, retries=1, backoff=0.01)
        start = time.monotonic()
        with pytest.raises(RetrievalServerError, match="timed out"):
            client.search(["q"])
        assert time.monotonic() - start < 3
    finally:
        silent.close()


def test_client_retries_server_errors_with_backoff(bm25):
    class Flaky:
        def __init__(self):
            self.calls = 0

        def search(self, queries, topk):
            self.calls += 1
            if self.calls < 3:
                raise RuntimeError("index not loaded yet")
            return bm25.search(queries, topk)

        def __len__(self):
            return len(bm25)

    flaky = Flaky()
    with RetrievalServer(flaky, port=0) as server:
        client = RetrievalClient(server.url, retries=3, backoff=0.05, jitter=0)
        start = time.monotonic()
        result = client.search(["Paris"], topk=1)
        elapsed = time.monotonic() - start
    assert result[0][0]["document"]["id"] == "0" and flaky.calls == 3
    assert elapsed >= 0.05 + 0.1  # two waits: 0.05 then 0.1


def test_server_handles_concurrent_clients(bm25):
    with RetrievalServer(bm25, port=0) as server:
        client = RetrievalClient(server.url)
        results, errors = [], []

        def worker(q):
            try:
                results.append(client.search([q], topk=1)[0][0]["document"]["id"])
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(q,)) for q in ["Paris France", "Hamlet"] * 10]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors and sorted(results) == ["0"] * 10 + ["7"] * 10


def test_server_cli(bm25, tmp_path):
    bm25.save(tmp_path / "index")
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trl_agentic.tools.retrieval.server",
            "--index",
            str(tmp_path / "index"),
            "--port",
            str(port),
            "--topk",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        client = RetrievalClient(f"http://127.0.0.1:{port}", timeout=1, retries=40, backoff=0.1, max_backoff=0.2)
        result = client.search(["tragedy by Shakespeare"], topk=1)
        assert result[0][0]["document"]["id"] == "7"
        assert len(client.retrieve(["capital city"], topk=None, return_scores=False)[0]) == 2
    finally:
        proc.terminate()
        proc.wait(10)
    log = proc.stdout.read()
    assert log.count("listening on") == 1 and "DEBUG" not in log, log


def test_bm25_returns_no_hit_that_shares_no_word(bm25):
    """Top-k is not filled with score-0 documents: a query matching one document gets one hit, none gets none."""
    (hits,) = bm25.search("tragedy Shakespeare", topk=3)
    assert [h["document"]["id"] for h in hits] == ["7"] and hits[0]["score"] > 0
    assert bm25.search(["zzzz unknownword"], topk=3) == [[]]


def test_retrieval_modules_import_no_cycle():
    """No module of the retrieval package imports (even inside a function) one that imports it back."""
    import ast
    from pathlib import Path

    import trl_agentic.tools.retrieval as package

    folder = Path(package.__file__).parent
    graph = {}
    for path in folder.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                imported |= {node.module} if node.module else {alias.name for alias in node.names}
        graph[path.stem] = imported - {"__init__"}

    def reaches(start, goal, seen=()):
        return any(m == goal or (m not in seen and reaches(m, goal, (*seen, m))) for m in graph.get(start, ()))

    cycles = [name for name in graph if name != "__init__" and reaches(name, name)]
    assert not cycles, {name: graph[name] for name in cycles}


def test_index_building_shows_progress_only_when_asked(corpus_file, capfd):
    BM25Retriever.from_jsonl(corpus_file, show_progress=False)
    assert capfd.readouterr().err == ""
    BM25Retriever.from_jsonl(corpus_file, show_progress=True)
    err = capfd.readouterr().err
    assert "reading corpus.jsonl" in err and "100%" in err


def test_a_corpus_without_an_indexable_word_is_refused_clearly():
    with pytest.raises(ValueError, match="without a single indexable word"):
        BM25Retriever([{"id": "0", "contents": "a the of"}, {"id": "1", "contents": ""}], show_progress=False)


def test_server_without_fastapi_says_what_to_install(bm25, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the extra were not installed
    with pytest.raises(ImportError, match=r"pip install trl-agentic\[retrieval\]"):
        RetrievalServer(bm25, port=0)
