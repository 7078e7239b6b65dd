"""The offline demo, shortened: success rises on held-out prompts, and the outputs a user looks at are written."""

import json

import pytest

from trl_agentic.trajectory import load_trajectories


@pytest.mark.parametrize("task", ["native", "tags"])
def test_shortened_demo_learns_and_writes_its_outputs(tmp_path, capsys, task):
    """Both tasks: TRL's environment_factory with native tool calls (the default), and text tags."""
    from trl_agentic.demo import main

    summary = main(["--task", task, "--quick", "--steps", "10", "--output-dir", str(tmp_path)])
    assert summary["success_before"] <= 0.05
    assert summary["success_after"] >= summary["success_before"] + 0.3  # the SFT warm start alone does this
    assert json.loads((tmp_path / "summary.json").read_text())["success_after"] == summary["success_after"]
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    rows = list(load_trajectories(tmp_path / "heldout_trajectories.jsonl"))
    assert len(rows) == summary["heldout_prompts"]
    assert sum(r["reward"] == 1.0 for r in rows) / len(rows) == summary["success_after"]
    page = (tmp_path / "trajectories.html").read_text()
    assert page.count('<section class="traj"') in (1, 2) and "lookup" in page
    # the saved tokenizer lets render show the tokens of the JSONL, as the README says
    from trl_agentic.render import main as render

    html = render([str(tmp_path / "heldout_trajectories.jsonl"), "--tokenizer", str(tmp_path / "tokenizer"),
                   "-o", str(tmp_path / "all.html")]).read_text()
    assert html.count('<section class="traj"') == len(rows) and 'class="tok' in html
    out = capsys.readouterr().out
    assert "after SFT + GRPO" in out and "{'loss'" not in out  # compact lines, no raw metric dictionaries
    assert "Truncating" not in out
    # only what it announced: no empty folder left behind by the trainers (sft/, grpo/)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.html", "heldout_trajectories.jsonl",
                                                         "reward_curve.png", "summary.json", "tokenizer",
                                                         "trajectories.html"]


def test_demo_trains_one_round_behind_with_a_generator_process(tmp_path):
    """``--max-staleness 1 --async-generator process``: GRPO trains on rollouts its generator process made one round
    ahead, as the docs' learning table runs it; the summary says how."""
    from trl_agentic.demo import main

    summary = main(["--task", "tags", "--quick", "--steps", "3", "--output-dir", str(tmp_path), "--max-staleness", "1",
                    "--async-generator", "process"])
    assert (summary["max_staleness"], summary["async_correction"], summary["async_generator"]) == (
        1, "decoupled", "process")
    assert summary["success_after"] >= summary["success_before"] + 0.3


def test_page_title_says_what_it_shows():
    from trl_agentic.demo import showcase
    from trl_agentic.trajectory import Trajectory

    ts = [Trajectory(prompt_ids=[i]) for i in range(3)]
    assert showcase(ts, [1.0, 0.0, 1.0])[1].endswith("a success and a failure after training")
    shown, title = showcase(ts, [1.0, 1.0, 1.0])
    assert len(shown) == 1 and "a success (every held-out prompt succeeded)" in title and "failure" not in title
    shown, title = showcase(ts, [0.0, 0.0, 0.0])
    assert len(shown) == 1 and "a failure (no held-out prompt succeeded)" in title


def test_the_readme_shows_the_committed_run_of_the_demo():
    """The README's demo output is the printed log of the committed run (benchmarks/reports/issue58), its figures
    those of the run's summary.json: a run that learned to at least 90 % held-out."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    reports = root / "benchmarks" / "reports" / "issue58"
    readme = (root / "README.md").read_text(encoding="utf-8")
    shown = readme.split("```\ntrl-agentic demo:", 1)[1].split("\n```", 1)[0]
    shown = "trl-agentic demo:" + shown
    for run in ("demo_native1", "demo_native2"):
        printed = [line for line in (reports / f"{run}.log").read_text().splitlines() if not line.endswith(" s wall")]
        seconds = re.compile(r"\(\d+ s\)|\d+ s\.|/tmp/[^\s,]+")
        assert [seconds.sub("", line) for line in shown.splitlines()] == [seconds.sub("", line) for line in printed]
        summary = json.loads((reports / f"{run}.json").read_text())
        assert summary["task"] == "native" and summary["success_after"] >= 0.9
        assert f"after SFT + GRPO{summary['success_after']:>18.1%}" in shown
