"""Rejection-sampling fine-tuning (RFT, Yuan et al. 2023, arXiv 2308.01825; expert iteration): a few rounds of
*sample* trajectories with the rollout engine the trainers use, *keep* those the task's success check accepts
(:func:`trl_agentic.sft.rejection_sampling`), *fine-tune* on them with TRL's ``SFTTrainer`` in the engine's token
layout, observation tokens left out of the loss (:func:`trl_agentic.sft.sft_dataset`). Each round continues from the
previous round's model; STaR (arXiv 2203.14465) restarts from the base model instead (``--rounds 1`` per launch).

Settings come from a YAML config and TRL's flags (``SFTConfig``, ``ModelConfig``; flags override the YAML);
``--help`` lists them all::

    python recipes/rft.py --config recipes/configs/rft_gsm8k_tools.yaml
    python recipes/rft.py --config recipes/configs/rft_gsm8k_tools.yaml --rounds 3 --samples_per_row 16 \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --output_dir outputs/rft-1.5b

Round ``r`` trains into ``<output_dir>/round-<r>``; the final model (or LoRA adapter) is saved to ``<output_dir>``.
A warm-started model then trains with RL: ``recipes/gsm8k_tools.py --model_name_or_path <output_dir>``.
"""

import os
import sys
from copy import deepcopy
from dataclasses import dataclass, field, replace

from trl import ModelConfig, ScriptArguments, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from trl_agentic.rollout.config import RolloutConfig
from trl_agentic.scripts import check_requirements, cpu_defaults, load_tokenizer, model_init_kwargs, resolve_model_path
from trl_agentic.sft import rejection_sampling, sft_dataset
from trl_agentic.tasks import TASK_ARGUMENTS, GSM8KToolsArguments, SearchR1Arguments, build_task, load_rows, take
from trl_agentic.tasks.data import TaskConfigError


@dataclass
class RFTScriptArguments(ScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id or a local file or folder), the task, the rejection
    sampling and the rollout budgets (the names of ``AgenticGRPOConfig``)."""

    task: str = field(default="gsm8k_tools", metadata={"help": "The task to sample.",
                                                        "choices": sorted(TASK_ARGUMENTS)})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training rows."})
    rounds: int = field(default=2, metadata={"help": "Rounds of sampling then fine-tuning."})
    samples_per_row: int = field(default=4, metadata={"help": "Trajectories sampled per prompt in each round."})
    success_threshold: float = field(default=1.0, metadata={
        "help": "A trajectory is kept when the task's success reward is at least this."})
    max_per_row: int | None = field(default=1, metadata={"help": "Most distinct accepted trajectories per prompt."})
    mask_observations: bool = field(default=True, metadata={
        "help": "Keep observation tokens out of the loss (false: Search-R1's ablation, which lowered its results)."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature."})
    rollout_batch_size: int = field(default=32, metadata={"help": "Trajectories per generation batch."})
    rollout_mode: str = field(default="text", metadata={"help": "text or chat (as in RL).",
                                                         "choices": ["text", "chat"]})
    max_turns: int = field(default=4, metadata={"help": "Most model turns per trajectory."})
    max_tokens_per_turn: int = field(default=256, metadata={"help": "Most tokens sampled in one turn."})
    max_completion_length: int = field(default=1024, metadata={"help": "Budget of a whole trajectory."})
    max_observation_tokens: int = field(default=1024, metadata={"help": "Observations are cut to this many tokens."})


def main(script_args, task_args, sft_args, model_args):
    """Load the model (and its LoRA adapter), then ``rounds`` times: sample and keep (rejection sampling), fine-tune
    on what was kept (``SFTTrainer`` into ``<output_dir>/round-<r>``); save the final model to ``output_dir``."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    check_requirements(sft_args, model_args)
    if model_args.load_in_4bit or model_args.load_in_8bit:
        raise TaskConfigError("recipes/rft.py trains full weights or a LoRA adapter in the model's dtype: drop "
                              "--load_in_4bit/--load_in_8bit")
    model_args.model_name_or_path = resolve_model_path(model_args.model_name_or_path,
                                                       revision=model_args.model_revision)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    model = AutoModelForCausalLM.from_pretrained(
        model_args.model_name_or_path, **model_init_kwargs(sft_args, model_args)
    ).to(sft_args.device)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:  # one adapter, trained on in every round
        model = get_peft_model(model, peft_config)
    generation_config = deepcopy(model.generation_config)
    generation_config.temperature = script_args.temperature
    rollout = RolloutConfig(
        rollout_mode=script_args.rollout_mode, max_turns=script_args.max_turns,
        max_tokens_per_turn=script_args.max_tokens_per_turn, max_completion_length=script_args.max_completion_length,
        max_observation_tokens=script_args.max_observation_tokens,
    )

    with build_task(script_args.task, task_args, script_args.max_completion_length) as task:
        data = load_rows(script_args.dataset_name, script_args.dataset_config, script_args.dataset_train_split)
        rows = list(task.rows(take(data, script_args.max_train_samples), tokenizer))
        for r in range(script_args.rounds):
            # sample, and keep what the task's success check accepts
            sample = rejection_sampling(
                model.eval(), tokenizer, task.environment, rows, task.success,
                samples_per_row=script_args.samples_per_row, success_threshold=script_args.success_threshold,
                max_per_row=script_args.max_per_row, batch_size=script_args.rollout_batch_size,
                generation_config=generation_config, config=rollout,
            )
            print(f"round {r}: {sample.report.summary()}; kept {len(sample.trajectories)}", flush=True)
            if not sample.trajectories:
                continue
            # fine-tune on them, in the engine's token layout
            trainer = SFTTrainer(
                model=model, args=replace(sft_args, output_dir=os.path.join(sft_args.output_dir, f"round-{r}")),
                train_dataset=sft_dataset(sample.trajectories, mask_observations=script_args.mask_observations,
                                          show_progress=False),
                processing_class=tokenizer,
            )
            trainer.train()
            model = trainer.model

    model.save_pretrained(sft_args.output_dir)
    tokenizer.save_pretrained(sft_args.output_dir)
    print(f"saved to {sft_args.output_dir}")


def make_parser():
    return TrlParser((RFTScriptArguments, GSM8KToolsArguments, SearchR1Arguments, SFTConfig, ModelConfig),
                     prog="python recipes/rft.py",
                     description="--config FILE.yaml sets any of the flags below (a flag given on the command line "
                                 "overrides it).")


def run(argv=None):
    """Parse and run; a setting the user must change is one ``error:`` line and exit status 2."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        script_args, gsm8k_args, search_args, sft_args, model_args = make_parser().parse_args_and_config(
            args=cpu_defaults(argv) + argv)
        task_args = {"gsm8k_tools": gsm8k_args, "search_r1": search_args}[script_args.task]
        main(script_args, task_args, sft_args, model_args)
    except TaskConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(run())
