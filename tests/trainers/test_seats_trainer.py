"""Games with several seats train (environment=Seats(...)): self-play with both seats trained, a fixed opponent (a
frozen copy of the policy), GRPO's groups per prompt and seat and SPIRAL's role-conditioned baseline, PPO, and the
settings that would mix a game's seats refused in one line. The game is tests/seat_games.py's Race; the policy's
moves are scripted (a seeded random choice), so that games differ within a group."""

from __future__ import annotations

import random

import pytest
import torch
from datasets import Dataset
from helpers import ScriptedGenerator, agentic_args, ppo_args
from seat_games import Race, race_rows, seat_reward

from trl_agentic import AgenticGRPOTrainer, AgenticPPOTrainer
from trl_agentic.rollout.players import FrozenCopy
from trl_agentic.rollout.seats import Seats

SELF_PLAY = {"A": "policy", "B": "policy"}


def random_moves(tokenizer, seed=0):
    """A move per call: "[1]", "[2]" or, now and then, a word that loses at once."""
    rng = random.Random(seed)
    return ScriptedGenerator(tokenizer, lambda ids: rng.choice(["[1]", "[2]", "[2]", "pass"]))


def trainer_of(cls, args, tiny_model_dir, tokenizer, seats, rows=8):
    trainer = cls(model=tiny_model_dir, reward_funcs=seat_reward, args=args, processing_class=tokenizer,
                  train_dataset=Dataset.from_list([row for i in range(rows) for row in race_rows(1, target=4 + i % 3)]),
                  environment=seats)
    trainer.rollout_seam.engine.generator = random_moves(tokenizer)
    rounds, original = [], type(trainer).generation_round

    def keep(self, rows, ahead=True):
        round_ = original(self, rows, ahead)
        rounds.append(round_)
        return round_

    trainer.generation_round = keep.__get__(trainer)
    return trainer, rounds


def grpo_args(tmp_path, **extra):
    return agentic_args(tmp_path, **{"num_generations": 4, "per_device_train_batch_size": 8,
                                     "max_completion_length": 64, "max_tokens_per_turn": 6, "max_turns": 4, **extra})


def test_self_play_trains_both_seats_each_against_its_own_group(tiny_model_dir, tokenizer, tmp_path):
    """Each group of 4 copies of a prompt plays 2 games: runs A, B, A, B; each run's advantage is its reward against
    its prompt's runs of its seat (computed here by hand); the weights move; each seat's mean reward is logged."""
    trainer, rounds = trainer_of(AgenticGRPOTrainer, grpo_args(tmp_path), tiny_model_dir, tokenizer,
                                 Seats(Race, SELF_PLAY))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert any(not torch.equal(before[n], p.detach()) for n, p in trainer.model.named_parameters())
    spread = False
    for round_ in rounds:
        assert [r.seat for r in round_.runs] == ["A", "B"] * 4
        rewards = [sum(r.turn_rewards) for r in round_.runs]
        for first in range(0, 8, 4):
            for seat in (0, 1):
                members = [first + seat, first + seat + 2]
                a, b = (rewards[i] for i in members)
                mean, std = (a + b) / 2, abs(a - b) / 2 ** 0.5
                for i in members:
                    expected = (rewards[i] - mean) / (std + 1e-4)
                    assert round_.batch.advantages[i].item() == pytest.approx(expected, abs=1e-4)
                spread |= a != b
        for i in range(0, 8, 2):  # a game's two seats: a zero-sum outcome, unless A lost before B moved
            assert rewards[i] + rewards[i + 1] == 0 or round_.runs[i + 1].num_turns == 0
    assert spread, "no group had a reward spread: the check above compared zeros"
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {"agentic/seats/A/reward", "agentic/seats/B/reward", "frac_reward_zero_std"} <= logged


def test_a_fixed_opponent_stays_fixed_while_the_policy_trains(tiny_model_dir, tokenizer, tmp_path):
    """B is a frozen copy of the policy at the start: after two steps the policy has moved and the copy has not;
    every run is A's, in a game of its own."""
    frozen = FrozenCopy()
    trainer, rounds = trainer_of(AgenticGRPOTrainer, agentic_args(tmp_path, max_completion_length=64,
                                                                  max_tokens_per_turn=6, max_turns=3),
                                 tiny_model_dir, tokenizer, Seats(Race, {"A": "policy", "B": frozen}))
    copy = trainer.rollout_seam.engine.players["B"].model
    start = {n: p.detach().clone() for n, p in copy.named_parameters()}
    trainer.train()
    assert all(torch.equal(start[n], p) for n, p in copy.named_parameters())
    assert any(not torch.equal(start[n], p.detach()) for n, p in trainer.model.named_parameters())
    assert all(r.seat == "A" for round_ in rounds for r in round_.runs)


def test_role_conditioned_baselines_carry_over_rounds(tiny_model_dir, tokenizer, tmp_path):
    """seat_baseline='rae': each run's advantage is its reward minus its seat's baseline before it, the baselines
    moving by SPIRAL's average run after run, from one round to the next; logged after each round."""
    args = grpo_args(tmp_path, num_generations=2, seat_baseline="rae", rae_decay=0.5)
    trainer, rounds = trainer_of(AgenticGRPOTrainer, args, tiny_model_dir, tokenizer, Seats(Race, SELF_PLAY))
    trainer.train()
    baselines = {"A": 0.0, "B": 0.0}
    for round_, entry in zip(rounds, [e for e in trainer.state.log_history if "loss" in e]):
        for i, run in enumerate(round_.runs):
            reward = sum(run.turn_rewards)
            assert round_.batch.advantages[i].item() == pytest.approx(reward - baselines[run.seat])
            baselines[run.seat] = 0.5 * baselines[run.seat] + 0.5 * reward
        assert entry["agentic/seats/A/baseline"] == pytest.approx(baselines["A"])
        assert entry["agentic/seats/B/baseline"] == pytest.approx(baselines["B"])
    assert any(baselines.values())


def test_ppo_trains_a_game_with_several_seats(tiny_model_dir, tokenizer, tmp_path):
    """One run per row (num_generations=1): each row its own game, the trained seat alternating row by row; the
    critic values each seat's own context."""
    args = ppo_args(tmp_path, max_completion_length=64, max_tokens_per_turn=6, max_turns=3)
    trainer, rounds = trainer_of(AgenticPPOTrainer, args, tiny_model_dir, tokenizer, Seats(Race, SELF_PLAY))
    trainer.train()
    assert [r.seat for r in rounds[0].runs] == ["A", "B", "A", "B"]
    assert trainer.state.global_step == 2


@pytest.mark.parametrize("extra, message", [
    ({"gigpo": True}, r"^gigpo=True groups the steps of a group's runs by state, .*: pass gigpo=False with Seats$"),
    ({"zero_variance_groups": "dynamic_sampling"}, r"^zero_variance_groups='dynamic_sampling' keeps whole groups .*"),
    ({"multi_objective_aggregation": "normalize_then_sum"}, r"^multi_objective_aggregation='normalize_then_sum' "),
    ({"num_generations": 2}, r"^num_generations=2 with 2 trained seats leaves a group per prompt and seat of 1 run: "
                             r"nothing to compare with; pass num_generations=4 .*, or seat_baseline='rae'$"),
])
def test_settings_that_would_mix_the_seats_are_refused(tiny_model_dir, tokenizer, tmp_path, extra, message):
    args = grpo_args(tmp_path, **extra)
    with pytest.raises(ValueError, match=message):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=seat_reward, args=args, processing_class=tokenizer,
                           train_dataset=Dataset.from_list(race_rows(8)), environment=Seats(Race, SELF_PLAY))


def test_a_game_with_seats_given_as_an_environment_is_refused(tiny_model_dir, tokenizer, tmp_path):
    with pytest.raises(ValueError, match=r"^Race is a game with several seats \(A, B\): pass environment=Seats\(Race, "):
        AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=seat_reward, args=grpo_args(tmp_path),
                           processing_class=tokenizer, train_dataset=Dataset.from_list(race_rows(8)),
                           environment=Race)


def test_evaluate_plays_the_trained_seat(tiny_model, tokenizer):
    from trl_agentic.evaluate import evaluate

    report, runs = evaluate(tiny_model, tokenizer, Seats(Race, {"A": "policy", "B": FrozenCopy()}), race_rows(4),
                            seat_reward, max_turns=3, max_tokens_per_turn=6, max_completion_length=64)
    assert len(runs) == 4 and all(r.seat == "A" for r in runs)


def test_a_frozen_copy_that_refreshes_plays_the_policy_of_the_round_before(tiny_model_dir, tokenizer, tmp_path):
    """FrozenCopy(refresh_every=1): at the start of the second round the copy takes the policy's weights after the
    first step; it never takes a gradient."""
    from transformers import TrainerCallback

    after_first = {}

    class AfterFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step == 1:
                after_first.update({n: p.detach().clone() for n, p in model.named_parameters()})

    frozen = FrozenCopy(refresh_every=1)
    trainer, _ = trainer_of(AgenticGRPOTrainer, grpo_args(tmp_path), tiny_model_dir, tokenizer,
                            Seats(Race, {"A": "policy", "B": frozen}))
    start = {n: p.detach().clone() for n, p in frozen.model.named_parameters()}
    trainer.add_callback(AfterFirstStep())
    trainer.train()
    copied = dict(frozen.model.named_parameters())
    assert any(not torch.equal(start[n], after_first[n]) for n in start)  # the first step trained
    assert all(torch.equal(after_first[n], copied[n]) for n in after_first)
    assert not any(p.requires_grad for p in frozen.model.parameters())
    with pytest.raises(ValueError, match=r"^refresh_every is a number of rollouts >= 1, or None, got 0$"):
        FrozenCopy(refresh_every=0)
