"""The native-tool learning comparison's committed results: collect run folders, build the table and the plot.

    python benchmarks/learning_native/report.py collect runs/native/s0 runs/native/s1 ... [--results DIR] [--names ...]
    python benchmarks/learning_native/report.py table [--results DIR]
    python benchmarks/learning_native/report.py plot [--results DIR] [--out docs/learning_native_em.png]
    python benchmarks/learning_native/report.py curves --results DIR --out docs/learning_arithmetic_reward.png
    python benchmarks/learning_native/report.py docs --task arithmetic --results benchmarks/learning_native/results_arithmetic
    python benchmarks/learning_native/report.py docs --task walk --results benchmarks/learning_native/results_walk

``collect`` copies each run folder's ``<stage>/report.json`` (``run.py`` writes the command, the commit and the
machine into it) to ``<results>/<run folder name>/<stage>.json`` (or the name ``--names`` gives it), without the
held-out conversations, keeping the ``note`` a committed copy carries; the results are committed, the run folders
are not. ``table`` prints one row per stage over every collected run that has it:
the runs (seeds), held-out EM mean and standard deviation and each run's, EM on the transfer task (the other
generator's questions, ``--transfer``), searches, malformed calls and turns per trajectory, an RL stage's seconds
per step, and minutes.
``docs/benchmarks.md`` carries that output verbatim between ``<!-- native-table -->`` markers (the arithmetic task's
between ``<!-- arithmetic-table -->``, the walk's between ``<!-- walk-table -->``; ``docs`` writes it there;
``tests/test_learning_native.py`` checks that they agree), so the docs cannot drift from the runs. ``plot`` draws
held-out EM per stage with each run's point, beside the transfer task's; ``curves`` the RL stages' sampled reward and
seconds per step, one line per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.learning_native.run import ROW_NAMES, STAGES, TOOL_KEYS  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DROPPED = ("examples", "messages", "transfer_examples")
"""Report fields not committed (conversations: the run folder's ``heldout.jsonl`` has them all)."""


def collect(outs: list[Path], results: Path = RESULTS, names: list[str] | None = None) -> list[Path]:
    """Copy every stage report of the run folders ``outs`` into ``results/<name>/<stage>.json``, ``names`` the
    runs' names in the results in the order of ``outs`` (default: each folder's name)."""
    if names is not None and len(names) != len(outs):
        raise SystemExit(f"--names gives {len(names)} names for {len(outs)} run folders; give one per folder")
    written = []
    for out, name in zip(outs, names or [out.name for out in outs]):
        for stage in STAGES:
            path = out / stage / "report.json"
            if not path.exists():
                continue
            report = {k: v for k, v in json.loads(path.read_text()).items() if k not in DROPPED}
            target = results / name / f"{stage}.json"
            if target.exists() and "note" in (committed := json.loads(target.read_text())):
                report["note"] = committed["note"]  # a remark written on the committed report survives a re-collect
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
            written.append(target)
    return written


def row_key(stage: str, report: dict[str, Any]) -> str:
    """The table row of a stage's report: the stage, with the interface when it is not ``environment_factory``
    (``"grpo, agent"``: the same trainer through an OpenAI SDK agent is a row of its own, not another seed)."""
    interface = report.get("interface", "environment")
    return stage if interface == "environment" else f"{stage}, {interface}"


def load(results: Path = RESULTS) -> dict[str, list[dict[str, Any]]]:
    """The collected reports per row (``row_key``), in the order of the stages, runs in name order."""
    by_row: dict[str, list[dict[str, Any]]] = {}
    runs = sorted(p for p in results.iterdir() if p.is_dir()) if results.exists() else []
    for stage in STAGES:
        for run in runs:
            if (path := run / f"{stage}.json").exists():
                report = {**json.loads(path.read_text()), "run": run.name}
                by_row.setdefault(row_key(stage, report), []).append(report)
    return by_row


def _mean_sd(values: list[float]) -> str:
    if not values:
        return ""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def _stage_name(row: str, reports: list[dict[str, Any]]) -> str:
    from benchmarks.learning.run import _row_name

    stage, _, interface = row.partition(", ")
    name = _row_name(stage, reports, ROW_NAMES)
    return f"{name}, through {INTERFACE_NAMES[interface]}" if interface else name


INTERFACE_NAMES = {"tools": "TRL's tools=", "agent": "an OpenAI SDK agent (agent=)"}
"""How a row names an interface other than ``environment_factory=`` (``run.py --interface``)."""


def columns(task: str = "search") -> tuple[tuple[str, str], ...]:
    """The table's columns after EM: the transfer task's EM, the task's tool calls (searches, calculations),
    malformed calls, turns, an RL stage's seconds per optimizer step (the median), the stage's minutes."""
    tool = TOOL_KEYS[task]
    return (("transfer EM", "transfer_em"), (tool, f"mean_{tool}"), ("malformed calls", "malformed_per_trajectory"),
            ("turns", "mean_turns"), ("s per step", "seconds_per_step"), ("minutes", "seconds"))


def table(results: Path = RESULTS, task: str = "search") -> str:
    """The markdown table of the collected runs (module docstring)."""
    headers = ["stage", "runs", "held-out EM", "EM per run", *(header for header, _ in columns(task))]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row, reports in load(results).items():
        cells = [_stage_name(row, reports), ", ".join(r["run"] for r in reports),
                 _mean_sd([r["em"] for r in reports]), ", ".join(f"{r['em']:.2f}" for r in reports)]
        for _, key in columns(task):
            values = [r[key] / (60 if key == "seconds" else 1) for r in reports if r.get(key) is not None]
            cells.append(_mean_sd(values) if len(values) == len(reports) else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MARKERS = {"search": "native-table", "arithmetic": "arithmetic-table", "walk": "walk-table"}
"""The markers in ``docs/benchmarks.md`` between which each task's table stands."""
DOCS = ROOT / "docs" / "benchmarks.md"


def _split_docs(text: str, task: str) -> tuple[str, str, str] | None:
    """``text`` around ``task``'s markers: before (with the opening marker's line), between, after (from the closing
    marker's line); ``None`` without them."""
    start, end = f"<!-- {MARKERS[task]} -->\n", f"<!-- /{MARKERS[task]} -->"
    if start not in text:
        return None
    head, rest = text.split(start, 1)
    between, tail = rest.split(end, 1)
    return head + start, between.removesuffix("\n"), end + tail


def table_in_docs(task: str = "search", docs: Path = DOCS) -> str | None:
    """The table ``docs`` carries between ``task``'s markers (``""`` when they hold none), or ``None`` without
    them."""
    parts = _split_docs(docs.read_text(encoding="utf-8"), task)
    return None if parts is None else parts[1]


def write_docs(results: Path, task: str, docs: Path = DOCS) -> None:
    """Put :func:`table` of ``results`` between ``task``'s markers in ``docs`` (which must have them)."""
    parts = _split_docs(docs.read_text(encoding="utf-8"), task)
    if parts is None:
        raise SystemExit(f"{docs} has no <!-- {MARKERS[task]} --> marker")
    docs.write_text(parts[0] + table(results, task) + "\n" + parts[2], encoding="utf-8")


PLOT_TITLES = {"search": ("held-out two-hop questions", "transfer task (other generator)"),
               "arithmetic": ("held-out word problems", "transfer (other stories, never trained on)"),
               "walk": ("held-out walks", "transfer (other stories and wording, never trained on)")}


def _save(fig: Any, title: str, path: Path) -> Path:
    """Title ``fig`` (the model and ``title``), write it to ``path`` as a PNG and close it."""
    import matplotlib.pyplot as plt

    fig.suptitle(f"SmolLM2-135M-Instruct, native tool calls: {title}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot(results: Path = RESULTS, path: Path = ROOT / "docs" / "learning_native_em.png", task: str = "search") -> Path:
    """Held-out EM per stage, each run a point and the mean a bar; the transfer task beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_row = load(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, key, title in zip(axes, ("em", "transfer_em"), PLOT_TITLES[task]):
        for x, reports in enumerate(by_row.values()):
            values = [r[key] for r in reports if r.get(key) is not None]
            if values:
                ax.bar(x, statistics.fmean(values), color="#cfd8e3", width=0.6)
                ax.scatter([x] * len(values), values, color="#1f4e79", zorder=3, s=18)
        ax.set_xticks(range(len(by_row)), list(by_row), rotation=30, ha="right")
        ax.set_title(title)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("exact match (greedy)")
    return _save(fig, "EM per stage (bars: mean; points: runs)", path)


def curves(results: Path, path: Path) -> Path:
    """The sampled reward and the seconds of each optimizer step of every RL report, one line per run, one colour
    per row (``row_key``): the learning curves of the committed runs beside their cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    rows = [(row, reports) for row, reports in load(results).items() if any("curves" in r for r in reports)]
    for colour, (row, reports) in enumerate(rows):
        for i, report in enumerate(r for r in reports if "curves" in r):
            c = report["curves"]
            for ax, key in zip(axes, ("reward", "seconds")):
                ax.plot(c["step"][: len(c[key])], c[key], color=f"C{colour}", alpha=0.8, label=row if i == 0 else None)
    for ax, title in zip(axes, ("sampled reward (mean of the step's samples)", "seconds per optimizer step")):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    return _save(fig, "RL stages (one line per run)", path)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("collect", "table", "plot", "curves", "docs"))
    parser.add_argument("runs", nargs="*", type=Path, help="collect: run folders (run.py's --out)")
    parser.add_argument("--names", nargs="+", help="collect: each run's name in the results (default: its folder's)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--task", choices=tuple(TOOL_KEYS), default="search", help="table: the task's tool column")
    parser.add_argument("--out", type=Path, help="plot, curves: the PNG (default docs/learning_native_em.png, "
                                                 "docs/learning_native_reward.png)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.command == "collect":
        if not args.runs:
            parser.error("collect needs run folders")
        for path in collect(args.runs, args.results, args.names):
            print(path)
    elif args.command == "table":
        print(table(args.results, args.task))
    elif args.command == "docs":
        write_docs(args.results, args.task)
        print(f"{DOCS}: the {args.task} table of {args.results}")
    elif args.command == "curves":
        print(curves(args.results, args.out or ROOT / "docs" / "learning_native_reward.png"))
    else:
        print(plot(args.results, args.out or ROOT / "docs" / "learning_native_em.png", args.task))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
