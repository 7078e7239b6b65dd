"""What the CLI-agent training tests share: a trainer for a :class:`~trl_agentic.cli_agents.CLIAgent` on one coding
task (``trl_agentic.tasks.coding``), its tiny model scripted to write the CLI's own tool calls, the runs it makes
and every id its generator sampled (the reference of token exactness); and the checks each test makes."""

from __future__ import annotations

from pathlib import Path

from agent_helpers import config, scripted

from trl_agentic.tasks.coding import TestsPass, coding_task

FIX = "sed -i 's/a - b/a + b/' arith.py"
"""The shell command that fixes coding task 0 (``arith.py``)."""


class Recording:
    """Wraps a generator and keeps the ids of every output it returned."""

    def __init__(self, inner):
        self.inner, self.outputs = inner, []

    def generate(self, prompts, max_new_tokens, stop_strings, eos_token_ids):
        out = self.inner.generate(prompts, max_new_tokens, stop_strings, eos_token_ids)
        self.outputs.extend(list(g.ids) for g in out)
        return out


class RecordedTestsPass(TestsPass):
    """:class:`TestsPass` that keeps the trajectories it scores (``runs``)."""

    def __init__(self) -> None:
        super().__init__()
        self.runs: list = []

    def __call__(self, prompts, completions, **kwargs):
        self.runs.extend(kwargs["trajectory"])
        return super().__call__(prompts, completions, **kwargs)


def cli_trainer(qwen, tmp_path, trainer_name, agent, turns, positions=None, **extra):
    """An ``AgenticGRPOTrainer`` (``"grpo"``) or ``AgenticPPOTrainer`` (``"ppo"``, one generation per prompt)
    training ``agent`` two steps on coding task 0 (two runs a step) with :class:`TestsPass`, its model scripted with
    ``turns`` (``positions``: the model's length, for CLIs whose prompts are longer than the tiny model's 4096); the
    runs it scored and the generator's recording."""
    from datasets import Dataset

    from trl_agentic.scripts import config_class, trainer_class

    tok = qwen.load_tokenizer()
    model = qwen.load_model()
    if positions is not None:
        model.config.max_position_embeddings = positions
    values = dict(max_completion_length=1024, max_tokens_per_turn=128, max_turns=4, env_timeout=120.0, **extra)
    if trainer_name == "ppo":
        values.update(beta=0.05, num_generations=1)
    reward = RecordedTestsPass()
    trainer = trainer_class(trainer_name)(
        model=scripted(model, tok, turns), processing_class=tok, train_dataset=Dataset.from_list([coding_task(0)] * 4),
        reward_funcs=reward, agent=agent, args=config(config_class(trainer_name), tmp_path, **values))
    recording = trainer.rollout_seam.generator = Recording(trainer.rollout_seam.generator)
    return trainer, reward.runs, recording


def check_trained(trainer, runs, recording, requests: int) -> None:
    """Two steps trained; every run fixed the bug in its own working directory (the CLI ran the command the model
    called) and passed the tests; one segment per run with ``requests`` requests; every trained id is an id the
    generator sampled (the mask audit, 0, is checked by tests/conftest.py); the reward logged is 1."""
    assert trainer.state.global_step == 2 and len(runs) == 4
    for t in runs:
        assert t.stop_reason == "terminated", t.error
        assert (Path(t.agent_output.workdir) / "arith.py").read_text().endswith("return a + b\n")
        assert t.requests == requests and len(t.segments) == 1, (t.requests, len(t.segments), t.events)
        for ids, raw in zip(t.agent_segments(), t.generated_ids):
            assert raw in recording.outputs and ids == raw[: len(ids)]
    rewards = [e["rewards/tests_pass/mean"] for e in trainer.state.log_history if "rewards/tests_pass/mean" in e]
    assert rewards == [1.0, 1.0]
    assert any("agentic/mask_audit" in e for e in trainer.state.log_history)
