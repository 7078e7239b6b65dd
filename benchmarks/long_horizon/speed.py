"""Seconds per RL step on the walk at 6+ turns: TRL's ``GRPOTrainer`` (its tool loop prefills the whole conversation at
every turn) against ``AgenticGRPOTrainer`` (our engine: each turn prefills only its new tokens), side by side, and
where each step's time goes (issue 59).

    python benchmarks/learning_native/run.py --task walk --out runs/w59/speed --stages trl_grpo,grpo --rl-steps 3 \\
        --test-size 2 --eval-every 0 ...      # the two stages in one process, one after the other, the same settings
    python benchmarks/long_horizon/speed.py runs/w59/speed

``run.py`` times every optimizer step of both trainers the same way (``step_timer``: wall and CPU seconds of the
step, and the wall seconds of the loss's forward, ``compute_loss``, and of its backward, ``accelerator.backward``);
the rest of a step is the rollout (generation and the tools), its scoring and the optimizer's update. This reads the
two stages' reports and gives, per trainer, the median over its steps of each, the median turns per trajectory
(rollouts differ in length: the trainers sample differently), and the ratio of our median seconds per step to TRL's.
Prints a markdown table and writes ``<out>/speed.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

TRAINERS = {"trl_grpo": "TRL GRPOTrainer", "grpo": "AgenticGRPOTrainer"}
"""The two stages compared, by ``run.py``'s stage name, and their rows' names."""


def step_split(curves: dict[str, list]) -> dict[str, float]:
    """The medians over a stage's steps: ``seconds`` and ``cpu_seconds`` of the step, the loss's ``forward_seconds``
    and ``backward_seconds``, ``rollout_seconds`` (the step's rest: seconds - forward - backward) and ``turns`` (mean
    model turns per trajectory)."""
    rest = [s - f - b for s, f, b in zip(curves["seconds"], curves["forward_seconds"], curves["backward_seconds"])]
    medians = {key: statistics.median(curves[key])
               for key in ("seconds", "cpu_seconds", "forward_seconds", "backward_seconds", "turns")}
    return {**medians, "rollout_seconds": statistics.median(rest), "steps": len(rest)}


def compare(out: Path) -> dict[str, Any]:
    """Both stages' :func:`step_split` from ``out``'s reports, and ``ratio``: ours over TRL's median seconds per step
    (``cpu_ratio``: the same of CPU seconds)."""
    splits = {}
    for stage in TRAINERS:
        report = json.loads((out / stage / "report.json").read_text())
        splits[stage] = {**step_split(report["curves"]), "commit": report.get("commit"),
                         "command": report.get("command")}
    ours, theirs = splits["grpo"], splits["trl_grpo"]
    return {**splits, "ratio": ours["seconds"] / theirs["seconds"],
            "cpu_ratio": ours["cpu_seconds"] / theirs["cpu_seconds"]}


def table(result: dict[str, Any]) -> str:
    """The markdown table of :func:`compare`'s result."""
    lines = ["| trainer | steps | turns | s/step | CPU s/step | rollout s | loss forward s | loss backward s |",
             "|---|---|---|---|---|---|---|---|"]
    for stage, name in TRAINERS.items():
        s = result[stage]
        lines.append(f"| {name} | {s['steps']} | {s['turns']:.2f} | {s['seconds']:.1f} | {s['cpu_seconds']:.1f} | "
                     f"{s['rollout_seconds']:.1f} | {s['forward_seconds']:.1f} | {s['backward_seconds']:.1f} |")
    lines.append(f"\nours / TRL's seconds per step: {result['ratio']:.2f} (CPU seconds: {result['cpu_ratio']:.2f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="run.py's --out of the trl_grpo and grpo stages")
    args = p.parse_args(argv)
    missing = [stage for stage in TRAINERS if not (args.out / stage / "report.json").exists()]
    if missing:
        raise SystemExit(f"{args.out} has no report of {', '.join(missing)}: run run.py --stages trl_grpo,grpo "
                         f"--out {args.out} first")
    result = compare(args.out)
    (args.out / "speed.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
