"""A synthetic search-QA task about fictional people, in Search-R1's file formats.

    python benchmarks/learning/make_task.py --out runs/learning/data [--people 480] [--test-people 120] [--seed 0]
    python benchmarks/learning/make_task.py --out runs/learning/twohop --hops 2

Writes ``corpus.jsonl`` (``{"id", "contents": "\\"Title\\"\\ntext"}``, one passage per person), ``train.jsonl`` and
``test.jsonl`` (``{"id", "question", "golden_answers"}``). Every name, place, guild and number is made up, so no
question can be answered closed-book; each answer appears verbatim in exactly one passage, the one about the person
the question names (BM25 finds it from the name), next to three other facts about that person. Teachers are other
people of the corpus, so a search for a name also returns passages that mention it as a teacher: the model has to
read the right passage and the right fact. Test questions are about people no training question mentions.

``--hops 2`` asks about a person's teacher ("In which town was the teacher of X born?"): search X, read the
teacher's name Y in X's passage, search Y, read the answer in Y's passage. Teachers are then drawn within the test
people and within the training people, along one cycle per group (nobody is their teacher's teacher), so a test
question and its chain mention only test people, and the passages a search for X returns (X's and X's student's) never
hold the answer: :func:`one_search_recall` measures how often one search with the question finds it anyway. Each
two-hop row also carries ``queries``, the two searches of a demonstration (the question, then the one-hop question
about the teacher), and ``train_onehop.jsonl`` holds the one-hop questions about the training people (demonstrations
of the search protocol without the chaining).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

_ONSETS = ["b", "br", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "qu", "r", "s", "sk", "t",
           "th", "tr", "v", "vr", "z"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
_CODAS = ["", "", "l", "n", "r", "s", "th", "x", "nd", "rk"]
_TOWN_ENDS = ["holt", "mere", "wick", "ford", "stead", "by", "haven", "moor"]
_GUILD_KINDS = ["Guild", "Society", "Company", "Order", "Circle", "League"]

# relation -> (sentence in the passage, question); {name}, {value} are filled in.
RELATIONS: dict[str, tuple[str, str]] = {
    "town": ("{name} was born in the town of {value}.", "In which town was {name} born?"),
    "teacher": ("{name} studied under {value}.", "Who was the teacher of {name}?"),
    "guild": ("{name} founded the {value}.", "Which guild did {name} found?"),
    "ships": ("{name} owned {value} ships.", "How many ships did {name} own?"),
}
# relation of the teacher -> two-hop question about the student {name}.
TWO_HOP: dict[str, str] = {
    "town": "In which town was the teacher of {name} born?",
    "teacher": "Who was the teacher of the teacher of {name}?",
    "guild": "Which guild did the teacher of {name} found?",
    "ships": "How many ships did the teacher of {name} own?",
}
_PRONOUNS = ("She", "He")


def _syllable(rng: random.Random) -> str:
    return rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)


def _word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    return "".join(_syllable(rng) for _ in range(rng.randint(*syllables))).capitalize()


def _unique(rng: random.Random, make, used: set[str]) -> str:
    while True:
        value = make(rng)
        if value not in used:
            used.add(value)
            return value


def make_people(n: int, rng: random.Random) -> list[dict[str, str]]:
    """``n`` people with a unique full name, a town, a teacher (another person), a guild and a ship count."""
    used: set[str] = set()
    names = [_unique(rng, lambda r: f"{_word(r, (1, 2))} {_word(r)}", used) for _ in range(n)]
    people = []
    for i, name in enumerate(names):
        teacher = names[(i + rng.randint(1, n - 1)) % n]
        people.append({
            "name": name,
            "town": _unique(rng, lambda r: _word(r, (1, 2)) + r.choice(_TOWN_ENDS), used),
            "teacher": teacher,
            "guild": _unique(rng, lambda r: f"{_word(r)} {r.choice(_GUILD_KINDS)}", used),
            "ships": str(rng.randint(3, 97)),
        })
    return people


def passage(person: dict[str, str], rng: random.Random) -> str:
    """Search-R1 ``contents``: the title line, then the four facts in a random order (the first names the person,
    the others say "She" or "He")."""
    order = list(RELATIONS)
    rng.shuffle(order)
    pronoun = rng.choice(_PRONOUNS)
    facts = [RELATIONS[rel][0].format(name=person["name"] if i == 0 else pronoun, value=person[rel])
             for i, rel in enumerate(order)]
    return f'"{person["name"]}"\n' + " ".join(facts)


def questions(people: list[dict[str, str]], prefix: str) -> list[dict[str, object]]:
    rows = []
    for person in people:
        for rel, (_, question) in RELATIONS.items():
            rows.append({"id": f"{prefix}{len(rows)}", "question": question.format(name=person["name"]),
                         "golden_answers": [person[rel]]})
    return rows


def chain_teachers(people: list[dict[str, str]], rng: random.Random) -> None:
    """Make each person's teacher the next one along a random cycle through ``people`` (in place): every teacher is
    in the group, and for three or more people nobody is their teacher's teacher."""
    order = list(range(len(people)))
    rng.shuffle(order)
    for k, i in enumerate(order):
        people[i]["teacher"] = people[order[(k + 1) % len(order)]]["name"]


def two_hop_questions(people: list[dict[str, str]], prefix: str) -> list[dict[str, object]]:
    """Questions about each person's teacher, with the two searches of a demonstration in ``queries``."""
    by_name = {p["name"]: p for p in people}
    rows = []
    for person in people:
        teacher = by_name[person["teacher"]]
        for rel, question in TWO_HOP.items():
            rows.append({"id": f"{prefix}{len(rows)}", "question": question.format(name=person["name"]),
                         "golden_answers": [teacher[rel]],
                         "queries": [question.format(name=person["name"]),
                                     RELATIONS[rel][1].format(name=teacher["name"])]})
    return rows


def one_search_recall(corpus: Path, rows: list[dict[str, object]], k: int) -> float:
    """The fraction of ``rows`` whose gold answer (SQuAD-normalised, as whole words: "Rathmere" is not in
    "Keixdrathmere") is in the ``k`` passages BM25 returns for one search with the question itself: how often the
    task can be solved without chaining."""
    from trl_agentic.rewards.verifiers.qa import normalize_answer
    from trl_agentic.tools import BM25Retriever

    def words(text: str) -> str:
        return f" {normalize_answer(text)} "

    retriever = BM25Retriever.from_jsonl(corpus, show_progress=False)
    hits = retriever.search([str(r["question"]) for r in rows], topk=k)
    found = [any(words(g) in words(h["document"]["contents"]) for h in row_hits for g in r["golden_answers"])
             for r, row_hits in zip(rows, hits)]
    return sum(found) / max(len(found), 1)


def write_jsonl(rows: list[dict[str, object]], path: Path) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def make_task(out: Path, people: int = 480, test_people: int = 120, train_questions: int = 400,
              test_questions: int = 120, seed: int = 0, hops: int = 1) -> None:
    if hops not in (1, 2):
        raise ValueError(f"hops must be 1 or 2, got {hops}")
    rng = random.Random(seed)
    everyone = make_people(people, rng)
    if hops == 2:
        chain_teachers(everyone[:test_people], rng)
        chain_teachers(everyone[test_people:], rng)
    corpus = [{"id": str(i), "contents": passage(p, rng)} for i, p in enumerate(everyone)]
    ask = questions if hops == 1 else two_hop_questions
    train = ask(everyone[test_people:], "train-")
    test = ask(everyone[:test_people], "test-")
    rng.shuffle(train)
    rng.shuffle(test)
    out.mkdir(parents=True, exist_ok=True)
    if hops == 2:
        onehop = questions(everyone[test_people:], "train-onehop-")
        rng.shuffle(onehop)
        write_jsonl(onehop[:train_questions], out / "train_onehop.jsonl")
    write_jsonl(corpus, out / "corpus.jsonl")
    write_jsonl(train[:train_questions], out / "train.jsonl")
    write_jsonl(test[:test_questions], out / "test.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/learning/data"))
    parser.add_argument("--people", type=int, default=480, help="passages in the corpus (one per person)")
    parser.add_argument("--test-people", type=int, default=120, help="people reserved for test questions")
    parser.add_argument("--train-questions", type=int, default=400)
    parser.add_argument("--test-questions", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hops", type=int, default=1, choices=[1, 2], help="searches a question needs")
    parser.add_argument("--check-topk", type=int, nargs="*", default=[],
                        help="print the fraction of test questions answered by the top k of one search, per k")
    args = parser.parse_args()
    make_task(args.out, args.people, args.test_people, args.train_questions, args.test_questions, args.seed,
              args.hops)
    extra = ", train_onehop.jsonl" if args.hops == 2 else ""
    print(f"wrote {args.out}/corpus.jsonl, train.jsonl, test.jsonl{extra}")
    test = [json.loads(line) for line in (args.out / "test.jsonl").read_text(encoding="utf-8").splitlines()]
    for k in args.check_topk:
        print(f"test questions whose answer is in the top {k} of one search with the question: "
              f"{one_search_recall(args.out / 'corpus.jsonl', test, k):.3f} ({len(test)} questions)")


if __name__ == "__main__":
    main()
