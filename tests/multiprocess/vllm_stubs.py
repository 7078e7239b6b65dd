"""Stand-ins for what lies beyond TRL's vLLM backend, so that TRL's own ``VLLMGeneration`` (its gathers, broadcasts
and per-process slicing) runs unchanged on CPU without vLLM:

- :class:`StubVLLMClient` replaces ``VLLMClient`` (the HTTP transport of server mode);
- :class:`StubLLM` and :class:`StubSamplingParams` replace ``vllm.LLM`` and ``vllm.SamplingParams`` (colocate mode).

Both "sample", for each prompt, :func:`encode` of that prompt: ids that say which prompt they came from, so a test can
trace every trajectory's tokens back to the input it sent.
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
from typing import Any

SAFE_IDS = range(300, 400)  # whole words of trl_agentic.toy's tokenizer: no special id, no end id
SAMPLED = 4  # ids per completion
LOGPROB = -0.5  # the "sampling log-prob" of every id


def encode(prompt: list[int]) -> list[int]:
    """The completion of ``prompt``: ``SAMPLED`` ids drawn from a digest of the whole prompt."""
    digest = hashlib.sha256(repr([int(i) for i in prompt]).encode()).digest()
    return [SAFE_IDS[b % len(SAFE_IDS)] for b in digest[:SAMPLED]]


def install(mode: str, calls: list[int]) -> None:
    """Patch TRL's ``trl.generation.vllm_generation`` so that ``VLLMGeneration`` builds the stubs (``mode``:
    ``"server"`` or ``"colocate"``); ``calls`` receives the number of prompts of every request the stub serves."""
    import trl.generation.vllm_generation as vllm_generation

    vllm_generation.is_vllm_available = lambda *args, **kwargs: True
    if mode == "server":
        vllm_generation.VLLMClient = lambda **kwargs: StubVLLMClient(calls)
    else:
        vllm_generation.LLM = lambda **kwargs: StubLLM(calls)
        vllm_generation.SamplingParams = StubSamplingParams


class StubVLLMClient:
    """``VLLMClient`` without a server: ``generate`` answers every prompt with :func:`encode`."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls

    def init_communicator(self, device: Any = 0) -> None:
        pass

    def get_server_info(self) -> dict[str, Any]:
        return {"model_config": {"logprobs_mode": "processed_logprobs"}}

    def update_named_params(self, metadata: Any, params: Any) -> None:
        for _ in params:  # the other processes take part in the same gathers
            pass

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts: list[list[int]], n: int = 1, max_tokens: int = 16, **_: Any) -> dict[str, Any]:
        self.calls.append(len(prompts))
        completions = [encode(p)[:max_tokens] for p in prompts for _ in range(n)]
        return {"prompt_ids": [list(p) for p in prompts], "completion_ids": completions,
                "logprobs": [[[LOGPROB] for _ in ids] for ids in completions],
                "logprob_token_ids": [[[i] for i in ids] for ids in completions]}


class StubSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)


class StubLLM:
    """``vllm.LLM`` without an engine: ``generate`` returns vLLM's ``RequestOutput`` shape, :func:`encode` of each
    prompt; ``load_weights`` (TRL's colocate weight sync) accepts the weights."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls
        model = SimpleNamespace(load_weights=lambda weights: None)
        self.llm_engine = SimpleNamespace(model_executor=SimpleNamespace(
            driver_worker=SimpleNamespace(model_runner=SimpleNamespace(model=model))))

    def reset_prefix_cache(self) -> None:
        pass

    def generate(self, prompts: list[dict[str, Any]], sampling_params: StubSamplingParams, use_tqdm: bool = False):
        self.calls.append(len(prompts))
        outputs = []
        for prompt in prompts:
            ids = encode(prompt["prompt_token_ids"])[:sampling_params.max_tokens]
            logprobs = [{i: SimpleNamespace(rank=1, logprob=LOGPROB)} for i in ids]
            outputs.append(SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"],
                                           outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs
