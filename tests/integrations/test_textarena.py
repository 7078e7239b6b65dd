"""A TextArena game trains through our environment interface with its own reward, in one line
(trl_agentic.integrations.textarena), through the real package: GuessTheNumber-v0 with its own wrappers, offline.

textarena shares .venv-verifiers (.ci/run); these tests are skipped where it is not installed."""

from __future__ import annotations

import functools

import pytest

ta = pytest.importorskip("textarena", reason="textarena runs in .venv-verifiers (.ci/run)")

from helpers import scripted  # noqa: E402
from integration_helpers import (  # noqa: E402
    assert_token_exact,
    gigpo_logged,
    logged,
    record,
    train_two_ways,
    trainer_of,
)

GUESSES = ["I guess [10].", "[5]", "[15]", "[8]"]


def replay(seed: int, guesses=GUESSES, game_id: str = "GuessTheNumber-v0") -> tuple[float, int]:
    """The game's own reward and turns when these guesses are played in it directly (textarena alone)."""
    game = ta.make(game_id)
    game.reset(num_players=1, seed=seed)
    for turn, guess in enumerate(guesses, 1):
        done, _ = game.step(guess)
        if done:
            rewards, _ = game.close()
            return float(rewards[0]), turn
    return 0.0, len(guesses)


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_a_textarena_game_trains_two_steps(qwen, tmp_path, kind):
    from trl_agentic.integrations.textarena import game_reward, textarena_dataset, textarena_environment

    tok = qwen.load_tokenizer()
    trainer = trainer_of(kind, tmp_path, model=scripted(qwen.load_model(), tok, GUESSES), processing_class=tok,
                         train_dataset=textarena_dataset(8), reward_funcs=game_reward(),
                         environment=textarena_environment("GuessTheNumber-v0"),  # the one line
                         config={"rollout_mode": "chat", "max_tokens_per_turn": 16, "max_completion_length": 256})
    recording, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    runs = [r for round_ in rounds for r in round_.runs]
    rows = [row for round_ in rounds for row in round_.rows]
    assert len(runs) == 4
    for run, row in zip(runs, rows):
        reward, turns = replay(row["seed"])
        assert run.num_turns == turns and sum(run.turn_rewards) == reward, (row, run.turn_rewards)
        assert run.stop_reason == ("terminated" if reward else "max_turns"), run.stop_reason
        assert "You are Player 0. You are playing Guess The Number." in tok.decode(run.prompt_ids)
        assert "[GAME] The target number is" in run.observations[0] and "You are Player 0" not in run.observations[0]
    trained = [float(x) for round_ in rounds for x in round_.run_rewards[:, 0]]
    assert trained == [replay(row["seed"])[0] for row in rows]
    assert_token_exact(runs, recording)
    assert {"rewards/textarena_reward/mean", "agentic/mask_audit"} <= logged(trainer)


# FrozenLake-v0 with seed 0 (P the player, H a hole, G the goal):   P . . .
# two ways to (1, 1), then on together: the first reaches the goal,     . . . H
# the second falls into the hole at (3, 1).                             . . . .
WALKS = {"goal": ["[right]", "[down]", "[down]", "[right]", "[right]", "[down]"],  # . H H G
         "hole": ["[down]", "[right]", "[down]", "[down]"]}
PLACES = {"goal": [[0, 1], [1, 1], [2, 1], [2, 2], [2, 3], [3, 3]], "hole": [[1, 0], [1, 1], [2, 1], [3, 1]]}


def test_each_turn_carries_the_games_state_and_gigpo_groups_on_it(qwen, tmp_path):
    """Each turn's info["state_key"] is the game's own state (game_state: the grid, the player's place) and its reward
    the game's (its outcome on the last turn, 0 before: TextArena 0.7 reports none earlier). GiGPO groups the turns
    that start from the same place however it was reached: per group, the first turns (the prompt) and the two walks'
    turns 3 and 4 (both at (1, 1), then (2, 1)) share states: 6 of 10 steps. Keyed by the observation history (the
    only key before), the walks never meet again after their first turn: 2 of 10."""
    import json

    from datasets import Dataset

    from trl_agentic.integrations.textarena import game_reward, textarena_environment

    tok = qwen.load_tokenizer()
    rows = Dataset.from_dict({"prompt": [[{"role": "user", "content": f"Game {n}."}] for n in (1, 2)], "seed": [0, 0]})
    trainer = trainer_of("grpo", tmp_path, model=qwen.load_model(), processing_class=tok, train_dataset=rows,
                         reward_funcs=game_reward(), environment=textarena_environment("FrozenLake-v0"),
                         config={"rollout_mode": "chat", "max_turns": 6, "max_tokens_per_turn": 8,
                                 "max_completion_length": 2048, "per_device_train_batch_size": 4, "max_steps": 1,
                                 "gigpo": True, "gigpo_step_rewards": "turns", "scale_rewards": "none"})
    round_, walks = train_two_ways(trainer, tok, WALKS)
    for run, walk in zip(round_.runs, walks):
        keys = [json.loads(info["state_key"]) for info in run.turn_infos]
        assert [key["player_pos"] for key in keys] == PLACES[walk]
        assert all(key["grid"][3] == [" ", "H", "H", "G"] for key in keys)
        reward, turns = replay(0, WALKS[walk], "FrozenLake-v0")
        assert run.turn_rewards == [0.0] * (turns - 1) + [reward] and run.stop_reason == "terminated"
    assert replay(0, WALKS["goal"], "FrozenLake-v0")[0] == 1.0 and 0 < replay(0, WALKS["hole"], "FrozenLake-v0")[0] < 1
    assert gigpo_logged(trainer) == pytest.approx((6 / 10, 10 / 7))  # 10 steps in 7 states per group


def test_a_game_keeps_its_state_where_it_keeps_it():
    """RushHour's game_state holds objects of its own (cars with __slots__, whose repr is an address): keyed by their
    fields, the same in two games of one seed. Countdown keeps its numbers in attributes of its own and an empty
    game_state: no key, so its turns are keyed by the observation history, never all grouped as one state."""
    from trl_agentic.integrations.textarena import TextArenaEnvironment

    keys = []
    for _ in range(2):
        game = TextArenaEnvironment("RushHour-v0")
        game.reset(seed=5)
        keys.append(game.step("[A+]").info["state_key"])
    assert keys[0] == keys[1] and "_Vehicle{" in keys[0] and "0x" not in keys[0]
    countdown = TextArenaEnvironment("Countdown-v0")
    countdown.reset(seed=0)
    assert countdown.game.state.game_state == {}
    result = countdown.step("[0 1 +]")
    assert "state_key" not in result.info and not result.terminated


def test_a_game_that_raises_costs_its_own_trajectories(qwen, tmp_path):
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    from trl_agentic.integrations.textarena import TextArenaEnvironment, game_reward, textarena_dataset

    class Broken(GuessTheNumberEnv):
        def step(self, action):
            if self.game_number % 2:
                raise RuntimeError("the game fell over")
            return super().step(action)

    tok = qwen.load_tokenizer()
    trainer = trainer_of("grpo", tmp_path, model=scripted(qwen.load_model(), tok, GUESSES), processing_class=tok,
                         train_dataset=textarena_dataset(8), reward_funcs=game_reward(),
                         environment=functools.partial(TextArenaEnvironment, make=Broken),
                         config={"rollout_mode": "chat", "max_tokens_per_turn": 16, "max_steps": 3,
                                 "max_completion_length": 256})
    _, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 3
    kinds = set()
    for round_ in rounds:
        for run, row in zip(round_.runs, round_.rows):
            game = Broken()
            game.reset(num_players=1, seed=row["seed"])
            kinds.add(game.game_number % 2)
            if game.game_number % 2:
                assert run.stop_reason == "env_error" and "the game fell over" in run.error
            else:
                assert run.stop_reason in ("terminated", "max_turns") and not run.error
    assert kinds == {0, 1}  # both kinds of games were drawn


def test_what_cannot_train_is_refused_in_one_line():
    from trl_agentic.integrations.textarena import TextArenaEnvironment, textarena_environment

    with pytest.raises(ValueError, match=r"^'Nope-v0' is not a registered TextArena game id; pass one such as "
                                         r"'GuessTheNumber-v0' \(textarena.envs.registration.ENV_REGISTRY lists "
                                         r"them\)$"):
        textarena_environment("Nope-v0")
    with pytest.raises(ValueError, match=r"^\['Wordle-v0'\] is not a registered TextArena game id"):
        textarena_environment(["Wordle-v0"])  # textarena.make draws one of a list: a run trains one game
    with pytest.raises(ValueError, match=r"^TicTacToe-v0 is a game of several players \(The number of players has to "
                                         r"be 2, received 1\): say who plays each seat, e.g. players=\{'Player 0': "
                                         r"'policy', 'Player 1': 'policy'\} \(self-play\), or FrozenCopy\(\), "):
        textarena_environment("TicTacToe-v0")  # players= plays it: test_textarena_seats.py
    with pytest.raises(ValueError, match="a game id .* or make=, one of them"):
        TextArenaEnvironment()


@pytest.fixture
def no_nltk_data(monkeypatch, tmp_path):
    """NLTK as on the offline machine: no corpus found (an empty data folder), none fetched (the word games call
    nltk.download at import), and the word games' modules imported afresh."""
    import sys

    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path)])
    monkeypatch.setattr(nltk, "download", lambda *args, **kwargs: False)
    for name in [m for m in sys.modules if m.startswith(("textarena.envs.Wordle", "textarena.envs.Hangman"))]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("game_id", ["Wordle-v0", "Hangman-v0"])
def test_a_word_game_without_its_nltk_corpus_names_it_and_how_to_get_it(no_nltk_data, game_id):
    """NLTK's LookupError is a framed block of 15 lines; the refusal is one, before training, and a trajectory whose
    game cannot be made says the same."""
    from trl_agentic.integrations.textarena import TextArenaEnvironment, textarena_environment

    line = (rf"^{game_id} needs NLTK's 'words' data, which is not installed: run `python -m nltk.downloader words` "
            r"\(or set NLTK_DATA to a folder that holds corpora/words\)$")
    with pytest.raises(ValueError, match=line):
        textarena_environment(game_id)
    with pytest.raises(ValueError, match=line):
        TextArenaEnvironment(game_id).reset(seed=0)


def test_a_registered_game_that_raises_is_not_called_unregistered():
    """A registered game's own ValueError (at make, or at the one-player reset) is quoted as the game's, in one line,
    never followed by "pass a registered game id"."""
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv
    from textarena.envs.registration import ENV_REGISTRY, register

    from trl_agentic.integrations.textarena import textarena_environment

    class Picky(GuessTheNumberEnv):
        def __init__(self, **kwargs):
            raise ValueError("min_number must be below max_number\n(got 20 and 1)")

    register("PickyGuess-v0", entry_point=Picky)
    try:
        with pytest.raises(ValueError, match=r"^PickyGuess-v0 could not be made: ValueError: min_number must be below "
                                             r"max_number$"):
            textarena_environment("PickyGuess-v0")
    finally:
        ENV_REGISTRY.pop("PickyGuess-v0")
    with pytest.raises(ValueError, match=r"^GuessTheNumber-v0 could not be reset for one player: ValueError: empty "
                                         r"range .*$") as refused:
        textarena_environment("GuessTheNumber-v0", min_number=20, max_number=1)
    assert "registered" not in str(refused.value)


def test_the_recipe_trains_a_game_end_to_end(tmp_path):
    """recipes/textarena_games.py with its config, on the tiny model, offline: evaluated before, trained two steps,
    evaluated after, saved."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from trl_agentic.toy import save_tiny_model

    root = Path(__file__).resolve().parents[2]
    model = save_tiny_model(str(tmp_path / "tiny-qwen2"))
    out = tmp_path / "out"
    flags = ["--model_name_or_path", model, "--max_steps", "2", "--num_games", "8", "--eval_games", "4",
             "--num_generations", "4", "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1",
             "--max_turns", "3", "--max_tokens_per_turn", "16", "--max_completion_length", "256",
             "--output_dir", str(out)]
    proc = subprocess.run([sys.executable, "recipes/textarena_games.py", "--config",
                           "recipes/configs/textarena_games_grpo.yaml", *flags], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["game_id"] == "GuessTheNumber-v0"
    assert {"success_before", "success_after", "reward_before", "reward_after"} <= set(summary)
    assert "before   accuracy" in proc.stdout and "after    accuracy" in proc.stdout
    assert (out / "model.safetensors").is_file()
