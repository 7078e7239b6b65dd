"""Trajectories reach the trackers: with ``log_completions`` the completions table TRL writes and sends to trackio
holds, per completion, the turns, the actions, the tools called, the capped observations, the stop reason, each
reward function's value (and a CompositeReward's components) and the advantage. trackio runs offline (a local
database in a temporary directory)."""

from __future__ import annotations

import glob

import pandas as pd
from helpers import agentic_args, even_rows_right, lookup_dataset

from trl_agentic import AgenticGRPOTrainer, Trajectory
from trl_agentic.rewards import Component, CompositeReward
from trl_agentic.toy import LookupEnvironment, lookup_reward
from trl_agentic.trackers import trajectory_columns


def test_columns_of_hand_made_trajectories():
    t = Trajectory(prompt_ids=[1], actions=["<lookup>k1</lookup>", "<answer>4</answer>"],
                   observations=["<result>" + "9" * 500 + "</result>", None],
                   turn_infos=[{"tool": ["lookup"]}, {}], turn_rewards=[0.0, 1.0], stop_reason="terminated")
    columns = trajectory_columns([t, Trajectory(prompt_ids=[2], stop_reason="env_error")], max_chars=20)
    assert columns["turns"] == [2, 0] and columns["tool_calls"] == ["lookup", ""]
    assert columns["actions"][0] == "[1] <lookup>k1</lookup>\n[2] <answer>4</answer>"
    assert columns["observations"][0] == "[1] <result>999999999999...[+497 chars]"
    assert columns["stop_reason"] == ["terminated", "env_error"] and columns["env_reward"] == [1.0, 0.0]


def test_completions_table_reaches_trackio_offline(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    import trackio

    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.delenv("TRACKIO_SPACE_ID", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = lookup_dataset(8)
    composite = CompositeReward([Component("outcome", lookup_reward, 1.0, outcome=True)], name="total")
    args = agentic_args(tmp_path, max_steps=1, log_completions=True, report_to="trackio", project="agentic-test",
                        run_name="tables")
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=composite, args=args, train_dataset=data,
                                 processing_class=tokenizer, environment=LookupEnvironment)
    trainer.rollout_seam.engine.generator = even_rows_right(tokenizer, list(data))  # scripted: lookups, then answers
    trainer.train()  # transformers' trackio callback finishes the run

    (path,) = glob.glob(str(tmp_path / "out" / "completions" / "*.parquet"))
    table = pd.read_parquet(path)
    for column in ("turns", "actions", "tool_calls", "observations", "stop_reason", "env_reward", "total",
                   "reward/outcome", "advantage"):
        assert column in table.columns, column
    assert (table["turns"] == 2).all() and (table["tool_calls"] == "lookup").all()
    assert table["observations"].str.startswith("[1] <result>").all()
    assert set(table["total"]) <= {0.0, 1.0} and (table["total"] == table["reward/outcome"]).all()  # weight 1
    assert (table["advantage"] == 0).all()  # each group's samples are alike (the scripted agent)

    from trackio.sqlite_storage import SQLiteStorage

    assert [run.name for run in trackio.Api().runs("agentic-test")] == ["tables"]  # the local database
    logs = SQLiteStorage.get_logs("agentic-test", "tables")
    tables = [value for row in logs for key, value in row.items() if key == "completions"]
    assert tables, [sorted(row) for row in logs]
    assert all(c in str(tables[0]) for c in ("tool_calls", "observations", "<result>"))
