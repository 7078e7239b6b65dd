"""benchmarks/learning end to end on the real Gemma-3-270M: a few steps of every stage (slow; ``-m slow``)."""

import importlib.util
import json
from pathlib import Path

import pytest
from conventions import require_gemma3_270m

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "learning"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"learning_{name}", BENCHMARK / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_stage_runs_on_gemma3_270m(tmp_path, capsys):
    require_gemma3_270m()
    data = tmp_path / "data"
    _load("make_task").make_task(data, people=24, test_people=6, train_questions=12, test_questions=2)
    out = tmp_path / "run"
    run = _load("run")
    assert run.main(["--data", str(data), "--out", str(out), "--test-size", "2", "--eval-batch-size", "2",
                     "--sft-demos", "4", "--rl-steps", "1", "--rl-prompts-per-step", "1", "--num-generations", "2",
                     "--max-tokens-per-turn", "24", "--max-completion-length", "200"]) == 0
    reports = {stage: json.loads((out / stage / "report.json").read_text()) for stage in run.STAGES}
    for stage, report in reports.items():
        assert 0.0 <= report["em"] <= 1.0 and 0 <= report["mean_searches"] <= report["mean_turns"], stage
    assert reports["closed_book"]["mean_turns"] == 1 and reports["closed_book"]["mean_searches"] == 0
    assert reports["sft"]["demonstrations"] >= 1 and reports["sft"]["trained_tokens"] > 0
    # the saved adapter, reloaded from disk, gives the same greedy evaluation
    assert {k: reports["sft"][k] for k in ("em", "mean_searches", "mean_turns", "examples")} == \
           {k: reports["sft_again"][k] for k in ("em", "mean_searches", "mean_turns", "examples")}
    for stage in ("grpo", "grpo_unmasked", "ppo", "ppo_warmup", "ppo_turn"):
        assert (out / stage / "adapter" / "adapter_config.json").exists()
    for stage in ("grpo", "grpo_unmasked", "ppo", "ppo_warmup", "ppo_turn"):
        assert len(reports[stage]["train_reward"]) == 1
        assert [e[0] for e in reports[stage]["curves"]["eval"]] == [0, 1]  # before the first step and after it
    assert reports["rft"]["samples"] == 2 and (out / "curves.png").exists()
    assert (out / "rft" / "adapter").exists() is (reports["rft"]["kept"] > 0)
    assert "| closed-book |" in capsys.readouterr().out
