"""Two CPU processes with uneven turn counts: no deadlock, aligned generation calls, correct group advantages."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import accelerate_launch

pytestmark = pytest.mark.multiprocess


def _launch(tmp_path, tiny_model_dir, *extra, script="two_ranks.py"):
    script = Path(__file__).with_name(script)
    # accelerate 1.x's `--cpu` starts ONE process unless MPI is set up; its torchrun launcher (`--multi_gpu`) starts
    # two, which use gloo on CPU because the config says use_cpu=True.
    cmd = [*accelerate_launch(), "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
           "--dynamo_backend", "no", str(script), str(tmp_path), tiny_model_dir, *extra]
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    # trainer.end_training() stopped gloo's threads: none is left to race the interpreter's shutdown
    assert [r.get("gloo_threads_after_end", []) for r in ranks] == [[], []]
    return ranks


DATA_COLLECTIVES = {
    "base.py:_sync_any", "base.py:_sync_max",  # the engine's turns: whether any process is still active; row counts
    "base.py:build_round", "base.py:score",  # the round's rewards and failed runs, over every process
    "compat.py:recount_items", "compat.py:trl_rewards",  # TRL's num_items_in_batch and TRL's reward gather
    "grpo.py:<lambda>", "zero_variance.py:<listcomp>",  # dynamic sampling's merged batch
    "ppo.py:_reduce", "critic.py:average_over_processes", "ppo.py:_build_critic",  # PPO's whitening, its critic
}
"""The collective calls a round's data needs, each in one named place."""
TRL_COLLECTIVES = {"compat.py:trl_loss", "base.py:train", "compat.py:end_training"}
"""TRL's loss (its own metrics), transformers' training loop and the end of a run."""
ROUND_LOGGING, STEP_LOGGING = "base.py:gather_round_values", "metrics.py:flush"


def check_collectives(ranks, our_loss):
    """Both processes made the same collective calls in the same order (no place where they can fall out of step);
    each generation round's logging is one gather (``gather_round_values``: metrics, completions table, the reward
    functions' logs), our losses' metrics one gather per optimizer step (``LossMetrics.flush``; none under TRL's loss);
    every other call is one of the named data calls or TRL's own."""
    calls = [[tuple(c) for c in rank["collectives"]] for rank in ranks]
    assert calls[0] == calls[1]
    places = [where for name, where in calls[0] if name not in ("round", "step")]
    assert set(places) <= DATA_COLLECTIVES | TRL_COLLECTIVES | {ROUND_LOGGING, STEP_LOGGING}, \
        set(places) - DATA_COLLECTIVES - TRL_COLLECTIVES
    rounds, steps = (sum(name == marker for name, _ in calls[0]) for marker in ("round", "step"))
    assert rounds >= 2 and steps >= 2
    assert places.count(ROUND_LOGGING) == rounds
    assert places.count(STEP_LOGGING) == (steps if our_loss else 0)


def test_two_processes_uneven_turns(tmp_path, tiny_model_dir):
    ranks = _launch(tmp_path, tiny_model_dir)
    check_collectives(ranks, our_loss=False)
    # rank 0's episodes end after 1 turn, rank 1's after 3: rank 0 keeps calling generate with a dummy
    assert ranks[0]["generation_calls"] == ranks[1]["generation_calls"] == [3, 3]
    for step in range(2):
        rewards = torch.tensor(ranks[0]["rewards"][step] + ranks[1]["rewards"][step])  # global order
        advantages = torch.tensor(ranks[0]["advantages"][step] + ranks[1]["advantages"][step])
        groups = rewards.view(-1, 2)  # 6 completions, groups of 2; the middle group spans both ranks
        expected = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(advantages, expected.flatten(), rtol=1e-4, atol=1e-4)


def test_dynamic_sampling_keeps_groups_across_processes(tmp_path, tiny_model_dir):
    """Per-device batch 3, groups of 2: the middle group spans both ranks. After dropping equal-reward groups and
    resampling, every group of the final global batch is still a (+a, -a) pair."""
    ranks = _launch(tmp_path, tiny_model_dir, "dynamic")
    check_collectives(ranks, our_loss=False)
    for step in range(2):
        advantages = torch.tensor(ranks[0]["advantages"][step] + ranks[1]["advantages"][step]).view(-1, 2)
        torch.testing.assert_close(advantages.sum(1), torch.zeros(3), atol=1e-4, rtol=0)
        assert (advantages.abs() > 0.5).all()


def test_ppo_two_processes_keep_critic_in_sync(tmp_path, tiny_model_dir):
    """The critic is not DDP-wrapped: its gradients are averaged by the trainer, so both ranks' critics (and
    policies) stay identical while each rank trains on different rollouts with uneven turn counts."""
    ranks = _launch(tmp_path, tiny_model_dir, "ppo")
    check_collectives(ranks, our_loss=True)
    assert ranks[0]["generation_calls"] == ranks[1]["generation_calls"] == [3, 3]
    assert ranks[0]["critic_checksum"] == pytest.approx(ranks[1]["critic_checksum"], rel=1e-6)
    assert ranks[0]["policy_checksum"] == pytest.approx(ranks[1]["policy_checksum"], rel=1e-9)


def test_two_processes_two_rounds_behind(tmp_path, tiny_model_dir):
    """``max_staleness=2`` on two processes whose episodes last 1 and 3 turns: each rank's background generator rolls
    out without waiting for the other's (no collective call leaves the training thread, so none interleaves with
    training's), both train at staleness 0, 1, 2, every sample started is trained or discarded, each pins its
    generator to a core of its own, and both policies end equal (DDP averaged the gradients). Rank 1's last job is
    stopped while it runs, and still no gloo thread outlives ``end_training`` (checked in ``_launch``)."""
    ranks = _launch(tmp_path, tiny_model_dir, "async")
    check_collectives(ranks, our_loss=True)
    assert [rank["stopped_while_running"] for rank in ranks] == [0, 1]
    for rank in ranks:
        assert rank["staleness"] == [0.0, 1.0, 2.0]
        started, consumed, discarded = rank["samples"]
        assert (started, consumed, discarded) == (3 * (3 + 2), 3 * 3, 3 * 2)  # 3 rows a round, two rounds ahead
    assert [rank["generator_cpu"] for rank in ranks] == [0, 1]
    assert ranks[0]["policy_checksum"] == pytest.approx(ranks[1]["policy_checksum"], rel=1e-9)


def test_agents_train_on_two_processes(tmp_path, tiny_model_dir):
    """``agent=`` on two processes, each with its own endpoint: rank 0's agents make one model call per run and
    rank 1's three, yet both ranks make the same number of generation calls (rank 0 generates dummies while rank 1's
    agents still run), every round's mask audit is 0, the logged turns are the global mean, and both policies end
    equal (DDP averaged the gradients of different rollouts)."""
    ranks = _launch(tmp_path, tiny_model_dir, script="agent_ranks.py")
    assert ranks[0]["generation_calls"] == ranks[1]["generation_calls"] >= 2 * 3
    assert ranks[0]["mask_audit"] == ranks[1]["mask_audit"] == [0.0, 0.0]
    assert ranks[0]["turns_mean"] == ranks[1]["turns_mean"] == [2.0, 2.0]  # (1 + 3) / 2 over both ranks
    assert ranks[0]["policy_checksum"] == pytest.approx(ranks[1]["policy_checksum"], rel=1e-9)
