"""benchmarks/learning/make_task.py: the one-hop files are unchanged, the two-hop questions need both searches."""

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "learning"
pytest.importorskip("bm25s")


def _make_task():
    spec = importlib.util.spec_from_file_location("learning_make_task", BENCHMARK / "make_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _facts(corpus):
    """Each person's facts, read back from the passage text (not from the generator's data)."""
    facts = {}
    for row in corpus:
        title, text = row["contents"].split("\n", 1)
        facts[title.strip('"')] = {
            "town": re.search(r"born in the town of (.+?)\.", text).group(1),
            "teacher": re.search(r"studied under (.+?)\.", text).group(1),
            "guild": re.search(r"founded the (.+?)\.", text).group(1),
            "ships": re.search(r"owned (\d+) ships", text).group(1),
        }
    return facts


_TWO_HOP = [(re.compile(r"In which town was the teacher of (.+) born\?"), "town"),
            (re.compile(r"Who was the teacher of the teacher of (.+)\?"), "teacher"),
            (re.compile(r"Which guild did the teacher of (.+) found\?"), "guild"),
            (re.compile(r"How many ships did the teacher of (.+) own\?"), "ships")]


def _parse(question):
    for pattern, relation in _TWO_HOP:
        match = pattern.fullmatch(question)
        if match:
            return match.group(1), relation
    raise AssertionError(f"not a two-hop question: {question}")


def test_one_hop_files_are_those_of_the_published_table(tmp_path):
    # sha1 of the files written at 99a13e9 (before --hops existed), the data of the one-hop table in docs/benchmarks.md
    _make_task().make_task(tmp_path)
    digests = {name: hashlib.sha1((tmp_path / name).read_bytes()).hexdigest()
               for name in ("corpus.jsonl", "train.jsonl", "test.jsonl")}
    assert digests == {"corpus.jsonl": "9df892990b4c701751773e55076b07ac24ee171a",
                       "train.jsonl": "810959b1f8491df48006cf65f2e0a87bc828aa85",
                       "test.jsonl": "4d80c72a51a4a1eb6fe484311c0b2c3b1ce4d1ff"}
    assert not (tmp_path / "train_onehop.jsonl").exists()


@pytest.fixture(scope="module")
def two_hop(tmp_path_factory):
    out = tmp_path_factory.mktemp("twohop")
    _make_task().make_task(out, people=90, test_people=30, train_questions=200, test_questions=80, seed=3, hops=2)
    return out


def test_two_hop_answers_follow_the_teacher_in_the_corpus(two_hop):
    facts = _facts(_rows(two_hop / "corpus.jsonl"))
    for name in ("train.jsonl", "test.jsonl"):
        rows = _rows(two_hop / name)
        assert {_parse(r["question"])[1] for r in rows} == {"town", "teacher", "guild", "ships"}
        for row in rows:
            person, relation = _parse(row["question"])
            teacher = facts[person]["teacher"]
            assert row["golden_answers"] == [facts[teacher][relation]]
            assert facts[teacher]["teacher"] != person  # nobody is their teacher's teacher
            assert row["queries"][0] == row["question"] and teacher in row["queries"][1]


def test_test_chains_mention_no_person_of_a_training_question(two_hop):
    facts = _facts(_rows(two_hop / "corpus.jsonl"))
    training_text = " ".join(r["question"] + " " + " ".join(r.get("queries", []))
                             for name in ("train.jsonl", "train_onehop.jsonl") for r in _rows(two_hop / name))
    test = _rows(two_hop / "test.jsonl")
    assert test
    for row in test:
        person, _ = _parse(row["question"])
        for name in (person, facts[person]["teacher"]):
            assert name not in training_text
    onehop = _rows(two_hop / "train_onehop.jsonl")
    assert len(onehop) == 200 and not any(p.fullmatch(r["question"]) for r in onehop for p, _ in _TWO_HOP)


def test_one_search_rarely_finds_the_answer_and_the_two_searches_do(two_hop):
    make_task = _make_task()
    from trl_agentic.rewards.verifiers.qa import normalize_answer
    from trl_agentic.tools import BM25Retriever

    corpus, test = two_hop / "corpus.jsonl", _rows(two_hop / "test.jsonl")
    assert make_task.one_search_recall(corpus, test, 2) <= 0.05
    # the measure can say 1: the demonstrations' second search finds every answer
    second = [{"question": r["queries"][1], "golden_answers": r["golden_answers"]} for r in test]
    assert make_task.one_search_recall(corpus, second, 2) == 1.0
    # and the first search returns the teacher's name, the second query is built from it
    retriever = BM25Retriever.from_jsonl(corpus, show_progress=False)
    facts = _facts(_rows(corpus))
    for row, hits in zip(test, retriever.search([r["queries"][0] for r in test], topk=2)):
        teacher = facts[_parse(row["question"])[0]]["teacher"]
        assert any(normalize_answer(teacher) in normalize_answer(h["document"]["contents"]) for h in hits)


def test_two_hop_files_are_deterministic(two_hop, tmp_path):
    _make_task().make_task(tmp_path, people=90, test_people=30, train_questions=200, test_questions=80, seed=3,
                           hops=2)
    for name in ("corpus.jsonl", "train.jsonl", "test.jsonl", "train_onehop.jsonl"):
        assert (tmp_path / name).read_bytes() == (two_hop / name).read_bytes()


def test_hops_other_than_one_or_two_fail(tmp_path):
    with pytest.raises(ValueError, match="hops must be 1 or 2"):
        _make_task().make_task(tmp_path, hops=3)


def test_one_search_recall_matches_whole_words(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": text}) + "\n" for i, text in enumerate(
        ['"Ann Lo"\nAnn Lo was born in Keixdrathmere.', '"Bo Ri"\nBo Ri was born in Rathmere.', '"Cy"\nCy sang.'])))
    rows = [{"question": "Where was Ann Lo born?", "golden_answers": ["Rathmere"]},
            {"question": "Where was Bo Ri born?", "golden_answers": ["Rathmere", "Nowhere"]}]
    assert _make_task().one_search_recall(corpus, rows, 1) == 0.5


def _transfer_module():
    spec = importlib.util.spec_from_file_location("learning_make_transfer_task", BENCHMARK / "make_transfer_task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_transfer_task_is_another_generator_and_needs_both_searches(tmp_path, two_hop):
    """make_transfer_task.py: every answer is the mentor's fact as the corpus states it, in sentences and question
    templates make_task.py never writes, with names that appear in no passage of make_task's corpus; one search with
    the question never finds the answer, the solution's two searches always do."""
    module = _transfer_module()
    out = tmp_path / "transfer"
    module.make_transfer_task(out, people=40, test_questions=60, seed=3)
    corpus, test = _rows(out / "corpus.jsonl"), _rows(out / "test.jsonl")
    facts = {}
    for row in corpus:
        title, text = row["contents"].split("\n", 1)
        facts[title.strip('"')] = {
            "mentor": re.search(r"learned the trade from (.+?)\.", text).group(1),
            "village": re.search(r"grew up in (.+?)\.", text).group(1),
            "year": re.search(r"was born in (\d+)\.", text).group(1),
        }
    for row in test:
        name = next(n for n in facts if n in row["question"])
        mentor = facts[name]["mentor"]
        assert mentor in row["queries"][1]
        for relation in ("village", "year", "mentor"):
            if row["golden_answers"][0] == facts[mentor][relation]:
                break
        else:  # instrument and street: stated in the mentor's passage
            passage = next(r["contents"] for r in corpus if r["contents"].startswith(f'"{mentor}"'))
            assert row["golden_answers"][0] in passage
    original = [json.loads(line)["question"] for line in (two_hop / "test.jsonl").read_text().splitlines()]
    templates = {re.sub(r"[A-Z][a-z]+ [A-Z][a-z]+", "X", q) for q in original}
    assert not templates & {re.sub(r"[A-Z][a-z]+ [A-Z][a-z]+", "X", r["question"]) for r in test}
    other_corpus = (two_hop / "corpus.jsonl").read_text()
    assert not any(name in other_corpus for name in facts)
    make_task = _make_task()
    assert make_task.one_search_recall(out / "corpus.jsonl", test, 2) < 0.1
    solved = [row | {"question": row["queries"][1]} for row in test]
    assert make_task.one_search_recall(out / "corpus.jsonl", solved, 2) == 1.0
    again = tmp_path / "again"
    module.make_transfer_task(again, people=40, test_questions=60, seed=3)
    assert (again / "test.jsonl").read_bytes() == (out / "test.jsonl").read_bytes()
