"""Search-R1: RL (GRPO, or PPO) that teaches a model to interleave reasoning with search-engine calls.

The task (Search-R1's prompt word for word, ``<search>`` served by BM25 or a retrieval server, the v0.3 reward) is
``trl_agentic.tasks.search_r1``; this script wires it to the trainer, as ``trl/scripts/grpo.py`` does. The configs
hold the paper's settings (Jin et al. 2025, arXiv 2503.09516): text rollouts, observations cut to 500 tokens and
masked out of the loss, up to 4 searches then a final answer, GRPO group 5, KL 0.001 (k3 in the loss; PPO: k1 in
the reward, critic learning rate 10x the actor's). ``--help`` lists every flag::

    # a retrieval server you started (Search-R1's retrieval_launch.sh, or python -m trl_agentic.tools.retrieval.server)
    python recipes/search_r1.py --config recipes/configs/search_r1_grpo.yaml --retriever_url http://127.0.0.1:8000/retrieve
    python recipes/search_r1.py --config recipes/configs/search_r1_ppo.yaml --retriever_url http://127.0.0.1:8000/retrieve
    # BM25 in this process; the index is built once and saved to --index_dir, loaded on later runs
    python recipes/search_r1.py --config recipes/configs/search_r1_grpo.yaml --corpus wiki-18.jsonl \\
        --index_dir indexes/wiki18-bm25
    python recipes/search_r1.py --config recipes/configs/search_r1_grpo.yaml --corpus wiki-18.jsonl --reward em

Offline (local questions: JSONL or parquet rows with ``question`` and ``golden_answers``; a local model)::

    python recipes/search_r1.py --config recipes/configs/search_r1_grpo.yaml \\
        --model_name_or_path /models/Qwen2.5-3B-Instruct --dataset_name data/nq_hotpotqa \\
        --retriever_url http://127.0.0.1:8000/retrieve

Several GPUs::

    accelerate launch --config_file recipes/accelerate/deepspeed_zero2.yaml recipes/search_r1.py \\
        --config recipes/configs/search_r1_grpo.yaml --retriever_url http://127.0.0.1:8000/retrieve
"""

from dataclasses import dataclass

from trl import get_peft_config, get_quantization_config

from trl_agentic.model_card import attach_model_card
from trl_agentic.scripts import AgenticScriptArguments, check_requirements, load_datasets, load_tokenizer
from trl_agentic.scripts import model_init_kwargs, run, trainer_class
from trl_agentic.tasks import SearchR1Arguments, build_task


@dataclass
class SearchR1ScriptArguments(SearchR1Arguments, AgenticScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id or a local file or folder; splits), ``algo``, and the
    task's options (retriever, ``topk``, ``reward``)."""


def main(script_args, training_args, model_args):
    check_requirements(training_args, model_args)
    tokenizer = load_tokenizer(model_args.model_name_or_path, revision=model_args.model_revision)
    training_args.model_init_kwargs = model_init_kwargs(training_args, model_args)

    with build_task("search_r1", script_args, training_args.max_completion_length) as task:
        train_dataset, eval_dataset = load_datasets(task, script_args, training_args, tokenizer)
        if training_args.reward_weights is None:  # train on the task's reward, log exact match with weight 0
            training_args.reward_weights = task.reward_weights

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
    raise SystemExit(run(main, SearchR1ScriptArguments, prog="python recipes/search_r1.py"))
