"""A synthetic search-QA task about fictional people, in Search-R1's file formats.

    python benchmarks/learning/make_task.py --out runs/learning/data [--people 480] [--test-people 120] [--seed 0]

Writes ``corpus.jsonl`` (``{"id", "contents": "\\"Title\\"\\ntext"}``, one passage per person), ``train.jsonl`` and
``test.jsonl`` (``{"id", "question", "golden_answers"}``). Every name, place, guild and number is made up, so no
question can be answered closed-book; each answer appears verbatim in exactly one passage, the one about the person
the question names (BM25 finds it from the name), next to three other facts about that person. Teachers are other
people of the corpus, so a search for a name also returns passages that mention it as a teacher: the model has to
read the right passage and the right fact. Test questions are about people no training question mentions.
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


def write_jsonl(rows: list[dict[str, object]], path: Path) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def make_task(out: Path, people: int = 480, test_people: int = 120, train_questions: int = 400,
              test_questions: int = 120, seed: int = 0) -> None:
    rng = random.Random(seed)
    everyone = make_people(people, rng)
    corpus = [{"id": str(i), "contents": passage(p, rng)} for i, p in enumerate(everyone)]
    train = questions(everyone[test_people:], "train-")
    test = questions(everyone[:test_people], "test-")
    rng.shuffle(train)
    rng.shuffle(test)
    out.mkdir(parents=True, exist_ok=True)
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
    args = parser.parse_args()
    make_task(args.out, args.people, args.test_people, args.train_questions, args.test_questions, args.seed)
    print(f"wrote {args.out}/corpus.jsonl, train.jsonl, test.jsonl")


if __name__ == "__main__":
    main()
