"""GSM8K with a tool: RL (GRPO, or PPO) that teaches a model to compute with Python (ReTool's protocol) or a calculator.

The task (prompt, sandboxed Python or calculator behind ``<code>``/``<calc>`` tags, reward) is
``trl_agentic.tasks.gsm8k``; this script wires it to the trainer, as ``trl/scripts/grpo.py`` does. Settings come
from a YAML config and TRL's flags (flags override the YAML); ``--help`` lists them all::

    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml
    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_ppo.yaml
    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml --tool calculator \\
        --model_name_or_path Qwen/Qwen2.5-1.5B-Instruct --learning_rate 1e-5 --run_name gsm8k-1.5b
    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml --load_in_4bit   # QLoRA
    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml --use_vllm --vllm_mode colocate
    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml --push_to_hub \\
        --hub_model_id me/qwen-gsm8k-tools

Offline (a local model and a folder with train.jsonl/test.jsonl of GSM8K rows ``{"question", "answer"}``)::

    python recipes/gsm8k_tools.py --config recipes/configs/gsm8k_tools_grpo.yaml \\
        --model_name_or_path /models/Qwen2.5-0.5B-Instruct --dataset_name data/gsm8k

Several GPUs::

    accelerate launch --config_file recipes/accelerate/multi_gpu.yaml recipes/gsm8k_tools.py \\
        --config recipes/configs/gsm8k_tools_grpo.yaml
"""

from dataclasses import dataclass

from trl import get_peft_config, get_quantization_config

from trl_agentic.model_card import attach_model_card
from trl_agentic.scripts import AgenticScriptArguments, check_requirements, load_datasets, load_tokenizer
from trl_agentic.scripts import model_init_kwargs, run, trainer_class
from trl_agentic.tasks import GSM8KToolsArguments, build_task


@dataclass
class GSM8KScriptArguments(GSM8KToolsArguments, AgenticScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id or a local file or folder; splits), ``algo``, and the
    task's options (``tool``, reward weights, sandbox limits)."""


def main(script_args, training_args, model_args):
    check_requirements(training_args, model_args)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)

    with build_task("gsm8k_tools", script_args, training_args.max_completion_length) as task:
        train_dataset, eval_dataset = load_datasets(task, script_args, training_args, tokenizer)

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
        )
        attach_model_card(trainer, task, script_args.dataset_name)

        # with eval_strategy set, TRL evaluates before training (eval_on_start), every eval_steps and at the end
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model(training_args.output_dir)
        trainer.create_model_card(dataset_name=script_args.dataset_name)
        if training_args.push_to_hub:
            trainer.push_to_hub(dataset_name=script_args.dataset_name)
        trainer.accelerator.print(f"saved to {training_args.output_dir}")


if __name__ == "__main__":
    raise SystemExit(run(main, GSM8KScriptArguments, prog="python recipes/gsm8k_tools.py"))
