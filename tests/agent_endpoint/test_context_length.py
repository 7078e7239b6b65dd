"""The endpoint's length limit comes from the model (hostile test, written first): a request whose conversation the
model cannot take (its maximum positions, from its config) is answered 400 ``context_length_exceeded`` naming both
numbers, before anything is generated, and costs nothing else: the agents beside it, and the same agent's earlier
turns, are kept. On the tiny Qwen2.5 model with its positions cut to 160, generating for real."""

from __future__ import annotations

import openai
import pytest

from trl_agentic.agents import AgentRollout
from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.rollout.generation import HFGenerator

pytestmark = pytest.mark.adversarial

POSITIONS = 160


async def agent(client, kind, **row):
    messages = [{"role": "user", "content": "2+3?" if kind != "long" else "Tell me about " + "words " * 200}]
    answers = []
    for _ in range(2 if kind == "grows" else 1):
        try:
            r = await client.chat.completions.create(model="p", messages=messages, max_tokens=4)
        except openai.BadRequestError as exc:
            answers.append(exc.body.get("error", exc.body))
            break
        answers.append(r.choices[0].finish_reason)
        messages += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": "And now " + "more " * 100}]
    return answers


def test_a_request_past_the_models_positions_is_a_400_naming_both_numbers(qwen):
    tok = qwen.load_tokenizer()
    model = qwen.load_model()
    model.config.max_position_embeddings = POSITIONS
    ro = AgentRollout(agent, tok, RolloutConfig(max_turns=4, max_tokens_per_turn=4, max_completion_length=512),
                      [tok.convert_tokens_to_ids("<|im_end|>")])
    short, long, grows = ro.run([{"kind": k} for k in ("short", "long", "grows")], HFGenerator(model, tok))
    assert short.stop_reason == "terminated" and short.agent_output in (["stop"], ["length"])
    for t, answered in ((long, 0), (grows, 1)):
        error = t.agent_output[-1]
        assert len(t.agent_output) == answered + 1 and isinstance(error, dict), t.agent_output
        assert error["code"] == "context_length_exceeded", error
        n = int(error["message"].split(" tokens")[0].split()[-1])
        assert n > POSITIONS and f"{POSITIONS} positions" in error["message"], error["message"]
        assert "max_position_embeddings" in error["message"] and "\n" not in error["message"]
        # a run the model never answered failed (the endpoint refused its only request); one it answered ended
        assert t.stop_reason == ("env_error" if answered == 0 else "terminated")
        assert len(t.segments) == answered and t.events["bad_request"] == 1
    assert len(grows.segments[0].turn_spans) == 1  # its first turn is kept as it was
    ro.close()
