"""A TextArena game of two players trains unchanged through the seats of trl_agentic.rollout.seats: TicTacToe-v0 by
self-play (both seats the policy's, both trained) and against a fixed opponent (a scripted player; a frozen copy of
the policy), every reward the game's own (each game replayed in textarena alone with the same moves), token-exact,
mask audit 0 (the suite's fixture).

textarena shares .venv-verifiers (.ci/run); these tests are skipped where it is not installed."""

from __future__ import annotations

import random
import re

import pytest

ta = pytest.importorskip("textarena", reason="textarena runs in .venv-verifiers (.ci/run)")

from helpers import ScriptedGenerator, scripted  # noqa: E402
from integration_helpers import assert_token_exact, logged, record, trainer_of  # noqa: E402

SELF_PLAY = {"Player 0": "policy", "Player 1": "policy"}
BUDGETS = {"rollout_mode": "chat", "observation_role": "user", "max_tokens_per_turn": 8, "max_completion_length": 2048,
           "max_turns": 5}  # the tiny tokenizer spends about 250 tokens on a board: a whole game fits
AVAILABLE = re.compile(r"Available Moves: (.*)")


def free_cells(text: str) -> list[str]:
    """The moves the board still allows, from the last "Available Moves" line the seat was shown."""
    return re.findall(r"\[\d\]", AVAILABLE.findall(text)[-1])


def random_player(tokenizer, seed: int = 0) -> ScriptedGenerator:
    """The policy's moves: a seeded random free cell of the board its seat was shown last (games differ)."""
    rng = random.Random(seed)
    return ScriptedGenerator(tokenizer, lambda ids: rng.choice(free_cells(tokenizer.decode(ids))) + "<|im_end|>")


def first_free(messages) -> str:
    """A fixed opponent: the first free cell of the last board it was shown."""
    return free_cells("\n".join(m["content"] for m in messages))[0]


def replay(seed: int, moves: dict[int, list[str]], game_id: str = "TicTacToe-v0") -> tuple[dict[int, float], dict]:
    """Each player's reward, and how many moves each made, when these moves are played in the game directly."""
    game = ta.make(game_id)
    game.reset(num_players=2, seed=seed)
    played = {0: 0, 1: 0}
    while True:
        player, _ = game.get_observation()
        done, _ = game.step(moves[player][played[player]])
        played[player] += 1
        if done:
            rewards, _ = game.close()
            return rewards, played


def test_self_play_trains_both_seats_with_the_games_own_rewards(qwen, tmp_path):
    from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment

    tok = qwen.load_tokenizer()
    trainer = trainer_of("grpo", tmp_path, model=qwen.load_model(), processing_class=tok,
                         train_dataset=textarena_dataset(4), reward_funcs=game_reward(),
                         environment=textarena_environment("TicTacToe-v0", players=SELF_PLAY),  # the one line
                         config={**BUDGETS, "num_generations": 4, "per_device_train_batch_size": 4})
    trainer.rollout_seam.engine.generator = random_player(tok)
    recording, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    for round_ in rounds:
        runs, rows = round_.runs, round_.rows
        assert [r.seat for r in runs] == ["Player 0", "Player 1"] * 2
        for first in (0, 2):  # two games per group of 4 copies of a seed
            zero, one = runs[first], runs[first + 1]
            assert zero.stop_reason == one.stop_reason == "terminated"
            rewards, played = replay(rows[first]["seed"], {0: zero.actions, 1: one.actions})
            assert (sum(zero.turn_rewards), sum(one.turn_rewards)) == (rewards[0], rewards[1])
            assert (zero.num_turns, one.num_turns) == (played[0], played[1])
            assert "You are Player 0 in Tic Tac Toe" in tok.decode(zero.prompt_ids)
            assert "You are Player 1 in Tic Tac Toe" in tok.decode(one.prompt_ids)
            assert "[Player 0] " + zero.actions[0] in tok.decode(one.prompt_ids)  # the other seat's move, seen
        assert_token_exact(runs, recording)
    assert {"agentic/seats/Player 0/reward", "agentic/seats/Player 1/reward", "agentic/mask_audit"} <= logged(trainer)


def test_a_fixed_scripted_opponent(qwen, tmp_path):
    """Player 1 is a scripted player (the first free cell), Player 0 the policy: every run is Player 0's, in a game of
    its own, with the game's reward."""
    from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment
    from trl_agentic.rollout.players import ScriptedPlayer

    tok = qwen.load_tokenizer()
    players = {"Player 0": "policy", "Player 1": ScriptedPlayer(first_free)}
    trainer = trainer_of("grpo", tmp_path, model=qwen.load_model(), processing_class=tok,
                         train_dataset=textarena_dataset(4), reward_funcs=game_reward(),
                         environment=textarena_environment("TicTacToe-v0", players=players), config=BUDGETS)
    trainer.rollout_seam.engine.generator = random_player(tok, seed=1)
    recording, rounds = record(trainer)
    trainer.train()
    for round_ in rounds:
        for run, row in zip(round_.runs, round_.rows):
            assert run.seat == "Player 0" and run.stop_reason == "terminated"
            game = ta.make("TicTacToe-v0")
            game.reset(num_players=2, seed=row["seed"])
            mine, done = iter(run.actions), False
            while not done:
                player, observation = game.get_observation()
                move = next(mine) if player == 0 else free_cells(observation)[0]
                done, _ = game.step(move)
            assert sum(run.turn_rewards) == game.close()[0][0]
        assert_token_exact(round_.runs, recording)


def test_ppo_against_a_frozen_copy(qwen, tmp_path):
    """PPO, Player 1 a frozen copy of the policy at the start (the test's model writes the script's moves, the copy
    too; occupied cells end games by TextArena's own rules): two steps, every run Player 0's, the copy unchanged."""
    import torch

    from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment
    from trl_agentic.rollout.players import FrozenCopy

    tok = qwen.load_tokenizer()
    trainer = trainer_of("ppo", tmp_path, model=scripted(qwen.load_model(), tok, ["[4]", "[0]", "[8]", "[2]"]),
                         processing_class=tok, train_dataset=textarena_dataset(4), reward_funcs=game_reward(),
                         environment=textarena_environment("TicTacToe-v0",
                                                           players={"Player 0": "policy", "Player 1": FrozenCopy()}),
                         config=BUDGETS)
    copy = trainer.rollout_seam.engine.players["Player 1"].model
    start = [p.detach().clone() for p in copy.parameters()]
    _, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    assert all(torch.equal(a, b) for a, b in zip(start, copy.parameters()))
    assert all(r.seat == "Player 0" and r.num_turns >= 1 and not r.env_failed for rd in rounds for r in rd.runs)


def test_kuhn_poker_plays_through_evaluate(qwen):
    """SPIRAL's Kuhn Poker: self-play rollouts through evaluate, each seat's trajectory with its own card."""
    from trl_agentic.evaluate import evaluate
    from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, ["[check]", "[check]", "[check]", "[check]"])
    report, runs = evaluate(model, tok, textarena_environment("KuhnPoker-v0", players=SELF_PLAY),
                            list(textarena_dataset(2)), game_reward(), **BUDGETS)
    assert sorted(r.seat for r in runs) == ["Player 0", "Player 1"]
    assert all("Your card is" in tok.decode(r.prompt_ids) for r in runs)


def test_wrong_players_are_refused_in_one_line():
    from trl_agentic.integrations.textarena import textarena_environment

    with pytest.raises(ValueError, match=r"^TextArena's seats are 'Player 0', 'Player 1': name them so in players=, "
                                         r"got 'red', 'blue'$"):
        textarena_environment("TicTacToe-v0", players={"red": "policy", "blue": "policy"})
    with pytest.raises(ValueError, match=r"^TicTacToe-v0 cannot be played by 3 players \(The number of players has to "
                                         r"be 2, received 3\): give players= one player per seat it has$"):
        textarena_environment("TicTacToe-v0", players={f"Player {i}": "policy" for i in range(3)})


def test_the_selfplay_recipe_trains_end_to_end(tmp_path):
    """recipes/textarena_selfplay.py with its config (TicTacToe self-play, SPIRAL's baseline), on the tiny model,
    offline: Player 0 against the starting model before, two steps of self-play, against it again after, saved."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from trl_agentic.toy import save_tiny_model

    root = Path(__file__).resolve().parents[2]
    model = save_tiny_model(str(tmp_path / "tiny-qwen2"))
    out = tmp_path / "out"
    flags = ["--model_name_or_path", model, "--max_steps", "2", "--num_games", "8", "--eval_games", "2",
             "--num_generations", "4", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
             "--max_tokens_per_turn", "16", "--max_completion_length", "2048", "--use_cpu", "--bf16", "false",
             "--output_dir", str(out)]
    proc = subprocess.run([sys.executable, "recipes/textarena_selfplay.py", "--config",
                           "recipes/configs/textarena_selfplay_grpo.yaml", *flags], cwd=root, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and (summary["game_id"], summary["opponent"]) == ("TicTacToe-v0", "self")
    assert {"reward_before", "reward_after", "wins_before", "wins_after"} <= set(summary)
    assert "before   Player 0 against the starting model: accuracy" in proc.stdout
    assert "agentic/seats/Player 1/baseline" in proc.stdout and (out / "model.safetensors").is_file()
