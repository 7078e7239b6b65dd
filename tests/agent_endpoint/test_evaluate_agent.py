"""``trl_agentic.evaluate.evaluate(..., agent=...)`` runs the agent against the endpoint, as training does."""

from __future__ import annotations

import pytest
from agent_helpers import add_dataset, answer_reward, call, responses_agent, scripted, sdk_agent


@pytest.mark.parametrize("agent", [sdk_agent, responses_agent], ids=["chat-completions", "responses"])
def test_evaluate_an_agent(qwen, agent):
    from trl_agentic.evaluate import evaluate

    tok = qwen.load_tokenizer()
    model = scripted(qwen.load_model(), tok, [call("add", a=1, b=3), "The answer is 4."])
    rows = [dict(r) for r in add_dataset(2)]  # 0 + 3 (wrong answer 4), 1 + 3 (right)
    report, trajectories = evaluate(model, tok, None, rows, answer_reward, agent=agent, samples_per_row=2,
                                    k=(1, 2), greedy=True, show_progress=False, max_turns=4,
                                    max_tokens_per_turn=64, max_completion_length=128)
    assert report.accuracy == 0.5 and report.pass_at_k[2] == 0.5 and report.successes == [0, 2]
    assert [t.agent_output for t in trajectories] == ["The answer is 4."] * 4
    assert all(t.stop_reason == "terminated" and len(t.segments) == 1 for t in trajectories)
    assert report.mean_turns == 2.0 and report.mean_tool_calls == 1.0  # each turn's calls, as the engine counts them
