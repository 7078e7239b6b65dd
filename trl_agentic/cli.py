"""``trl-agentic grpo`` / ``trl-agentic ppo``: TRL's own GRPO script with our trainers.

``trl grpo`` runs TRL's ``trl/scripts/grpo.py``, which builds ``trl.GRPOTrainer`` from ``GRPOConfig`` flags. This
command runs the same script (its ``main``, unchanged: dataset loading, reward functions, LoRA, saving) with
:class:`~trl_agentic.AgenticGRPOTrainer` and :class:`~trl_agentic.AgenticGRPOConfig` (``ppo``:
:class:`~trl_agentic.AgenticPPOTrainer` and :class:`~trl_agentic.AgenticPPOConfig`), so it takes:

- TRL's flags and ``--config FILE.yaml`` (a flag on the command line overrides the YAML): ``--model_name_or_path``,
  ``--dataset_name`` (a hub id or a local folder of data files), ``--reward_funcs`` (TRL's names or dotted import
  paths), ``--reward_model_name_or_path``, ``ModelConfig``'s (``--use_peft``, ``--lora_r``, ...) and every
  ``GRPOConfig`` field;
- ours: every field our config adds (``--rollout_mode``, ``--max_turns``, ``--kl_estimator``, ...);
- what TRL's script has no flag for, as dotted import paths resolved as TRL resolves ``--reward_funcs`` (the current
  directory is importable): ``--environment`` (our ``environment=``), ``--tools`` (TRL's ``tools=``) and
  ``--environment_factory`` (TRL's ``environment_factory=``, a class or a dict of them).

Example (``python -m trl_agentic.cli`` is the same command without the installed entry point)::

    trl-agentic grpo --model_name_or_path MODEL --dataset_name DATA --reward_funcs my_rewards.correct \\
        --tools my_tools.search --rollout_mode chat --max_turns 4

It runs in this process; for several processes, ``accelerate launch -m trl_agentic.cli grpo ...``. On a machine
without a GPU, ``--use_cpu true --bf16 false --dtype float32`` are added unless ``--use_cpu`` is given, and a line
says so, as the recipes do. A setting the user must change (a bad flag, a dotted path that does not import, a
trainer check that refuses the run) is printed as one line (``error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import trl

from .compat import trl_grpo_script
from .errors import TaskConfigError
from .scripts import ALGORITHMS, check_requirements, config_class, cpu_defaults, load_object, trainer_class


@dataclass
class AgenticScriptArguments(trl_grpo_script().GRPOScriptArguments):
    """TRL's ``GRPOScriptArguments`` (dataset and reward flags) plus what the trainer needs for multi-turn rollouts."""

    environment: str | None = field(
        default=None,
        metadata={"help": "Dotted import path of an environment class or zero-argument factory (trl-agentic's "
                  "environment=), e.g. my_envs.SearchEnvironment."},
    )
    tools: list[str] | None = field(
        default=None,
        metadata={"help": "Dotted import paths of tool functions (TRL's tools=: native tool calls, "
                  "--rollout_mode chat), e.g. my_tools.search my_tools.calculate."},
    )
    environment_factory: str | None = field(
        default=None,
        metadata={"help": "Dotted import path of TRL's environment_factory= (a class whose public methods are the "
                  "tools, or a dict of them picked by the dataset's 'environment' column)."},
    )
    agent: str | None = field(
        default=None,
        metadata={"help": "Dotted import path of an agent of any framework, async def agent(client, **row) (the "
                  "trainers' agent=): it runs against the policy through the OpenAI-compatible endpoint."},
    )


def make_parser(algo: str) -> Any:
    """TRL's ``TrlParser`` over ``(AgenticScriptArguments, <algo's config>, ModelConfig, DatasetMixtureConfig)``:
    the dataclasses of TRL's ``make_parser`` with ours in place of ``GRPOScriptArguments`` and ``GRPOConfig``."""
    from trl import DatasetMixtureConfig, ModelConfig, TrlParser

    return TrlParser((AgenticScriptArguments, config_class(algo), ModelConfig, DatasetMixtureConfig),
                     prog=f"trl-agentic {algo}", description="TRL's GRPO script (trl grpo) with trl-agentic's trainer. "
                     "--config FILE.yaml sets any of the flags below (a flag on the command line overrides it).")


def trainer_kwargs(script_args: Any) -> dict[str, Any]:
    """The trainer arguments TRL's script does not pass: ``environment``, ``tools``, ``environment_factory``,
    ``agent``."""
    kwargs: dict[str, Any] = {}
    if script_args.environment:
        kwargs["environment"] = load_object(script_args.environment, "--environment")
    if script_args.tools:
        kwargs["tools"] = [load_object(path, "--tools") for path in script_args.tools]
    if script_args.environment_factory:
        kwargs["environment_factory"] = load_object(script_args.environment_factory, "--environment_factory")
    if script_args.agent:
        kwargs["agent"] = load_object(script_args.agent, "--agent")
    return kwargs


@contextlib.contextmanager
def trl_trainer(trainer: Any) -> Iterator[None]:
    """``trl.GRPOTrainer`` is ``trainer`` for the duration: TRL's script builds whatever that name holds when it
    runs (``from trl import GRPOTrainer`` inside its ``main``)."""
    saved = trl.GRPOTrainer
    trl.GRPOTrainer = trainer
    try:
        yield
    finally:
        trl.GRPOTrainer = saved


def parse_arguments(algo: str, argv: Sequence[str]) -> tuple[Any, Any, Any, Any]:
    """``(script_args, training_args, model_args, dataset_args)`` from ``argv`` (the flags after the command). On a
    machine without a GPU and without ``--use_cpu``, the recipes' CPU flags come first and a line on stderr says so
    (:func:`~trl_agentic.scripts.cpu_defaults`); a bad setting raises :class:`TaskConfigError`."""
    argv = list(argv)
    argv = cpu_defaults(argv) + argv
    try:
        return make_parser(algo).parse_args_and_config(args=argv)
    except (ValueError, TypeError, OSError) as exc:  # a config's check, an unknown flag or key, no such --config
        message = str(exc).strip().splitlines()[0]
        raise TaskConfigError(unknown_config_keys(message, argv, algo) or message) from None


def unknown_config_keys(message: str, argv: Sequence[str], algo: str) -> str | None:
    """TRL's parser refuses a ``--config`` YAML with keys that are no flag of this command, and advises a setting
    (``fail_with_unknown_args``) no command-line user can set: the usual cause is a recipe's YAML, whose keys are its
    script's flags. The message names the keys and the script to run the file with (read from the YAML's own
    comment, as ``recipes/configs/`` write it), else what to do; ``None`` for any other error."""
    if not message.startswith("Unknown arguments from config file") or "--config" not in argv:
        return None
    path = argv[argv.index("--config") + 1] if argv.index("--config") + 1 < len(argv) else ""
    keys = re.findall(r"'--([A-Za-z0-9_]+)'", message)
    script = None
    with contextlib.suppress(OSError):
        with open(path, encoding="utf-8") as fh:
            found = re.search(r"python (recipes/\w+\.py) --config", fh.read())
        script = found.group(1) if found else None
    fix = (f"it is {script}'s: run python {script} --config {path}" if script is not None
           else "remove them, or run the file with the script whose flags they are")
    return f"--config {path}: {', '.join(keys)} {'is' if len(keys) == 1 else 'are'} no flag of trl-agentic {algo}; {fix}"


def checked_trainer(trainer: type, **kwargs: Any) -> Any:
    """``trainer`` as TRL's script builds it, with ``kwargs`` added, such that a construction check that refuses the
    run (a ``ValueError`` or ``TypeError`` naming the fix) is a :class:`TaskConfigError`: one line, not a traceback."""

    def build(*args: Any, **given: Any) -> Any:
        try:
            return trainer(*args, **given, **kwargs)
        except (ValueError, TypeError) as exc:
            raise TaskConfigError(str(exc).strip().splitlines()[0]) from exc

    return build


def run(algo: str, argv: Sequence[str]) -> None:
    """Parse ``argv`` (the flags after the command) and run TRL's GRPO script with ``algo``'s trainer. The dotted
    paths are resolved first, so that a typo is the error reported."""
    script_args, training_args, model_args, dataset_args = parse_arguments(algo, argv)
    kwargs = trainer_kwargs(script_args)
    check_requirements(training_args, model_args)
    with trl_trainer(checked_trainer(trainer_class(algo), **kwargs)):
        trl_grpo_script().main(script_args, training_args, model_args, dataset_args)


def _command_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-agentic", description="TRL's GRPO script with trl-agentic's trainers: TRL's flags and --config "
        "YAML plus ours. 'trl-agentic grpo --help' lists every flag.")
    commands = parser.add_subparsers(dest="command", metavar="{grpo,ppo}")
    commands.add_parser("grpo", add_help=False, help="AgenticGRPOTrainer (TRL's GRPOTrainer without --environment, "
                        "--tools or --environment_factory)")
    commands.add_parser("ppo", add_help=False, help="AgenticPPOTrainer (a critic; needs --environment, --tools or "
                        "--environment_factory)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The ``trl-agentic`` entry point: ``trl-agentic {grpo,ppo} [flags]``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _command_parser()
    if not argv or argv[0] not in ALGORITHMS:
        parser.parse_args(argv)  # --help, or argparse's one-line error for an unknown command (exit 2)
        parser.print_help()
        return 0
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        run(argv[0], argv[1:])
    except TaskConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
