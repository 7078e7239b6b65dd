"""Train the command-line coding agent you already use (mini-swe-agent, Codex CLI or Claude Code), unchanged, on
small coding tasks: RL (GRPO, or PPO) on whether the task's tests pass in the directory the agent left, evaluated on
held-out tasks before and after (``docs/agents.md``, "Train the CLI agent you already use").

Each trajectory runs the CLI as a child process (``trl_agentic.cli_agents``: its own working directory, the
trajectory's base URL and key, under bubblewrap when it works); the tasks are ``trl_agentic.tasks.coding`` (tiny
Python repositories with one bug and a failing unittest file): ``num_tasks`` for training from task 0,
``eval_tasks`` held out after them. Settings come from a YAML config and TRL's flags (flags override the YAML);
``--help`` lists them::

    python recipes/cli_agents.py --config recipes/configs/cli_agents_grpo.yaml
    python recipes/cli_agents.py --config recipes/configs/cli_agents_grpo.yaml --cli codex --short_prompt true
    python recipes/cli_agents.py --config recipes/configs/cli_agents_grpo.yaml --cli claude-code --algo ppo

mini-swe-agent installs with ``pip install mini-swe-agent==2.4.6``; Codex CLI and Claude Code with ``npm install
--prefix DIR @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.197`` (``DIR/node_modules/.bin`` on ``PATH``, or
``--cli_executable``).
"""

from dataclasses import dataclass, field

from datasets import Dataset

from trl_agentic.cli_agents import claude_code, codex, mini_swe_agent
from trl_agentic.errors import TaskConfigError
from trl_agentic.evaluate.training import train_between_evaluations
from trl_agentic.scripts import AgenticScriptArguments, check_trainable, load_tokenizer, run, trainer_class
from trl_agentic.tasks.coding import CodingTasksArguments, TestsPass, coding_tasks

CLIS = {"mini-swe-agent": mini_swe_agent, "codex": codex, "claude-code": claude_code}


@dataclass
class CLIAgentsScriptArguments(CodingTasksArguments, AgenticScriptArguments):
    """TRL's ``ScriptArguments`` and ``algo``, the coding tasks, and the CLI that attempts them."""

    cli: str = field(default="mini-swe-agent", metadata={"help": "The agent: mini-swe-agent, codex or claude-code.",
                                                          "choices": list(CLIS)})
    cli_executable: str | None = field(default=None, metadata={"help": "The CLI's executable (default: on PATH)."})
    cli_timeout: float = field(default=600.0, metadata={"help": "Wall-clock seconds of one CLI run."})
    sandbox: str = field(default="auto", metadata={
        "help": "auto: bubblewrap when it works here; bwrap: required; none: the CLI runs unconfined.",
        "choices": ["auto", "bwrap", "none"]})
    short_prompt: bool = field(default=False, metadata={
        "help": "Codex CLI and Claude Code: short instructions and fewer tools, for a model whose context cannot hold "
                "theirs (20-60k tokens)."})


def cli_agent(args: CLIAgentsScriptArguments):
    """The :class:`~trl_agentic.cli_agents.CLIAgent` the arguments name (a CLI that is not installed: one line)."""
    options = dict(executable=args.cli_executable, timeout=args.cli_timeout, sandbox=args.sandbox)
    if args.cli != "mini-swe-agent":
        options["short_prompt"] = args.short_prompt
    try:
        return CLIS[args.cli](**options)
    except FileNotFoundError as exc:
        raise TaskConfigError(str(exc)) from None


def main(script_args, training_args, model_args) -> None:
    from trl import get_peft_config

    agent = cli_agent(script_args)  # a CLI that is not installed stops the run before the model loads
    processing_class = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    train = Dataset.from_list(coding_tasks(script_args.num_tasks))
    held_out = coding_tasks(script_args.eval_tasks, start=script_args.num_tasks)
    check_trainable(training_args, len(train))
    reward = TestsPass(sandbox=script_args.sandbox, timeout=script_args.test_timeout)
    trainer = trainer_class(script_args.algo)(model=model_args.model_name_or_path, processing_class=processing_class,
                                              agent=agent, reward_funcs=reward, train_dataset=train,
                                              args=training_args, peft_config=get_peft_config(model_args))

    train_between_evaluations(trainer, held_out, reward, {"agent": agent}, {"accuracy": "solved"},
                              {"cli": script_args.cli})

if __name__ == "__main__":
    raise SystemExit(run(main, CLIAgentsScriptArguments, prog="python recipes/cli_agents.py"))
