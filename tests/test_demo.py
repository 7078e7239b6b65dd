"""The offline demo, shortened: success rises on held-out prompts, and the outputs a user looks at are written."""

import json

from trl_agentic.trajectory import load_trajectories


def test_shortened_demo_learns_and_writes_its_outputs(tmp_path, capsys):
    from trl_agentic.demo import main

    summary = main(["--quick", "--steps", "10", "--output-dir", str(tmp_path)])
    assert summary["success_before"] <= 0.05
    assert summary["success_after"] >= summary["success_before"] + 0.3  # the SFT warm start alone does this
    assert json.loads((tmp_path / "summary.json").read_text())["success_after"] == summary["success_after"]
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    rows = list(load_trajectories(tmp_path / "heldout_trajectories.jsonl"))
    assert len(rows) == summary["heldout_prompts"]
    assert sum(r["reward"] == 1.0 for r in rows) / len(rows) == summary["success_after"]
    page = (tmp_path / "trajectories.html").read_text()
    assert page.count('<section class="traj"') in (1, 2) and "lookup" in page
    out = capsys.readouterr().out
    assert "after SFT + GRPO" in out and "{'loss'" not in out  # compact lines, no raw metric dictionaries
    assert "Truncating" not in out
