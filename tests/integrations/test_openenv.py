"""An OpenEnv environment trains as TRL's OpenEnv docs drive it (trl_agentic.integrations.openenv), through the real
package: tests/integrations/envs/guess_env is laid out as `openenv init` scaffolds an environment (typed models,
the Environment, its app from openenv's create_app, an EnvClient subclass), served by uvicorn on 127.0.0.1 in
processes the run starts and stops (OpenEnvServers), and driven through its own client inside TRL's
environment_factory class. A server that dies or hangs costs the trajectories on it; the pool restarts it.

openenv 0.10 pins mcp<2 and the frameworks extra's packages need mcp>=2: these tests run in .venv-openenv (.ci/run)
and are skipped elsewhere."""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import pytest

pytest.importorskip("openenv.core.env_server", reason="openenv runs in its own venv (.venv-openenv, .ci/run)")

from helpers import native_call as call  # noqa: E402
from helpers import scripted  # noqa: E402
from integration_helpers import (  # noqa: E402
    assert_token_exact,
    gigpo_logged,
    logged,
    record,
    train_two_ways,
    trainer_of,
)

ENV_DIR = Path(__file__).resolve().parent / "envs" / "guess_env"
APP = "guess_env.server.app:app"
TURNS = [call("guess", number=4), "I am done."]  # right when the seed draws 4 (seeds 3, 4, 8)


@pytest.fixture(scope="module", autouse=True)
def guess_env_installed():
    """The environment package importable, as `pip install -e tests/integrations/envs/guess_env` makes it."""
    sys.path.insert(0, str(ENV_DIR))
    yield
    sys.path.remove(str(ENV_DIR))


def guess_game(servers):
    """TRL's environment_factory class around the environment's own client, as TRL's OpenEnv docs write it."""
    from guess_env import GuessAction, GuessEnv

    class GuessGame:
        def __init__(self):
            self.client = GuessEnv(base_url=servers.url()).sync()
            self.reward = 0.0

        def reset(self, seed, **kwargs) -> str:
            self.reward = 0.0
            return self.client.reset(seed=seed).observation.message

        def guess(self, number: int) -> str:
            """Guess the number.

            Args:
                number: The number guessed, from 1 to 8.

            Returns:
                Whether the number is right, higher or lower.
            """
            result = self.client.step(GuessAction(number=number))
            self.reward = float(result.reward or 0.0)
            return result.observation.message

    return GuessGame


def reward_func(environments, **kwargs):
    return [environment.reward for environment in environments]


def dataset(seeds):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": "Guess my number from 1 to 8."}]] * len(seeds),
                              "seed": list(seeds)})


def trainer(kind, qwen, tmp_path, servers, seeds, **config):
    tok = qwen.load_tokenizer()
    return trainer_of(kind, tmp_path, model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                      train_dataset=dataset(seeds), reward_funcs=reward_func,
                      environment_factory=guess_game(servers),
                      config={"rollout_mode": "chat", "max_tokens_per_turn": 64, **config})


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_an_openenv_environment_trains_two_steps(qwen, tmp_path, kind):
    from trl_agentic.integrations.openenv import OpenEnvServers, environments_per_round

    with OpenEnvServers(APP, num_servers=2, environments=2) as servers:
        run = trainer(kind, qwen, tmp_path, servers, seeds=range(8))
        recording, rounds = record(run)
        run.train()
        processes = [server.process for server in servers.servers]
    assert run.state.global_step == 2
    assert all(len(round_.runs) == environments_per_round(run.args) == 2 for round_ in rounds)  # the round checked
    assert all(p.poll() is not None for p in processes)  # the servers' processes ended with the block
    runs = [r for round_ in rounds for r in round_.runs]
    rows = [row for round_ in rounds for row in round_.rows]
    assert len(runs) == 4
    for r, row in zip(runs, rows):
        # one guess, answered by the server through the client, then the answer; the environment's reward
        right = random.Random(row["seed"]).randint(1, 8) == 4
        assert r.stop_reason in ("terminated", "eos") and not r.error, r.error
        assert r.turn_infos[0]["tool"] == ["guess"]
        assert ("Right!" if right else "No, ") in str(r.observations[0])
    trained = [float(x) for round_ in rounds for x in round_.run_rewards[:, 0]]
    assert trained == [float(random.Random(row["seed"]).randint(1, 8) == 4) for row in rows]
    assert_token_exact(runs, recording)
    assert {"rewards/reward_func/mean", "agentic/mask_audit", "agentic/tool_calls/guess_per_trajectory"} <= logged(run)
    assert servers.restarts == 0


def kept_guess_game(servers):
    """The same class on OpenEnvEnvironment: its tools call self._step instead of self.client.step (and reset
    self._reset), and the base keeps what they return: each turn's reward and state come with it."""
    from guess_env import GuessAction, GuessEnv

    from trl_agentic.integrations.openenv import OpenEnvEnvironment

    class GuessGame(OpenEnvEnvironment):
        def __init__(self):
            self.client = GuessEnv(base_url=servers.url()).sync()

        def reset(self, seed, **kwargs) -> str:
            return self._reset(seed=seed).observation.message

        def guess(self, number: int) -> str:
            """Guess the number.

            Args:
                number: The number guessed, from 1 to 8.

            Returns:
                Whether the number is right, higher or lower.
            """
            return self._step(GuessAction(number=number)).observation.message

    return GuessGame


# Seeds 3 and 4 draw 4. Two ways to it: after their second guess both were told "No, higher." (the first way after
# "No, lower.", the second after "No, higher." already).
GUESSES = {"down_up": [call("guess", number=6), call("guess", number=2), call("guess", number=4), "I am done."],
           "up_up": [call("guess", number=2), call("guess", number=3), call("guess", number=4), "I am done."]}
TOLD = {"down_up": ["No, lower.", "No, higher.", "Right!", "Right!"], "up_up": ["No, higher.", "No, higher.", "Right!",
                                                                                "Right!"]}


def test_each_turn_carries_the_environments_reward_and_observation_and_gigpo_groups_on_them(qwen, tmp_path):
    """OpenEnvEnvironment gives each turn the reward of its steps (_turn_reward: the right guess's 1) and the key of
    the observation it led to (_state_key: its fields but the reward); TRL sees one tool, guess. GiGPO groups the
    turns that start from equal observations, however they were reached: per group the first turns (the prompt), the
    turns after "No, higher." (the first way's third, the second way's second and third: one group of three) and the
    last turns (after "Right!"): 7 of 8 steps, in 4 states. Keyed by the observation history (the only key before),
    the two ways never meet again after their first turn: 2 of 8."""
    import json

    from datasets import Dataset

    from trl_agentic.integrations.openenv import OpenEnvServers

    tok = qwen.load_tokenizer()
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Game {seed}: guess my number from 1 to 8."}]
                                         for seed in (3, 4)], "seed": [3, 4]})
    with OpenEnvServers(APP, num_servers=1, environments=4) as servers:
        trainer = trainer_of("grpo", tmp_path, model=qwen.load_model(), processing_class=tok, train_dataset=rows,
                             reward_funcs=lambda environments, **kwargs: [e.episode_reward for e in environments],
                             environment_factory=kept_guess_game(servers),
                             config={"rollout_mode": "chat", "max_tokens_per_turn": 64, "max_completion_length": 512,
                                     "per_device_train_batch_size": 4, "max_steps": 1, "gigpo": True,
                                     "gigpo_step_rewards": "turns"})
        assert [tool.__name__ for tool in trainer.tools] == ["guess"]
        round_, ways = train_two_ways(trainer, tok, GUESSES)
    for run, way in zip(round_.runs, ways):
        assert run.turn_rewards == [0.0, 0.0, 1.0, 0.0], run.error
        keys = [json.loads(info["state_key"]) for info in run.turn_infos]
        assert keys == [{"done": message == "Right!", "message": message, "metadata": {}} for message in TOLD[way]]
    assert [float(r) for r in round_.run_rewards[:, 0]] == [1.0] * 4  # episode_reward
    assert gigpo_logged(trainer) == pytest.approx((7 / 8, 8 / 4))


@pytest.mark.parametrize("failure", ["dies", "hangs"])
def test_a_server_that_dies_or_hangs_costs_its_trajectories(qwen, tmp_path, failure):
    """Two servers; after the first step one of them is killed (SIGKILL, as the OOM killer would) or stopped
    (SIGSTOP: alive, answering nothing). In the second round the environment on it fails its reset (env_error when
    the connection is gone, env_timeout when it hangs) and the one on the other server plays on; the third round's
    new environment finds the server broken and gets it restarted."""
    from transformers import TrainerCallback

    from trl_agentic.integrations.openenv import OpenEnvServers

    class Break(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                os.killpg(servers.servers[0].process.pid, signal.SIGKILL if failure == "dies" else signal.SIGSTOP)

    with OpenEnvServers(APP, num_servers=2, health_timeout=1.0) as servers:
        run = trainer("grpo", qwen, tmp_path, servers, seeds=range(8), max_steps=3, env_timeout=6.0)
        run.add_callback(Break())
        _, rounds = record(run)
        run.train()
        restarts = servers.restarts
    assert run.state.global_step == 3 and len(rounds) == 3
    reasons = [[r.stop_reason for r in round_.runs] for round_ in rounds]
    assert all(reason in ("terminated", "eos") for reason in reasons[0] + reasons[2]), reasons
    expected = "env_error" if failure == "dies" else "env_timeout"
    assert sorted(reasons[1]) in (sorted([expected, "terminated"]), sorted([expected, "eos"])), reasons
    assert restarts == 1


def test_a_server_that_cannot_start_says_why(tmp_path):
    from trl_agentic.integrations.openenv import OpenEnvServerError, OpenEnvServers

    broken = tmp_path / "broken_env.py"
    broken.write_text("raise RuntimeError('no such game')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(OpenEnvServerError,
                           match=r"broken_env:app exited with code 1 before it answered: RuntimeError: no such game$"):
            OpenEnvServers("broken_env:app").url()
    finally:
        sys.path.remove(str(tmp_path))
    with pytest.raises(ValueError, match="app must be uvicorn's 'package.module:attribute'"):
        OpenEnvServers("guess_env.server.app")


SCAFFOLD_APP = """from openenv.core.env_server.http_server import create_app

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.guess_environment import GuessEnvironment

app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env",
                 max_concurrent_envs=1)  # as `openenv init` scaffolds it
"""


@pytest.fixture
def scaffold_app(tmp_path):
    """The guess environment's app as the scaffold leaves it (one session per server), and the servers' PYTHONPATH."""
    (tmp_path / "scaffold_guess_app.py").write_text(SCAFFOLD_APP)
    sys.path.insert(0, str(tmp_path))
    yield "scaffold_guess_app:app", {"PYTHONPATH": os.pathsep.join([str(ENV_DIR), os.environ.get("PYTHONPATH", "")])}
    sys.path.remove(str(tmp_path))


def test_a_pool_that_holds_fewer_environments_than_a_round_is_refused_at_start(scaffold_app):
    """The scaffold's max_concurrent_envs=1 with the docs' 2 servers and 4 generations: each server refused every
    session past its first, so each round lost 2 of its 4 trajectories ("Server at capacity: 1/1 sessions active")
    and nothing said so at start. The pool reads each server's own limit (OpenEnv's session API) at start and refuses
    in one line with both numbers and the fix, its servers stopped; a round that fits starts, and the sessions the
    check opened are closed again (a client per session plays at once)."""
    from guess_env import GuessAction, GuessEnv

    from trl_agentic.integrations.openenv import OpenEnvServers

    app, env = scaffold_app
    servers = OpenEnvServers(app, num_servers=2, env=env, environments=4)
    with pytest.raises(ValueError, match=r"^a round runs 4 environments at once, but 2 servers x 1 session each hold 2 "
                                         r"\(max_concurrent_envs=1 in scaffold_guess_app:app\): pass num_servers=4, or "
                                         r"max_concurrent_envs=2 to its create_app \(with SUPPORTS_CONCURRENT_SESSIONS "
                                         r"= True on the environment class\)$"):
        servers.start()
    assert all(server.process is None for server in servers.servers)
    with OpenEnvServers(app, num_servers=2, env=env, environments=2) as servers:
        clients = [GuessEnv(base_url=servers.url()).sync() for _ in range(2)]
        try:
            for client in clients:
                assert client.reset(seed=3).observation.message == "Guess my number from 1 to 8."
                assert client.step(GuessAction(number=4)).observation.message == "Right!"
        finally:
            for client in clients:
                client.close()
    with pytest.raises(ValueError, match=r"^environments must be a positive int or None, got 0$"):
        OpenEnvServers(app, environments=0)


def test_environments_per_round_counts_what_runs_at_once(tmp_path):
    """One environment per trajectory of a round on this process: TRL's generation batch over the processes
    (per_device_train_batch_size x steps_per_generation), an evaluation's when larger, and with rounds ahead
    (max_staleness) a round of now beside the one on the background thread."""
    from trl_agentic import AgenticGRPOConfig, AgenticPPOConfig
    from trl_agentic.integrations.openenv import environments_per_round

    base = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", num_generations=4,
                per_device_train_batch_size=4)
    assert environments_per_round(AgenticGRPOConfig(**base)) == 4  # the docs' settings
    assert environments_per_round(AgenticGRPOConfig(**base, gradient_accumulation_steps=2)) == 8
    evaluated = dict(eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=8)
    assert environments_per_round(AgenticGRPOConfig(**base, **evaluated)) == 8
    assert environments_per_round(AgenticGRPOConfig(**base, max_staleness=1)) == 4  # one job at a time
    assert environments_per_round(AgenticGRPOConfig(**base, max_staleness=1, **evaluated)) == 12
    assert environments_per_round(AgenticGRPOConfig(**base, max_staleness=1,
                                                    zero_variance_groups="dynamic_sampling")) == 8
    ppo = AgenticPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                           num_mini_batches=2)
    assert environments_per_round(ppo) == 8


BROKEN_APP = """from openenv.core.env_server.http_server import create_app

from guess_env.models import GuessAction, GuessObservation
from guess_env.server.guess_environment import GuessEnvironment


class NoBoardEnvironment(GuessEnvironment):
    def __init__(self):
        raise RuntimeError("no board")


app = create_app(NoBoardEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=4)
"""
PLAIN_APP = """from fastapi import FastAPI

app = FastAPI()


@app.get("/health")
def health():
    return {"status": "healthy"}
"""


def test_the_check_says_what_it_cannot_open_or_read(scaffold_app, tmp_path, caplog):
    """An environment whose constructor raises fails the check at start, in one line (each trajectory's reset would
    have failed); an app that does not serve OpenEnv's session API starts unchecked, and says so."""
    from trl_agentic.integrations.openenv import OpenEnvServerError, OpenEnvServers

    _, env = scaffold_app
    (tmp_path / "broken_guess_app.py").write_text(BROKEN_APP)
    (tmp_path / "plain_app.py").write_text(PLAIN_APP)
    servers = OpenEnvServers("broken_guess_app:app", env=env, environments=2)
    with pytest.raises(OpenEnvServerError, match=r"^the environment server broken_guess_app:app did not open a "
                                                 r"session: Environment factory 'NoBoardEnvironment' failed to create "
                                                 r"instance\.$"):
        servers.start()
    assert servers.servers[0].process is None
    with OpenEnvServers("plain_app:app", env=env, environments=2) as servers:
        assert servers.url() == servers.servers[0].base_url
    assert "plain_app:app answers POST /mcp with HTTP 404: how many sessions it holds is not checked" in caplog.text
