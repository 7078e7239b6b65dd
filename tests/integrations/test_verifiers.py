"""A verifiers 0.4 environment trains and is evaluated unchanged (trl_agentic.integrations.verifiers), through the real
package: tests/integrations/envs/tiny_arith is an environment package written as verifiers' docs show (a taskset
with @vf.reward / @vf.metric and a harness exported through __all__), loaded by its id through verifiers' own
resolve_env_config and load_environment, each episode run by Env.run_episode, its model calls relayed by verifiers'
interception server to the agent endpoint. The harness is an in-process tool loop, so nothing is installed at run time.

verifiers pins openai<3: these tests run in .venv-verifiers (.ci/run) and are skipped elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers runs in its own venv (.venv-verifiers, .ci/run)")

from helpers import native_call as call  # noqa: E402
from helpers import scripted  # noqa: E402
from integration_helpers import assert_token_exact, gigpo_logged, logged, record, trainer_of  # noqa: E402

ENV_DIR = Path(__file__).resolve().parent / "envs" / "tiny_arith"
SUBPROCESS = {"agent": {"runtime": {"type": "subprocess"}}}
TURNS = [call("add", a=1, b=3), "The answer is 4."]  # right for the task "What is 1 plus 3?" only


@pytest.fixture(scope="module", autouse=True)
def tiny_arith_installed():
    """The environment package importable by its id, as `pip install -e tests/integrations/envs/tiny_arith` makes
    it."""
    sys.path.insert(0, str(ENV_DIR))
    yield
    sys.path.remove(str(ENV_DIR))


def load(**harness):
    from trl_agentic.integrations.verifiers import VerifiersEnvironment

    config = {"agent": {"runtime": {"type": "subprocess"}, **({"harness": {"id": "tiny-arith", **harness}}
                                                                if harness else {})},
              "taskset": {"num_tasks": 4}}
    return VerifiersEnvironment.load("tiny-arith", config=config)


def expected_reward(row) -> float:
    """The environment's own reward for the scripted turns: `correct` (weight 1) when the task's answer is 4, and
    `used_tool` (weight 0.1) always."""
    import json

    return float(json.loads(row["verifiers_task"])["answer"] == 4) + 0.1


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_a_verifiers_environment_trains_two_steps(qwen, tmp_path, kind):
    env = load()
    tok = qwen.load_tokenizer()
    trainer = trainer_of(kind, tmp_path, model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                         train_dataset=env.dataset(), reward_funcs=env.reward, agent=env.agent)
    recording, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    runs = [run for round_ in rounds for run in round_.runs]
    rows = [row for round_ in rounds for row in round_.rows]
    assert len(runs) == 4 and len(rows) == len(runs)  # two rows per step
    for run, row in zip(runs, rows):
        # each rollout's two calls, relayed by verifiers' interception server, extend one segment of its own
        assert run.stop_reason == "terminated" and len(run.segments) == 1 and run.requests == 2, run.error
        assert run.agent_output.turns == 2 and run.agent_output.stop_condition == "agent_completed"
        assert run.agent_output.reward == pytest.approx(expected_reward(row))
        assert set(run.agent_output.rewards) == {"correct", "used_tool"}
    assert_token_exact(runs, recording)
    # the reward TRL trained on is the environment's own, row for row
    trained = [float(r) for round_ in rounds for r in round_.run_rewards[:, 0]]
    assert trained == pytest.approx([expected_reward(row) for row in rows])
    keys = logged(trainer)
    assert {"rewards/verifiers_reward/mean", "verifiers/correct", "verifiers/used_tool", "verifiers/metric/turns",
            "agentic/mask_audit"} <= keys, sorted(keys)


def test_gigpo_reads_a_verifiers_episodes_turns(qwen, tmp_path):
    """verifiers 0.4 scores a whole trace (Trace.rewards, one per @vf.reward; nothing per turn): each turn's reward is
    0 unless Agent(env.agent, turn_rewards=...) gives one from the recorded turns (here 0.1 for the turn that called
    add), and GiGPO keys each turn by the conversation before it. Every rollout of a group plays the same two turns:
    both turns of every group share their states (step groups of two)."""
    from trl_agentic.agents import Agent

    def tool_turns(trajectory, **row):
        return [0.1 * bool(info.get("tool")) for info in trajectory.turn_infos]

    env = load()
    tok = qwen.load_tokenizer()
    trainer = trainer_of("grpo", tmp_path, model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                         train_dataset=env.dataset(), reward_funcs=env.reward,
                         agent=Agent(env.agent, turn_rewards=tool_turns),
                         config={"per_device_train_batch_size": 4, "max_steps": 1, "gigpo": True})
    _, rounds = record(trainer)
    trainer.train()
    runs = rounds[0].runs
    assert len(runs) == 4 and all(run.stop_reason == "terminated" for run in runs), [run.error for run in runs]
    assert [run.turn_rewards for run in runs] == [[0.1, 0.0]] * 4
    assert gigpo_logged(trainer) == (1.0, 2.0)


def test_evaluate_scores_a_verifiers_environment(qwen):
    from trl_agentic.evaluate import evaluate

    env = load(stream=True)  # the harness asks for server-sent events, as verifiers' null harness does
    tok = qwen.load_tokenizer()
    rows = env.rows()
    report, trajectories = evaluate(scripted(qwen.load_model(), tok, TURNS), tok, None, rows, env.reward,
                                    agent=env.agent, success_threshold=1.0, greedy=True, show_progress=False,
                                    max_turns=4, max_tokens_per_turn=64, max_completion_length=128)
    assert report.successes == [0, 1, 0, 0] and report.accuracy == 0.25
    assert [t.agent_output.reward for t in trajectories] == pytest.approx([expected_reward(r) for r in rows])
    assert all(t.stop_reason == "terminated" and len(t.segments) == 1 and t.requests == 2 for t in trajectories)


def test_evaluate_counts_the_tool_calls_of_a_verifiers_episode(qwen):
    """Each episode calls `add` once (verifiers' own `tool_calls` metric on its trace says 1.0); evaluate counts each
    turn's turn_infos["tool"] and reported 0.00."""
    from trl_agentic.evaluate import evaluate

    env = load()
    tok = qwen.load_tokenizer()
    report, trajectories = evaluate(scripted(qwen.load_model(), tok, TURNS), tok, None, env.rows(), env.reward,
                                    agent=env.agent, greedy=True, show_progress=False, max_turns=4,
                                    max_tokens_per_turn=64, max_completion_length=128)
    assert [t.agent_output.metrics["tool_calls"] for t in trajectories] == [1.0] * 4
    assert [[info.get("tool") for info in t.turn_infos] for t in trajectories] == [[["add"], []]] * 4
    assert report.mean_tool_calls == 1.0


def test_a_crashing_harness_costs_its_own_trajectories(qwen, tmp_path):
    """The harness raises on the tasks with an odd `a`: their trajectories end with env_error and verifiers' message,
    the others train, two steps."""
    env = load(crash_on_odd=True)
    tok = qwen.load_tokenizer()
    trainer = trainer_of("grpo", tmp_path, model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                         train_dataset=env.dataset(), reward_funcs=env.reward, agent=env.agent)
    _, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    import json

    crashed = []
    for round_ in rounds:
        for run, row in zip(round_.runs, round_.rows):
            crashed.append(json.loads(row["verifiers_task"])["a"] % 2 == 1)
            if crashed[-1]:
                assert run.stop_reason == "env_error" and "the harness crashed" in run.error, run.error
                assert "HarnessError" in run.error
            else:
                assert run.stop_reason == "terminated" and run.agent_output.turns == 2
    assert set(crashed) == {True, False}  # both kinds of rows were drawn


def test_rows_rebuild_their_tasks():
    env = load()
    rows = env.rows()
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": f"What is {i} plus 3?"}] for i in range(4)]
    original = list(env.env.taskset)
    for row, task in zip(rows, original):
        rebuilt = env.task(row["verifiers_task"])
        assert type(rebuilt) is type(task) and rebuilt.data == task.data and rebuilt.key == task.key
    assert len(env.rows(num_tasks=2)) == 2


def test_what_is_refused_says_what_to_pass():
    from trl_agentic.integrations.verifiers import VerifiersEnvironment, VerifiersReward

    with pytest.raises(ValueError, match=r"takes a verifiers.v1 Env, got str; load one with "
                                         r"VerifiersEnvironment.load\('<environment id>'\)"):
        VerifiersEnvironment("tiny-arith")
    with pytest.raises(ValueError, match="reads agent_output: train with agent="):
        VerifiersReward()(["x"])


def test_an_episode_of_several_agent_runs_is_refused_at_load():
    """verifiers' best-of-n runs its one seat n times per episode (n traces): refused when wrapped, in one line, not
    at every episode; one attempt (n=1) is one agent run and loads. Two seats (user-sim: an assistant and a modeled
    user) without a player for the one its setup() marks not trained are refused too."""
    from trl_agentic.integrations.verifiers import VerifiersEnvironment

    config = {"id": "best-of-n", "n": 2, **SUBPROCESS, "taskset": {"num_tasks": 4}}
    with pytest.raises(ValueError, match=r"^BestOfNEnv runs its agent 2 times per episode \(best-of-n, n=2\); .*: "
                                         r"drop the env id 'best-of-n' .* or set n=1$") as refused:
        VerifiersEnvironment.load("tiny-arith", config=config)
    assert "\n" not in str(refused.value)
    assert len(VerifiersEnvironment.load("tiny-arith", config={**config, "n": 1}).rows()) == 4
    with pytest.raises(ValueError, match=r"^UserSimEnv plays 2 agents \(assistant, user\) and the policy plays 2 of "
                                         r"them \(user not trained: its setup\(\) says so\); .*: say who plays user: "
                                         r"players=\{'user': ScriptedPlayer\(fn\) \| ModelPlayer\(\.\.\.\)\} "):
        # players= plays it: test_verifiers_seats.py
        VerifiersEnvironment.load("tiny-arith", config={"id": "user-sim", "assistant": SUBPROCESS["agent"],
                                                        "user": SUBPROCESS["agent"]})


@pytest.mark.multiprocess
def test_two_processes_train_a_verifiers_environment(tmp_path):
    """AgenticGRPOTrainer on two processes (accelerate, gloo): each process runs its own rows' episodes against its
    own endpoint; every run is one segment of two calls with the environment's reward, the mask audits are 0, and
    the two policies end equal."""
    import json
    import os
    import socket
    import subprocess

    from trl_agentic.toy import save_tiny_model

    model_dir = save_tiny_model(str(tmp_path / "tiny-qwen2"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = Path(__file__).with_name("verifiers_ranks.py")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(port), "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           str(script), str(tmp_path), model_dir]
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{k}.json").read_text()) for k in range(2)]
    for rank in ranks:
        assert rank["steps"] == 2 and rank["mask_audit"] == [0.0, 0.0]
        assert len(rank["runs"]) == 4  # two rows per step on each process
        for run in rank["runs"]:
            assert run["stop_reason"] == "terminated" and run["segments"] == 1 and run["requests"] == 2, run
            assert run["episode_reward"] == pytest.approx(float(run["answer"] == 4) + 0.1)
    assert ranks[0]["policy_checksum"] == pytest.approx(ranks[1]["policy_checksum"], rel=1e-9)
