"""GSM8K with a tool: RL (GRPO, or PPO) that teaches a model to compute with Python (ReTool's protocol) or a calculator.

The task (prompt, sandboxed Python or calculator behind ``<code>``/``<calc>`` tags, reward) is
``trl_agentic.tasks.gsm8k``; ``trl_agentic.scripts.train_task`` (the ``main`` of ``trl/scripts/grpo.py``) trains
it. Settings come from a YAML config and TRL's flags (flags override the YAML); ``--help`` lists them all::

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
from functools import partial

from trl_agentic.scripts import AgenticScriptArguments, run, train_task
from trl_agentic.tasks import GSM8KToolsArguments


@dataclass
class GSM8KScriptArguments(GSM8KToolsArguments, AgenticScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id or a local file or folder; splits), ``algo``, and the
    task's options (``tool``, reward weights, sandbox limits)."""


# load the tokenizer, the task and its data; build the trainer; train (evaluating before, during and after); save
# with a model card; push: trl_agentic.scripts.train_task
main = partial(train_task, "gsm8k_tools")


if __name__ == "__main__":
    raise SystemExit(run(main, GSM8KScriptArguments, prog="python recipes/gsm8k_tools.py"))
