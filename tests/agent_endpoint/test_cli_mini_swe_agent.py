"""mini-swe-agent (2.4.6, its ``mini`` command, unchanged) trained two steps with both trainers on a coding task:
the scripted model writes its ``bash`` tool calls, mini runs them in its working directory (under bubblewrap when
it works here), the row's tests pass there, token-exact. Skipped, with the command, when it is not installed."""

from __future__ import annotations

import pytest
from agent_helpers import call
from cli_training import FIX, check_trained, cli_trainer

from trl_agentic.cli_agents import mini_swe_agent
from trl_agentic.cli_agents.presets import MINI_VERSION, mini_script

pytestmark = pytest.mark.skipif(mini_script() is None,
                                reason=f"mini-swe-agent is not installed: pip install mini-swe-agent=={MINI_VERSION}")


@pytest.mark.parametrize("trainer_name", ["grpo", "ppo"])
def test_mini_swe_agent_trains_two_steps(qwen, tmp_path, trainer_name):
    turns = [call("bash", command=FIX), call("bash", command="echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")]
    trainer, runs, recording = cli_trainer(qwen, tmp_path, trainer_name, mini_swe_agent(timeout=300), turns)
    trainer.train()
    check_trained(trainer, runs, recording, requests=2)
    assert all(t.agent_output.exit_code == 0 for t in runs)
