"""verifiers' user-sim (a simulated user converses with the assistant) trains its assistant seat unchanged: the user
seat, which user-sim's setup() marks not trainable, is played by a player of players= served to its harness over
chat completions (trl_agentic/integrations/seat_server.py); the assistant seat is the policy's, through the endpoint.
The taskset is tests/integrations/envs/tiny_arith (its harness runs in-process for both seats).

verifiers pins openai<3: these tests run in .venv-verifiers (.ci/run) and are skipped elsewhere."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

vf = pytest.importorskip("verifiers.v1", reason="verifiers runs in its own venv (.venv-verifiers, .ci/run)")

from helpers import native_call as call  # noqa: E402
from helpers import scripted  # noqa: E402
from integration_helpers import assert_token_exact, logged, record, trainer_of  # noqa: E402

ENV_DIR = Path(__file__).resolve().parent / "envs" / "tiny_arith"
SUBPROCESS = {"runtime": {"type": "subprocess"}}
TURNS = [call("add", a=1, b=3), "The answer is 4."]  # the assistant's: right for "What is 1 plus 3?" only
PERSONA = "You are role-playing a USER"  # user-sim's persona, the user seat's system prompt


@pytest.fixture(scope="module", autouse=True)
def tiny_arith_installed():
    sys.path.insert(0, str(ENV_DIR))
    yield
    sys.path.remove(str(ENV_DIR))


def user(messages):
    """The simulated user: asks its scenario's question, then ends the conversation."""
    if any(m["role"] == "assistant" for m in messages):
        return "###DONE###"
    return re.search(r"What is \d+ plus 3\?", messages[0]["content"]).group(0)


def user_sim(**players):
    """user-sim over tiny-arith, both seats on tiny-arith's in-process harness (user-sim pins the user's to verifiers'
    `null` harness, a uv script; overridden here as `--env.user.harness.id tiny-arith` would)."""
    from trl_agentic.integrations.verifiers import VerifiersEnvironment

    config = {"id": "user-sim", "assistant": SUBPROCESS, "user": {**SUBPROCESS, "harness": {"id": "tiny-arith"}},
              "taskset": {"num_tasks": 4}}
    return VerifiersEnvironment.load("tiny-arith", config=config, **players)


def expected_reward(row) -> float:
    return float(json.loads(row["verifiers_task"])["answer"] == 4) + 0.1


@pytest.mark.parametrize("kind", ["grpo", "ppo"])
def test_user_sim_trains_its_assistant_seat(qwen, tmp_path, kind):
    """Every run is the assistant's: one segment of its two calls (the user's question as its prompt, the add tool's
    result between them), token-exact, with the environment's own reward; the user's conversation never reaches the
    policy; verifiers' own metric of the user's side (user_turns) is logged."""
    from trl_agentic.rollout.players import ScriptedPlayer

    env = user_sim(players={"user": ScriptedPlayer(user)})
    assert env.seat == "assistant"
    tok = qwen.load_tokenizer()
    trainer = trainer_of(kind, tmp_path, model=scripted(qwen.load_model(), tok, TURNS), processing_class=tok,
                         train_dataset=env.dataset(), reward_funcs=env.reward, agent=env.agent)
    recording, rounds = record(trainer)
    trainer.train()
    assert trainer.state.global_step == 2
    for round_ in rounds:
        for run, row in zip(round_.runs, round_.rows):
            assert run.stop_reason == "terminated", run.error
            assert run.agent_output.reward == pytest.approx(expected_reward(row))
            assert run.agent_output.metrics["user_turns"] == 2.0
            [segment] = run.training_rows()
            question = re.search(r"What is \d+ plus 3\?", json.loads(row["verifiers_task"])["prompt"]).group(0)
            prompt = tok.decode(segment.prompt_ids)
            assert prompt.endswith(f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n")
            assert PERSONA not in prompt and segment.num_turns == 2
        assert_token_exact(round_.runs, recording)
    assert {"verifiers/metric/user_turns", "agentic/mask_audit"} <= logged(trainer)


def test_a_user_that_raises_or_hangs_ends_its_own_episode(qwen):
    """The user's player raises on one task and hangs past player_timeout on another: those two episodes fail alone,
    each named in one line (the seat, its player, the error), the others are scored."""
    from trl_agentic.evaluate import evaluate
    from trl_agentic.rollout.players import ScriptedPlayer

    def picky(messages):
        if "What is 1 plus 3?" in messages[0]["content"]:
            raise ValueError("no question today")
        if "What is 2 plus 3?" in messages[0]["content"]:
            time.sleep(4)
        return user(messages)

    env = user_sim(players={"user": ScriptedPlayer(picky)}, player_timeout=1)
    tok = qwen.load_tokenizer()
    _, runs = evaluate(scripted(qwen.load_model(), tok, TURNS), tok, None, env.rows(), env.reward, agent=env.agent,
                       max_turns=4, max_tokens_per_turn=64, max_completion_length=256)
    assert [r.stop_reason for r in runs] == ["terminated", "env_error", "env_error", "terminated"]
    assert "seat 'user' played by ScriptedPlayer(picky) raised ValueError: no question today" in runs[1].error
    assert "seat 'user' played by ScriptedPlayer(picky) took longer than 1 s" in runs[2].error
    assert all("\n" not in r.error for r in runs)


def test_another_model_plays_the_user(qwen):
    """ModelPlayer: a model of its own (here the tiny Qwen, loaded apart) answers the user seat's harness; its random
    text never says ###DONE###, so each conversation runs until a budget ends it, never failing."""
    from trl_agentic.evaluate import evaluate
    from trl_agentic.rollout.players import ModelPlayer

    player, replies = ModelPlayer(qwen.load_model(), qwen.load_tokenizer()), []
    reply = player.reply
    player.reply = lambda conversations, stop: replies.extend(reply(conversations, stop)) or replies[-1:]
    env = user_sim(players={"user": player})
    tok = qwen.load_tokenizer()
    _, runs = evaluate(scripted(qwen.load_model(), tok, TURNS), tok, None, env.rows()[:2], env.reward,
                       agent=env.agent, max_turns=4, max_tokens_per_turn=16, max_completion_length=256)
    assert all(not r.env_failed and PERSONA not in tok.decode(r.training_rows()[0].prompt_ids) for r in runs), \
        [(r.stop_reason, r.error) for r in runs]
    assert len(replies) >= 2 and all(isinstance(text, str) for text in replies)


def test_wrong_players_are_refused_in_one_line():
    from trl_agentic.rollout.players import FrozenCopy, ScriptedPlayer

    with pytest.raises(ValueError, match=r"^UserSimEnv has no seat 'judge' \(seats: assistant, user\): name one of "):
        user_sim(players={"judge": ScriptedPlayer(user)})
    with pytest.raises(ValueError, match=r"^FrozenCopy\(\) copies the policy of a rollout, which a verifiers agent does "
                                         r"not hold: play seat 'user' with ModelPlayer\('<the policy's checkpoint>'\)"):
        user_sim(players={"user": FrozenCopy()})
    with pytest.raises(ValueError, match=r"^players= names the seats other players play; .*: drop 'user': 'policy'"):
        user_sim(players={"user": "policy"})
    with pytest.raises(ValueError, match=r"^UserSimEnv plays 2 agents \(assistant, user\) and the policy plays 0 of "
                                         r"them; .*"):
        user_sim(players={"user": ScriptedPlayer(user), "assistant": ScriptedPlayer(user)})
