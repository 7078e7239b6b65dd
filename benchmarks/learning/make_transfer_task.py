"""A second two-hop search-QA task, written by another generator: other relations, other sentences, other question
templates than ``make_task.py``'s, for measuring whether what SFT and RL taught carries over (never trained on).

    python benchmarks/learning/make_transfer_task.py --out runs/twohop/transfer [--people 300] [--seed 0]

Same file formats as ``make_task.py --hops 2`` (``corpus.jsonl``, ``test.jsonl``; ``train.jsonl`` only so that the
folder reads like any task's: nothing is trained on it). The people are craftspeople: each grew up in a village,
learned the trade from a mentor (another person, along one cycle: nobody is their mentor's mentor), played an
instrument, was born in a year and kept a workshop on a street; the passage states the five facts in its own words
("learned the trade from", "grew up in") and in a random order. Each test question asks about a person's mentor in
one of two templates per relation that ``make_task.py`` never uses ("What instrument did X's mentor play?", "In
what year was the person who taught X the trade born?"); its ``queries`` are the two searches of a solution (the
question, then a question about the mentor by name). The names come from other syllables than ``make_task.py``'s,
so no name of one task can be found in the other's corpus.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_task import write_jsonl  # noqa: E402

_ONSETS = ["c", "ch", "cl", "j", "l", "m", "n", "p", "pl", "s", "sh", "st", "w", "y"]
_VOWELS = ["a", "ia", "o", "oa", "u", "y", "ee"]
_CODAS = ["", "", "m", "ng", "sh", "t", "ck", "ll"]
_VILLAGE_ENDS = ["ton", "dale", "bridge", "field", "combe", "wold"]
_INSTRUMENTS = ["harp", "viol", "horn", "pipe", "drum", "lute"]

# relation -> (sentence of the passage, one-hop question, two-hop question templates about the student {name});
# {name} and {value} are filled in, {mentor} is the mentor's name in the one-hop question of a solution.
RELATIONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "village": ("{name} grew up in {value}.", "Where did {name} grow up?",
                ("Where did the mentor of {name} grow up?", "In which village did {name}'s mentor grow up?")),
    "mentor": ("{name} learned the trade from {value}.", "From whom did {name} learn the trade?",
               ("Who taught the trade to the mentor of {name}?", "From whom did {name}'s mentor learn the trade?")),
    "instrument": ("{name} played the {value}.", "Which instrument did {name} play?",
                   ("What instrument did {name}'s mentor play?", "Which instrument was played by the mentor of "
                    "{name}?")),
    "year": ("{name} was born in {value}.", "In what year was {name} born?",
             ("In what year was the person who taught {name} the trade born?", "When was {name}'s mentor born?")),
    "street": ("{name} kept a workshop on {value}.", "On which street did {name} keep a workshop?",
               ("On which street was the workshop of {name}'s mentor?", "Where did the mentor of {name} keep a "
                "workshop?")),
}
_PRONOUNS = ("She", "He")


def _word(rng: random.Random, syllables: tuple[int, int] = (2, 3)) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
                   for _ in range(rng.randint(*syllables))).capitalize()


def _unique(rng: random.Random, make, used: set[str]) -> str:
    while True:
        value = make(rng)
        if value not in used:
            used.add(value)
            return value


def make_people(n: int, rng: random.Random) -> list[dict[str, str]]:
    """``n`` craftspeople, each with a unique name, village, instrument and street; mentors along one cycle."""
    used: set[str] = set()
    people = [{
        "name": _unique(rng, lambda r: f"{_word(r, (1, 2))} {_word(r)}", used),
        "village": _unique(rng, lambda r: _word(r, (1, 2)) + r.choice(_VILLAGE_ENDS), used),
        "instrument": _unique(rng, lambda r: f"{_word(r, (1, 2))} {r.choice(_INSTRUMENTS)}", used),
        "year": str(rng.randint(1420, 1890)),
        "street": _unique(rng, lambda r: f"{_word(r)} Street", used),
    } for _ in range(n)]
    order = list(range(n))
    rng.shuffle(order)
    for k, i in enumerate(order):
        people[i]["mentor"] = people[order[(k + 1) % n]]["name"]
    return people


def passage(person: dict[str, str], rng: random.Random) -> str:
    """``"Name"\\n`` then the five facts in a random order, the first naming the person, the others a pronoun."""
    order = list(RELATIONS)
    rng.shuffle(order)
    pronoun = rng.choice(_PRONOUNS)
    facts = [RELATIONS[relation][0].format(name=person["name"] if i == 0 else pronoun, value=person[relation])
             for i, relation in enumerate(order)]
    return f'"{person["name"]}"\n' + " ".join(facts)


def questions(people: list[dict[str, str]], prefix: str, rng: random.Random) -> list[dict[str, object]]:
    """One two-hop question per person and relation, in one of the relation's two templates."""
    by_name = {p["name"]: p for p in people}
    rows = []
    for person in people:
        mentor = by_name[person["mentor"]]
        for relation, (_, one_hop, templates) in RELATIONS.items():
            question = rng.choice(templates).format(name=person["name"])
            rows.append({"id": f"{prefix}{len(rows)}", "question": question, "golden_answers": [mentor[relation]],
                         "queries": [question, one_hop.format(name=mentor["name"])]})
    return rows


def make_transfer_task(out: Path, people: int = 300, test_questions: int = 120, seed: int = 0) -> None:
    rng = random.Random(seed)
    everyone = make_people(people, rng)
    corpus = [{"id": str(i), "contents": passage(p, rng)} for i, p in enumerate(everyone)]
    rows = questions(everyone, "transfer-", rng)
    rng.shuffle(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(corpus, out / "corpus.jsonl")
    write_jsonl(rows[:test_questions], out / "test.jsonl")
    write_jsonl(rows[test_questions:2 * test_questions], out / "train.jsonl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/twohop/transfer"))
    parser.add_argument("--people", type=int, default=300, help="passages in the corpus (one per person)")
    parser.add_argument("--test-questions", type=int, default=120)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    make_transfer_task(args.out, args.people, args.test_questions, args.seed)
    print(f"wrote {args.out}/corpus.jsonl, test.jsonl, train.jsonl")


if __name__ == "__main__":
    main()
