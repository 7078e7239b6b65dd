"""GiGPO in AgenticGRPOTrainer: each turn's tokens get A_E + omega * A_S, from the states the environment keys and the
turn rewards it gives; a round computed by hand, GRPO unchanged at omega = 0, the metrics, real training steps."""

import math

import pytest
import torch
from helpers import ScriptedGenerator, agentic_args, lookup_dataset
from torch.testing import assert_close

from trl_agentic import AgenticGRPOTrainer
from trl_agentic.algorithms.advantages import EPS
from trl_agentic.environments.base import StepResult
from trl_agentic.toy import LookupEnvironment, lookup_reward


class Corridor:
    """Position 0 at the start; each turn "right" moves one step (turn reward 0.5), anything else stays (0); two
    turns. The environment keys its state by the position (``StepInfo.state_key``), unless ``keyed`` is False."""

    def __init__(self, keyed: bool = True) -> None:
        self.keyed = keyed

    def reset(self, **row):
        self.position, self.turns = 0, 0
        return None

    def step(self, action: str) -> StepResult:
        moved = "right" in action
        self.position += moved
        self.turns += 1
        info = {"state_key": f"pos{self.position}"} if self.keyed else {}
        return StepResult(observation=f" at {self.position}", reward=0.5 * moved, terminated=self.turns == 2,
                          info=info)


def final_position(completions, trajectory, **kwargs):
    return [float(sum("right" in a for a in t.actions)) for t in trajectory]


def _moves(tokenizer, plans):
    """A generator whose k-th prompt of every call takes plan ``k % len(plans)``, one move per turn."""

    def script(ids):
        sample = script.calls % len(plans)
        script.calls += 1
        turn = tokenizer.decode(ids).count(" at ")
        return f"<go>{plans[sample][turn]}</go>"

    script.calls = 0
    return ScriptedGenerator(tokenizer, script)


def _round(tiny_model_dir, tokenizer, tmp_path, plans, environment=Corridor, **config):
    args = agentic_args(tmp_path, max_turns=2, max_tokens_per_turn=16, max_completion_length=64,
                        **{"gigpo": True, **config})
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=final_position, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer, environment=environment)
    trainer.rollout_seam.engine.generator = _moves(tokenizer, plans)
    trainer.model.train()
    rows = [trainer.train_dataset[i // 2] for i in range(4)]  # two groups of two samples, as TRL's sampler lays them
    round_ = trainer.generation_round(rows)
    metrics = trainer.advantages(round_)
    return trainer, round_, metrics


def _turn_values(round_):
    """The advantage on each turn's tokens (every token of a turn has the same), per training row."""
    advantages = round_.batch.advantages
    out = []
    for row, t in enumerate(round_.trajectories):
        values = []
        for start, end in t.turn_spans:
            span = advantages[row, start:end]
            assert torch.equal(span, span[:1].expand_as(span))
            values.append(float(span[0]))
        out.append(values)
    return out


def test_a_round_computed_by_hand(tiny_model_dir, tokenizer, tmp_path):
    """Sample 0 of each group goes right twice: turn rewards [0.5, 0.5], outcome 2; sample 1 right then left: [0.5, 0],
    outcome 1. Step rewards (the outcome on the last turn) [0.5, 2.5] and [0.5, 1]; gamma = 0.95: returns
    [0.5 + 0.95 * 2.5, 2.5] = [2.875, 2.5] and [1.45, 1]. Turn 0 starts from the prompt (history key) and turn 1 from
    "pos1" in both: two step groups of two. F_norm = 1 (scale_rewards="none"), omega = 0.5:
    A_E = +-0.5, A_S(turn 0) = +-0.7125, A_S(turn 1) = +-0.75."""
    trainer, round_, metrics = _round(tiny_model_dir, tokenizer, tmp_path, [["right", "right"], ["right", "left"]],
                                      scale_rewards="none", gigpo_step_weight=0.5)
    assert [t.turn_rewards for t in round_.runs] == [[0.5, 0.5], [0.5, 0.0]] * 2
    expected = [[0.5 + 0.5 * 0.7125, 0.5 + 0.5 * 0.75], [-0.5 - 0.5 * 0.7125, -0.5 - 0.5 * 0.75]] * 2
    assert_close(torch.tensor(_turn_values(round_)), torch.tensor(expected), atol=1e-6, rtol=0)
    assert metrics["gigpo/anchored_step_share"] == 1.0 and metrics["gigpo/step_group_size_mean"] == 2.0
    # the tokens outside every turn (observations) carry the episode advantage; the loss masks them
    row0 = round_.batch.advantages[0]
    observation = round_.batch.env_mask[0] == 0
    assert torch.allclose(row0[observation & (round_.batch.completion_mask[0] == 1)], torch.tensor(0.5))


def test_each_turns_advantage_is_recorded_and_shown(tiny_model_dir, tokenizer, tmp_path):
    """trajectory_dir keeps each turn's advantage with its turn rewards, and the trajectory view shows both."""
    from trl_agentic.render import render_html
    from trl_agentic.trajectory import load_trajectories

    trainer, round_, _ = _round(tiny_model_dir, tokenizer, tmp_path, [["right", "right"], ["right", "left"]],
                                scale_rewards="none", gigpo_step_weight=0.5, trajectory_dir=str(tmp_path / "traj"))
    trainer.record(round_)
    rows = list(load_trajectories(tmp_path / "traj" / "trajectories-rank0.jsonl"))
    assert [row["turn_rewards"] for row in rows] == [[0.5, 0.5], [0.5, 0.0]] * 2
    assert_close(torch.tensor([row["turn_advantages"] for row in rows]), torch.tensor(_turn_values(round_)))
    page = render_html(rows[:1])
    assert "Turn 1 · step reward (environment) 0.5 · advantage 0.8562" in page
    assert "turn_advantages" not in page


def test_std_normalisation_and_a_state_no_one_else_reached(tiny_model_dir, tokenizer, tmp_path):
    """scale_rewards="group": A_E and A_S divided by their group's std. Sample 1 goes left first: turn 1 starts from
    pos0 for it and pos1 for sample 0, each alone, so turn 1 gets the episode advantage alone; and half the steps
    found a group."""
    trainer, round_, metrics = _round(tiny_model_dir, tokenizer, tmp_path, [["right", "right"], ["left", "right"]])
    # outcomes 2 and 1; returns turn 0: [0.5 + 0.95 * 2.5, 0 + 0.95 * 1.5] = [2.875, 1.425]
    a_e = 0.5 / (1 / math.sqrt(2) + EPS)
    a_s = 0.725 / (1.45 / math.sqrt(2) + EPS)
    expected = [[a_e + a_s, a_e], [-a_e - a_s, -a_e]] * 2
    assert_close(torch.tensor(_turn_values(round_)), torch.tensor(expected), atol=1e-5, rtol=0)
    assert metrics["gigpo/anchored_step_share"] == 0.5
    assert metrics["gigpo/step_group_size_mean"] == pytest.approx(8 / 6)


def test_without_keys_the_observation_history_keys_the_states(tiny_model_dir, tokenizer, tmp_path):
    """The environment gives no key: with "history", turn 1 of the two samples starts from the same history (" at 1"
    after the same prompt) only when their observations are equal; with "observation" likewise here."""
    for state_key in ("history", "observation"):
        _, round_, metrics = _round(tiny_model_dir, tokenizer, tmp_path / state_key,
                                    [["right", "right"], ["right", "left"]], environment=lambda: Corridor(keyed=False),
                                    scale_rewards="none", gigpo_step_weight=0.5, gigpo_state_key=state_key)
        assert metrics["gigpo/anchored_step_share"] == 1.0
        expected = torch.tensor([0.5 + 0.5 * 0.7125, 0.5 + 0.5 * 0.75])
        assert_close(torch.tensor(_turn_values(round_)[0]), expected, atol=1e-6, rtol=0)


def test_turn_rewards_alone_make_the_return_when_asked(tiny_model_dir, tokenizer, tmp_path):
    """gigpo_step_rewards="turns": returns [0.5 + 0.95 * 0.5, 0.5] and [0.5, 0]: A_S = +-0.2375, +-0.25."""
    _, round_, _ = _round(tiny_model_dir, tokenizer, tmp_path, [["right", "right"], ["right", "left"]],
                          scale_rewards="none", gigpo_step_weight=1.0, gigpo_step_rewards="turns")
    expected = torch.tensor([[0.5 + 0.2375, 0.5 + 0.25], [-0.5 - 0.2375, -0.5 - 0.25]])
    assert_close(torch.tensor(_turn_values(round_)[:2]), expected, atol=1e-6, rtol=0)


def test_zero_weight_is_grpo(tiny_model_dir, tokenizer, tmp_path):
    """omega = 0: every trained token carries GRPO's advantage of its run, the one the trainer gives without GiGPO."""
    plans = [["right", "right"], ["left", "right"]]
    _, with_gigpo, _ = _round(tiny_model_dir, tokenizer, tmp_path / "a", plans, gigpo_step_weight=0.0)
    _, without, _ = _round(tiny_model_dir, tokenizer, tmp_path / "b", plans, gigpo=False)
    grpo = without.batch.advantages
    assert grpo.dim() == 1 and (grpo != 0).all()
    trained = with_gigpo.batch.loss_mask.bool()
    assert torch.equal(with_gigpo.batch.advantages[trained], grpo.unsqueeze(1).expand_as(trained)[trained])


@pytest.mark.parametrize("loss", ["k3", "k2"])
def test_two_training_steps(tiny_model_dir, tokenizer, tmp_path, loss):
    """Sampled rollouts of the lookup task: two steps train, TRL's loss (k3) and ours (k2) take the per-token
    advantages, and the metrics are logged every step."""
    args = agentic_args(tmp_path, gigpo=True, beta=0.05, kl_estimator=loss)
    trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=args,
                                 train_dataset=lookup_dataset(8), processing_class=tokenizer,
                                 environment=LookupEnvironment)
    trainer.train()
    logs = [r for r in trainer.state.log_history if "loss" in r]
    assert len(logs) == 2 and all(math.isfinite(r["loss"]) for r in logs)
    assert all(0.0 <= r["gigpo/anchored_step_share"] <= 1.0 and r["gigpo/step_group_size_mean"] >= 1.0 for r in logs)


def test_bad_settings_are_refused_in_one_line(tmp_path, tiny_model_dir, tokenizer):
    cases = [({"gigpo_state_key": "tokens"}, "gigpo_state_key must be one of"),
             ({"gigpo_step_rewards": "outcome"}, "gigpo_step_rewards must be one of"),
             ({"gigpo_gamma": 1.5}, "gigpo_gamma is a discount"),
             ({"gigpo": True, "scale_rewards": "batch"}, "scale_rewards='group'"),
             ({"gigpo": True, "zero_variance_groups": "dynamic_sampling"}, "zero_variance_groups='keep'")]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message) as error:
            agentic_args(tmp_path, **overrides)
        assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="gigpo=True credits the turns of rollouts"):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=lookup_reward, args=agentic_args(tmp_path, gigpo=True),
                           train_dataset=lookup_dataset(8), processing_class=tokenizer)


def test_a_state_key_that_is_not_text_costs_its_trajectory(tiny_model_dir, tokenizer, tmp_path):
    """An environment's ``info["state_key"]`` must be text: a number ends that trajectory (env_error, one line naming
    the key); the other runs of the round are grouped as before."""

    class NumberedCorridor(Corridor):
        def reset(self, **row):
            self.numbered = row["value"] == lookup_dataset(8)[0]["value"]
            return super().reset(**row)

        def step(self, action):
            result = super().step(action)
            if self.numbered:
                result.info["state_key"] = self.position
            return result

    _, round_, metrics = _round(tiny_model_dir, tokenizer, tmp_path, [["right", "right"], ["right", "left"]],
                                environment=NumberedCorridor)
    assert [t.stop_reason for t in round_.runs] == ["env_error"] * 2 + ["terminated"] * 2
    assert "['state_key'] must be text" in round_.runs[0].error and "\n" not in round_.runs[0].error
    assert metrics["gigpo/anchored_step_share"] == 1.0  # the second group's four steps, in two step groups


def test_the_settings_are_command_line_flags():
    """``trl-agentic grpo`` (TRL's parser over AgenticGRPOConfig's fields) takes every GiGPO setting as a flag."""
    from trl_agentic.cli import make_parser

    _, config, *_ = make_parser("grpo").parse_args_and_config(
        ["--output_dir", "out", "--use_cpu", "--gigpo", "--gigpo_step_weight", "0.5", "--gigpo_gamma", "1.0",
         "--gigpo_state_key", "observation", "--gigpo_step_rewards", "turns", "--scale_rewards", "none"])
    assert (config.gigpo, config.gigpo_step_weight, config.gigpo_gamma, config.gigpo_state_key,
            config.gigpo_step_rewards) == (True, 0.5, 1.0, "observation", "turns")
