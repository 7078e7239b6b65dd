import pytest

from trl_agentic.rewards import TurnReward, aggregate_turn_rewards


def test_aggregations():
    r = [1.0, 0.0, 2.0]
    assert aggregate_turn_rewards(r, "sum") == 3.0
    assert aggregate_turn_rewards(r, "discounted", gamma=0.5) == pytest.approx(1.0 + 0.0 + 0.25 * 2.0)
    assert aggregate_turn_rewards(r, "last") == 2.0
    assert aggregate_turn_rewards(r, "mean") == 1.0
    assert aggregate_turn_rewards([], "last") == 0.0
    with pytest.raises(ValueError):
        aggregate_turn_rewards(r, "max")


def test_turn_reward_reads_trajectory(trajectory):
    reward = TurnReward("discounted", gamma=0.9)
    trajs = [trajectory(["a", "b"], turn_rewards=[0.5, 1.0]), trajectory(["a"], turn_rewards=[-1.0])]
    assert reward(prompts=["q", "q"], completions=["x", "y"], trajectory=trajs) == pytest.approx([1.4, -1.0])
    with pytest.raises(ValueError, match="trajectory"):
        reward(prompts=["q"], completions=["x"])


# -- per-turn rewards from every kind of rollout ------------------------------------------------------------------
# TRL's environment classes: two optional methods our engine calls after every turn, which TRL itself never calls
# nor shows to the model; agents: a function over the recorded turns. PPO's turn-level GAE and GiGPO read them.
class CounterEnv:
    """A counter to bring to the row's target with ``increment`` (TRL's documented example), whose turns earn the
    counter's gain (``_turn_reward``) and are keyed by its value (``_state_key``)."""

    def reset(self, target, **kwargs) -> None:
        self.counter = self.before = 0
        self.target = target

    def increment(self, step: int) -> int:
        """Add to the counter.

        Args:
            step: What to add.
        """
        self.counter += step
        return self.counter

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def _turn_reward(self) -> float:
        gained, self.before = self.counter - self.before, self.counter
        return float(gained)

    def _state_key(self) -> str:
        return f"counter={self.counter}"


TURNS = ["<tool_call>\n" + '{"name": "increment", "arguments": {"step": 2}}' + "\n</tool_call>\n<tool_call>\n"
         + '{"name": "increment", "arguments": {"step": 1}}' + "\n</tool_call>", "Done."]


@pytest.fixture(scope="module")
def qwen():
    from conventions import build_convention

    return build_convention("qwen2.5-instruct")


def _counter_rows(n=4):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Increment the counter to {i}."}]
                                         for i in range(1, n + 1)], "target": list(range(1, n + 1))})


def _trl_config(config_class, tmp_path, **extra):
    values = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2,
                  max_completion_length=128, max_steps=1, learning_rate=1e-3, report_to="none", use_cpu=True,
                  bf16=False, seed=0, save_strategy="no", logging_steps=1)
    return config_class(**{**values, **extra})


def _first_round(trainer, rows):
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer.generation_round([dict(trainer.train_dataset[i]) for i in rows])


def test_trls_own_trainer_runs_the_class_unchanged(qwen, tmp_path):
    """TRL 1.16's GRPOTrainer: the optional methods are no tools (the model is shown ``increment`` alone) and are
    never called; a training step runs."""
    from helpers import scripted
    from trl import GRPOConfig, GRPOTrainer

    calls = []

    class Watched(CounterEnv):
        def _turn_reward(self) -> float:
            calls.append("turn_reward")
            return super()._turn_reward()

    tok = qwen.load_tokenizer()
    trainer = GRPOTrainer(model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                          train_dataset=_counter_rows(), reward_funcs=lambda completions, **k: [0.0] * len(completions),
                          args=_trl_config(GRPOConfig, tmp_path), environment_factory=Watched)
    assert [tool.__name__ for tool in trainer.tools] == ["increment"]
    trainer.train()
    assert trainer.state.global_step == 1 and calls == []


def test_trl_classes_give_each_turn_its_reward_and_state(qwen, tmp_path):
    """Our trainer calls both methods after every turn: turn 0 calls increment(2), increment(1) (gain 3, counter 3),
    turn 1 answers (gain 0); GiGPO groups both turns of each group (the same prompt, then counter=3)."""
    from helpers import scripted

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    tok = qwen.load_tokenizer()
    trainer = AgenticGRPOTrainer(model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                                 train_dataset=_counter_rows(), reward_funcs=[],
                                 args=_trl_config(AgenticGRPOConfig, tmp_path, gigpo=True),
                                 environment_factory=CounterEnv)
    assert [tool.__name__ for tool in trainer.tools] == ["increment"]
    round_ = _first_round(trainer, [0, 0, 1, 1])  # two groups of two, as TRL's sampler lays them out
    assert [t.turn_rewards for t in round_.runs] == [[3.0, 0.0]] * 4
    assert [[info.get("state_key") for info in t.turn_infos] for t in round_.runs] == [["counter=3"] * 2] * 4
    metrics = trainer.advantages(round_)
    assert metrics["gigpo/anchored_step_share"] == 1.0 and metrics["gigpo/step_group_size_mean"] == 2.0


def test_ppos_turn_level_gae_reads_the_trl_classs_turn_rewards(qwen, tmp_path):
    """gamma = lam = 1, no KL: each turn's return is the sum of the turn rewards from it on plus the score, whatever
    the critic says, so the return of turn 0 exceeds turn 1's by turn 0's reward (3)."""
    from helpers import scripted

    from trl_agentic import AgenticPPOConfig, AgenticPPOTrainer

    tok = qwen.load_tokenizer()
    args = _trl_config(AgenticPPOConfig, tmp_path, num_generations=1, advantage_mode="turn", gamma=1.0, lam=1.0,
                       beta=0.0, rollout_mode="chat", max_tokens_per_turn=128)
    trainer = AgenticPPOTrainer(model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                                train_dataset=_counter_rows(), reward_funcs=[], args=args,
                                environment_factory=CounterEnv)
    rounds = []
    trainer.record = rounds.append
    trainer.model.train()
    batch = trainer.training_batch([dict(trainer.train_dataset[i]) for i in range(2)])
    for row, t in enumerate(rounds[0].trajectories):
        (s0, _), (s1, _) = t.turn_spans
        assert batch["returns"][row, s0] - batch["returns"][row, s1] == pytest.approx(3.0)


def test_a_turn_method_that_fails_costs_its_rollout_alone(qwen, tmp_path):
    """A ``_turn_reward`` that raises for one row, a ``_state_key`` that returns a number for another: those two
    rollouts end with env_error, named in one line; the others keep their rewards."""
    from helpers import scripted

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer

    class Faulty(CounterEnv):
        def _turn_reward(self) -> float:
            if self.target == 1:
                raise RuntimeError("no reward for you")
            return super()._turn_reward()

        def _state_key(self):
            return 7 if self.target == 2 else super()._state_key()

    tok = qwen.load_tokenizer()
    trainer = AgenticGRPOTrainer(model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                                 train_dataset=_counter_rows(), reward_funcs=[],
                                 args=_trl_config(AgenticGRPOConfig, tmp_path, gigpo=True), environment_factory=Faulty)
    runs = _first_round(trainer, [0, 0, 1, 1, 2, 2]).runs
    assert [t.stop_reason for t in runs[:4]] == ["env_error"] * 4
    assert "no reward for you" in runs[0].error
    assert "Faulty._state_key() must return text" in runs[2].error and "\n" not in runs[2].error
    assert [t.turn_rewards for t in runs[4:]] == [[3.0, 0.0]] * 2


def test_a_turn_method_that_takes_arguments_is_refused_before_training():
    from trl_agentic.environments.trl_environments import TRLEnvironments

    class Wrong(CounterEnv):
        def _turn_reward(self, turn) -> float:
            return 0.0

    with pytest.raises(ValueError, match=r"Wrong._turn_reward must take no argument but self") as error:
        TRLEnvironments(environment_factory=Wrong)
    assert "\n" not in str(error.value)


async def _two_calls(client, **row):
    """An agent that calls the model twice in one conversation."""
    messages = [{"role": "user", "content": row["prompt"][0]["content"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": "Once more."}]
    return reply.choices[0].message.content


def _agent_trainer(qwen, tmp_path, turn_rewards, **extra):
    from helpers import scripted

    from trl_agentic import AgenticGRPOConfig, AgenticGRPOTrainer
    from trl_agentic.agents import Agent

    tok = qwen.load_tokenizer()
    args = _trl_config(AgenticGRPOConfig, tmp_path, max_tokens_per_turn=32, **extra)
    return AgenticGRPOTrainer(model=scripted(qwen.load_model(), tok, ["First.", "Second."]), processing_class=tok,
                              train_dataset=_counter_rows(), args=args, agent=Agent(_two_calls, turn_rewards=turn_rewards),
                              reward_funcs=lambda completions, agent_output, **k: [float(o == "Second.") for o in
                                                                                    agent_output])


def test_agents_turn_rewards_come_from_a_function_over_the_recorded_turns(qwen, tmp_path):
    """The function sees each segment's turns and the row; its numbers are the segment's turn rewards, which GiGPO
    reads (both turns of every group share a state: the same conversation)."""
    seen = []

    def progress(trajectory, target, agent_output, **row):
        seen.append((list(trajectory.actions), target, agent_output))
        return [float(target), 0.5]

    trainer = _agent_trainer(qwen, tmp_path, progress, gigpo=True)
    round_ = _first_round(trainer, [0, 0, 1, 1])
    assert [[s.turn_rewards for s in t.segments] for t in round_.runs] == [[[1.0, 0.5]]] * 2 + [[[2.0, 0.5]]] * 2
    assert [t.turn_rewards for t in round_.runs] == [[1.0, 0.5]] * 2 + [[2.0, 0.5]] * 2  # the main segment's
    assert seen[0] == (["First.", "Second."], 1, "Second.")
    metrics = trainer.advantages(round_)
    assert round_.batch.advantages.dim() == 2 and metrics["gigpo/anchored_step_share"] == 1.0


@pytest.mark.parametrize(("turn_rewards", "message"), [
    (lambda trajectory, target, **row: 1 / 0 if target == 1 else [0.0, 0.0], "turn_rewards raised ZeroDivisionError"),
    (lambda trajectory, target, **row: [0.0] if target == 1 else [0.0, 0.0], "returned 1 values for a segment of 2"),
    (lambda trajectory, target, **row: [float("nan"), 0.0] if target == 1 else [0.0, 0.0], "finite number"),
])
def test_a_turn_rewards_function_that_fails_costs_its_run_alone(qwen, tmp_path, turn_rewards, message):
    trainer = _agent_trainer(qwen, tmp_path, turn_rewards)
    runs = _first_round(trainer, [0, 0, 1, 1]).runs
    assert [t.stop_reason for t in runs] == ["env_error"] * 2 + ["terminated"] * 2
    assert message in runs[0].error and "\n" not in runs[0].error
    assert all(s.stop_reason == "env_error" for s in runs[0].segments)
    assert [t.turn_rewards for t in runs[2:]] == [[0.0, 0.0]] * 2
