"""Games with several seats through the engine (trl_agentic.rollout.seats): one trajectory per trained seat, each
token-exact with its own context; one generation call per pass for every seat the policy plays; the other seats
played by a scripted player, a frozen copy or another model; failures cost their own game, named in one line.

The game is tests/seat_games.py's Race (no textarena needed)."""

from __future__ import annotations

import random
import time

import pytest
from helpers import ScriptedGenerator
from seat_games import Race, race_rows

from trl_agentic import RolloutConfig
from trl_agentic.environments.seats import SeatedEnvironment, SeatTurn
from trl_agentic.rollout.players import FrozenCopy, ModelPlayer, ScriptedPlayer
from trl_agentic.rollout.seats import SeatEngine, Seats, bound_players, games_of_rows


@pytest.fixture(scope="module")
def qwen():
    """The tiny Qwen2.5-Instruct convention: a real chat template and end-of-turn token."""
    from conventions import build_convention

    return build_convention("qwen2.5-instruct")


def engine(tokenizer, seats, script, **config):
    generator = script if not callable(script) else ScriptedGenerator(tokenizer, script)
    cfg = RolloutConfig(**{"max_turns": 4, "max_completion_length": 200, "max_tokens_per_turn": 10, **config})
    return SeatEngine(generator, tokenizer, seats, bound_players(seats, generator, tokenizer, cfg), cfg), generator


def play(eng, rows):
    return eng.run([row["prompt"] for row in rows], rows)


def assert_token_exact(run, generator_outputs, tokenizer):
    """Every sampled span is the generator's output for that turn (cut at the turn's end), decodes to the action,
    and the env mask is 1 exactly there."""
    covered = [0] * len(run.completion_ids)
    for (start, end), action, raw in zip(run.turn_spans, run.actions, run.generated_ids):
        assert run.completion_ids[start:end] == raw[: end - start] and raw in generator_outputs
        assert tokenizer.decode(run.completion_ids[start:end], skip_special_tokens=True) == action
        covered[start:end] = [1] * (end - start)
    assert covered == run.env_mask and len(run.env_mask) == len(run.completion_ids)


class Outputs:
    """A scripted generator that keeps every output (the reference of token exactness) and every batch size."""

    def __init__(self, tokenizer, script):
        self.inner, self.outputs, self.batches = ScriptedGenerator(tokenizer, script), [], []

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        out = self.inner.generate(prompts, max_new_tokens, stop_strings, eos_token_ids)
        self.outputs += [list(g.ids) for g in out]
        self.batches.append(len(prompts))
        return out


def test_rows_share_games_one_trained_seat_each():
    rows = [{"p": 0}] * 4 + [{"p": 1}] * 3 + [{"p": 2}]
    assert games_of_rows(rows, ("A", "B")) == [(0, {"A": 0, "B": 1}), (2, {"A": 2, "B": 3}), (4, {"A": 4, "B": 5}),
                                               (6, {"A": 6}), (7, {"B": 7})]
    assert games_of_rows(rows, ("A",)) == [(i, {"A": i}) for i in range(8)]


def test_self_play_gives_each_seat_its_own_token_exact_trajectory(tokenizer):
    """Both seats played and trained by the policy: two rows per game (A, then B), each run its seat's own context
    (its opening in the prompt, the other seat's moves as masked observations), opposite rewards, one generation call
    per pass for every game's seat to act."""
    generator = Outputs(tokenizer, lambda ids: "I add [2]")
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": "policy"}), generator)
    runs = play(eng, race_rows(4))
    assert [r.seat for r in runs] == ["A", "B", "A", "B"]
    a, b = runs[0], runs[1]
    assert tokenizer.decode(a.prompt_ids) == "Race.\nYou are A. Add [1] or [2]; reach 5 to win. Total 0."
    assert tokenizer.decode(b.prompt_ids) == "Race.\nYou are B. Add [1] or [2]; reach 5 to win. A played [2]. Total 2."
    assert a.actions == ["I add [2]", "I add [2]"] and b.actions == ["I add [2]"]  # A: 2, B: 4, A: 6 wins
    assert a.observations == ["B played [2]. Total 4.", None]
    assert (a.turn_rewards, b.turn_rewards) == ([0.0, 1.0], [-1.0])
    assert a.stop_reason == b.stop_reason == "terminated"
    assert a.prompt == "Race.\nYou are A. Add [1] or [2]; reach 5 to win. Total 0."
    for run in runs:
        assert_token_exact(run, generator.outputs, tokenizer)
    start, end = a.turn_spans[0][1], a.turn_spans[1][0]
    assert tokenizer.decode(a.completion_ids[start:end]) == "B played [2]. Total 4." and not any(a.env_mask[start:end])
    assert generator.batches == [2, 2, 2]  # 2 games: A, B, A, each pass ONE call for both games' seats


def test_self_play_in_chat_mode_renders_each_seat_as_its_own_conversation(qwen):
    tok = qwen.tokenizer
    eng, _ = engine(tok, Seats(Race, {"A": "policy", "B": "policy"}), lambda ids: "[2]<|im_end|>",
                    rollout_mode="chat", observation_role="user")
    prompt = [{"role": "user", "content": "Race."}]
    a, b = eng.run([prompt, prompt], [{}, {}])
    text = tok.decode(a.prompt_ids + a.completion_ids)
    assert text.endswith("<|im_start|>user\nRace.You are A. Add [1] or [2]; reach 5 to win. Total 0.<|im_end|>\n"
                         "<|im_start|>assistant\n[2]<|im_end|>\n<|im_start|>user\nB played [2]. Total 4.<|im_end|>\n"
                         "<|im_start|>assistant\n[2]<|im_end|>")
    assert "You are B" in tok.decode(b.prompt_ids) and b.actions == ["[2]"] and b.turn_rewards == [-1.0]


def test_a_scripted_opponent_sees_its_own_conversation(tokenizer):
    """A fixed opponent: B is a scripted player (never trained, no trajectory), A the policy; every row trains A, each
    in a game of its own. The script receives B's conversation: its opening, its own moves, A's moves."""
    seen = []

    def opponent(messages):
        seen.append(messages)
        return "[1]"

    eng, generator = engine(tokenizer, Seats(Race, {"A": "policy", "B": ScriptedPlayer(opponent)}),
                            lambda ids: "[2]")
    runs = play(eng, race_rows(2))
    assert [r.seat for r in runs] == ["A", "A"]
    assert runs[0].actions == ["[2]", "[2]"] and runs[0].turn_rewards == [0.0, 1.0]  # 2, B 3, A 5
    assert seen[-1] == [{"role": "user", "content": "Race.\nYou are B. Add [1] or [2]; reach 5 to win. A played [2]. "
                                                     "Total 2."}]
    assert [c["batch"] for c in generator.calls] == [2, 2]


def test_a_frozen_copy_plays_a_seat_with_its_own_weights(tiny_model, tokenizer):
    """FrozenCopy() copies the model the generator samples with when the rollout is built: equal weights, other
    tensors, on the CPU, never trained; it plays B from its conversation with real generation."""
    from trl_agentic.rollout.generation import HFGenerator

    generator = HFGenerator(tiny_model, tokenizer)
    frozen = FrozenCopy()
    seats = Seats(Race, {"A": "policy", "B": frozen})
    cfg = RolloutConfig(max_turns=3, max_completion_length=120, max_tokens_per_turn=6)
    players = bound_players(seats, generator, tokenizer, cfg)
    copy = players["B"].model
    assert copy is not tiny_model and all(
        p.data_ptr() != q.data_ptr() and p.device.type == "cpu" and not p.requires_grad and (p == q).all()
        for p, q in zip(copy.parameters(), tiny_model.parameters()))
    assert bound_players(seats, generator, tokenizer, cfg)["B"] is players["B"]  # one copy per FrozenCopy
    tied = tiny_model.get_output_embeddings().weight is tiny_model.get_input_embeddings().weight
    assert (copy.get_output_embeddings().weight is copy.get_input_embeddings().weight) == tied
    runs = SeatEngine(generator, tokenizer, seats, players, cfg).run(["Race.\n"] * 2, [{}, {}])
    assert all(r.seat == "A" and r.num_turns >= 1 for r in runs)


def test_another_model_plays_from_its_own_chat_template(qwen, tokenizer):
    """ModelPlayer(model, its tokenizer): a model with another tokenizer than the policy's, its moves rendered with
    its own chat template and cut at its own end ids."""
    player = ModelPlayer(qwen.load_model(), qwen.load_tokenizer())
    cfg = RolloutConfig(max_tokens_per_turn=5)
    player.bound(None, tokenizer, cfg)
    [move] = player.reply([[{"role": "user", "content": "Add [1] or [2]."}]], [])
    assert isinstance(move, str) and "<|im_end|>" not in move
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": player}), lambda ids: "[2]")
    assert all(r.seat == "A" and r.stop_reason in ("terminated", "max_turns") for r in play(eng, race_rows(2)))


@pytest.mark.parametrize("fail, kind, message", [
    ("reset", "env_error", "Race.reset raised RuntimeError: the race could not start"),
    ("step", "env_error", "Race.step raised ValueError: the race broke"),
    ("hang", "env_timeout", "Race.step took longer than env_timeout=1 s"),
    ("stranger", "env_error", "Race named seat 'C', which has no player (seats: A, B): pass players={'C': ...}"),
    ("garbage", "env_error", "Race.step raised EnvironmentOutputError: Race.step must return a SeatTurn(seat, "
                             "observation, rewards), got dict"),
])
def test_a_broken_game_ends_its_own_trajectories_named_in_one_line(tokenizer, fail, kind, message):
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": "policy"}), lambda ids: "[1]", env_timeout=1)
    runs = play(eng, race_rows(2) + race_rows(2, fail=fail) + race_rows(2))
    broken, fine = runs[2:4], runs[:2] + runs[4:]
    assert all(r.stop_reason == kind and r.error == message for r in broken), [(r.stop_reason, r.error) for r in broken]
    assert all(r.stop_reason == "terminated" and not r.error for r in fine)


def test_an_opponent_that_raises_or_hangs_ends_its_own_game(tokenizer):
    """A scripted player is called once per game: the one that raises (or hangs past env_timeout) in one game ends
    that game alone, named with its seat and player."""
    def opponent(messages):
        if "reach 7" in messages[0]["content"]:
            raise ValueError("no move")
        if "reach 9" in messages[0]["content"]:
            time.sleep(3)
        return "[1]"

    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": ScriptedPlayer(opponent, name="picky")}),
                    lambda ids: "[1]", env_timeout=1)
    runs = play(eng, [*race_rows(1, target=5), *race_rows(1, target=7), *race_rows(1, target=9)])
    assert runs[0].stop_reason == "terminated"
    assert (runs[1].stop_reason, runs[1].error) == ("env_error", "seat 'B' played by ScriptedPlayer(picky) raised "
                                                                 "ValueError: no move")
    assert (runs[2].stop_reason, runs[2].error) == ("env_timeout", "seat 'B' played by ScriptedPlayer(picky) took "
                                                                   "longer than env_timeout=1 s")


class PickyModel:
    """A batched player (a model's shape) that cannot answer a conversation mentioning "reach 7"."""

    batched = True

    def __init__(self):
        self.calls = []

    def bound(self, generator, processing_class, config):
        return self

    def reply(self, conversations, stop_strings):
        self.calls.append(len(conversations))
        if any("reach 7" in c[0]["content"] for c in conversations):
            raise RuntimeError("the model broke")
        return ["[1]"] * len(conversations)


def test_a_batched_opponent_that_raises_is_retried_one_game_at_a_time(tokenizer):
    model = PickyModel()
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": model}), lambda ids: "[1]")
    runs = play(eng, [*race_rows(1), *race_rows(1, target=7), *race_rows(1)])
    assert [r.stop_reason for r in runs] == ["terminated", "env_error", "terminated"]
    assert runs[1].error == "seat 'B' played by PickyModel raised RuntimeError: the model broke"
    assert model.calls[:4] == [3, 1, 1, 1]  # the batch, then each game alone


def test_budgets_end_the_game_for_every_seat(tokenizer):
    """A seat past max_turns ends max_turns, the other env_truncated; a seat past its token budget max_tokens."""
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": "policy"}), lambda ids: "[1]", max_turns=2)
    a, b = play(eng, race_rows(2, target=50))
    assert (a.stop_reason, b.stop_reason, a.num_turns, b.num_turns) == ("max_turns", "env_truncated", 2, 2)
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": "policy"}), lambda ids: "[1]",
                    max_completion_length=40)
    a, b = play(eng, race_rows(2, target=50))
    assert {a.stop_reason, b.stop_reason} == {"max_tokens", "env_truncated"}


class Monologue(SeatedEnvironment):
    """After A's first move the turn never comes back to A: only B (a scripted player) plays on."""

    seats = ("A", "B")

    def reset(self, **row):
        return SeatTurn("A", "Go.")

    def step(self, action):
        return SeatTurn("B", "Again.")


def test_a_game_that_never_hands_the_turn_back_ends_after_max_turns_moves_per_seat(tokenizer):
    eng, _ = engine(tokenizer, Seats(Monologue, {"A": "policy", "B": ScriptedPlayer(lambda m: "hm")}),
                    lambda ids: "[1]", max_turns=3)
    [a] = play(eng, race_rows(1))
    assert a.stop_reason == "max_turns" and a.num_turns == 1


def test_every_process_makes_the_same_generation_calls(tokenizer):
    """While another process still has a policy seat to play (sync_any true), a process whose games ended sends a
    one-token dummy; a pass where no process has one generates nothing."""
    other = iter([True, True, True, True, True, False, False])  # 2 passes with a policy seat there, 1 without

    def sync_any(local):
        return local or next(other)

    generator = Outputs(tokenizer, lambda ids: "[2]")
    seats = Seats(Race, {"A": "policy", "B": "policy"})
    cfg = RolloutConfig(max_turns=4, max_completion_length=200, max_tokens_per_turn=10)
    eng = SeatEngine(generator, tokenizer, seats, bound_players(seats, generator, tokenizer, cfg), cfg,
                     sync_any=sync_any)
    play(eng, race_rows(2))
    assert generator.batches == [1, 1, 1, 1, 1]  # the one game's 3 moves, then 2 dummies (and a pass without)


def test_wrong_seatings_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^seat 'B' of Race has no player: pass players=\{'B': 'policy' \| "):
        Seats(Race, {"A": "policy"})
    with pytest.raises(ValueError, match=r"^seat 'B' is trained but played by FrozenCopy\(\): only the policy's"):
        Seats(Race, {"A": "policy", "B": FrozenCopy()}, trained=["A", "B"])
    with pytest.raises(ValueError, match=r"^trained= names seat 'C', which players= does not \(seats: 'A', 'B'\)$"):
        Seats(Race, {"A": "policy", "B": "policy"}, trained=["C"])
    with pytest.raises(ValueError, match=r"^no seat is trained: play at least one seat with 'policy'"):
        Seats(Race, {"A": FrozenCopy(), "B": FrozenCopy()})
    with pytest.raises(TypeError, match=r"^Seats takes the game's class or a zero-argument factory of games, got Race"):
        Seats(Race(), {"A": "policy", "B": "policy"})
    with pytest.raises(TypeError, match=r"^a seat is played by 'policy', FrozenCopy\(\), ModelPlayer\(\.\.\.\) or "):
        bound_players(Seats(Race, {"A": "policy", "B": "polcy"}), None, None, RolloutConfig())


def test_a_seat_never_reached_still_has_a_run(tokenizer):
    """A loses at its first move (no [1]/[2]): B's run has no turn, ends terminated with the row's prompt, reward 0."""
    rng = random.Random(0)
    eng, _ = engine(tokenizer, Seats(Race, {"A": "policy", "B": "policy"}), lambda ids: "pass" if rng.random() else "")
    a, b = play(eng, race_rows(2))
    assert a.turn_rewards == [-1.0] and b.num_turns == 0 and b.stop_reason == "terminated"
    assert tokenizer.decode(b.prompt_ids) == "Race.\n" and b.seat == "B"
