"""Search-R1: RL (GRPO, or PPO) that teaches a model to interleave reasoning with search-engine calls.

The task (Search-R1's prompt word for word, ``<search>`` served by BM25 or a retrieval server, the v0.3 reward) is
``trl_agentic.tasks.search_r1``; ``trl_agentic.scripts.train_task`` (the ``main`` of ``trl/scripts/grpo.py``)
trains it. The configs hold the paper's settings (Jin et al. 2025, arXiv 2503.09516): text rollouts, observations
cut to 500 tokens and masked out of the loss, up to 4 searches then a final answer, GRPO group 5, KL 0.001 (k3 in
the loss; PPO: k1 in the reward, critic learning rate 10x the actor's). ``--help`` lists every flag::

    # a retrieval server you started (Search-R1's, or python -m trl_agentic.tools.retrieval.server)
    python recipes/search_r1.py --config recipes/configs/search_r1_grpo.yaml \\
        --retriever_url http://127.0.0.1:8000/retrieve
    python recipes/search_r1.py --config recipes/configs/search_r1_ppo.yaml \\
        --retriever_url http://127.0.0.1:8000/retrieve
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
from functools import partial

from trl_agentic.scripts import AgenticScriptArguments, run, train_task
from trl_agentic.tasks import SearchR1Arguments


@dataclass
class SearchR1ScriptArguments(SearchR1Arguments, AgenticScriptArguments):
    """TRL's ``ScriptArguments`` (``dataset_name``: a hub id or a local file or folder; splits), ``algo``, and the
    task's options (retriever, ``topk``, ``reward``)."""


# load the tokenizer, the task and its data; build the trainer; train (evaluating before, during and after); save
# with a model card; push: trl_agentic.scripts.train_task
main = partial(train_task, "search_r1")


if __name__ == "__main__":
    raise SystemExit(run(main, SearchR1ScriptArguments, prog="python recipes/search_r1.py"))
