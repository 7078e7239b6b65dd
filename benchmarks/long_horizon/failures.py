"""Where a run's walks go wrong: every held-out (or transfer) walk of a run folder's stages replayed against its
world and sorted by its first step that did not shorten the way to the current target (the item, then the goal).

    python benchmarks/long_horizon/failures.py runs/w59/m_s0 runs/w59/m_s1 [--split transfer] [--json failures.json]

A stage's ``<out>/<stage>/heldout.jsonl`` (``run.py`` writes the greedy held-out conversations there, the transfer
ones to ``transfer.jsonl``) holds the model's calls; the worlds are drawn again from the stage's ``report.json``
command (``--train-size``, ``--test-size``, ``--data-seed``: ``walk.task_rows``), each checked against the
conversation's question. Each walk is replayed in a :class:`walk.WalkEnvironment` and counted as one of:

- ``arrived``: it reached the goal with the item (the outcome 1; it may have taken wrong steps on the way);
- ``wrong_to_item``: its first wrong step (progress 0 or -1) came before the item was picked up: the way the
  prompt told, in view in the first message;
- ``wrong_to_goal``: its first wrong step came after the pickup: the way read once, turns earlier, which the walk
  must follow counting the steps taken since;
- ``stopped``: it never stepped wrong but stopped short (a reply before the goal, or out of turns).

``first_wrong_turn`` is the mean 1-based turn of the first wrong step of the walks that took one. The split says
where credit is needed: a wrong step after the pickup is paid for by an outcome several turns later.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.long_horizon import walk  # noqa: E402

KINDS = ("arrived", "wrong_to_item", "wrong_to_goal", "stopped")
SPLITS = {"heldout": {"rows": "test", "name": "held-out", "em": "em"},
          "transfer": {"rows": "transfer", "name": "transfer", "em": "transfer_em"}}
"""Each conversation file (``<split>.jsonl``): the set of ``walk.task_rows`` its walks come from, its name in
messages and its EM's key in the stage's report."""


def tool_calls(messages: list[dict[str, Any]]) -> list[str]:
    """The names of the assistant's tool calls, in order."""
    return [call["function"]["name"] for m in messages if m.get("role") == "assistant"
            for call in m.get("tool_calls") or []]


def replay(row: dict[str, Any], calls: list[str]) -> dict[str, Any]:
    """Walk ``row``'s world with ``calls``: the kind (module docstring) and the 1-based call of the first wrong step
    (``None`` without one). A call that is not a step (a name the environment does not have) counts as wrong; calls
    after the walk is over change nothing."""
    env = walk.WalkEnvironment()
    env.reset(**row)
    first_wrong, carrying_then = None, False
    for k, name in enumerate(calls, 1):
        if env._done:
            break
        carrying, progress = env._carrying, 0.0
        if name in walk.MOVES:
            env._step(name)
            progress = env._progress[-1]
        if first_wrong is None and progress <= 0:
            first_wrong, carrying_then = k, carrying
    if env.get_reward() == 1.0:
        kind = "arrived"
    elif first_wrong is None:
        kind = "stopped"
    else:
        kind = "wrong_to_goal" if carrying_then else "wrong_to_item"
    return {"kind": kind, "first_wrong": first_wrong}


def stage_rows(report: dict[str, Any], split: str = "heldout") -> list[dict[str, Any]]:
    """The held-out (or transfer) walks of the run that wrote ``report`` (its command's sizes and data seed)."""
    from benchmarks.learning_native import run

    args = run.make_parser().parse_args(shlex.split(report["command"])[2:])
    return walk.task_rows(args.train_size, args.test_size, args.data_seed)[SPLITS[split]["rows"]]


def stage_failures(stage_dir: Path, split: str = "heldout") -> dict[str, Any]:
    """The counts of each kind over a stage's walks of ``split``, and the mean turn of the first wrong step."""
    report = json.loads((stage_dir / "report.json").read_text())
    walks = [json.loads(line) for line in (stage_dir / f"{split}.jsonl").read_text().splitlines() if line.strip()]
    rows = stage_rows(report, split)
    counts = dict.fromkeys(KINDS, 0)
    first = []
    for row, walked in zip(rows, walks, strict=True):
        if walked["question"] != row["question"]:
            raise SystemExit(f"{stage_dir}: the {SPLITS[split]['name']} walks are not {report['command']!r}'s")
        result = replay(row, tool_calls(walked["messages"]))
        counts[result["kind"]] += 1
        if result["first_wrong"] is not None:
            first.append(result["first_wrong"])
    return {**counts, "walks": len(walks), "em": report.get(SPLITS[split]["em"]),
            "first_wrong_turn": round(sum(first) / len(first), 2) if first else None}


def failures(outs: list[Path], split: str = "heldout") -> dict[str, dict[str, Any]]:
    """``{"<run folder>/<stage>": counts}`` for every stage folder of ``outs`` with walks of ``split``."""
    return {f"{out.name}/{stage.name}": stage_failures(stage, split) for out in outs
            for stage in sorted(p for p in out.iterdir() if (p / f"{split}.jsonl").exists())}


def table(results: dict[str, dict[str, Any]]) -> str:
    """A markdown table of :func:`failures`, one row per run and stage."""
    lines = ["| run/stage | walks | " + " | ".join(KINDS) + " | first wrong turn |", "|" + "---|" * (len(KINDS) + 3)]
    for name, r in results.items():
        lines.append(f"| {name} | {r['walks']} | " + " | ".join(str(r[k]) for k in KINDS)
                     + f" | {r['first_wrong_turn'] if r['first_wrong_turn'] is not None else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run.py --out folders of the walk")
    parser.add_argument("--split", choices=SPLITS, default="heldout",
                        help="which walks: heldout.jsonl's or transfer.jsonl's (run.py writes both; runs before "
                             "the transfer file existed have the first only)")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args(argv)
    results = failures(args.runs, args.split)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
