"""vLLM backends of the generation seam (:class:`~trl_agentic.rollout.generation.Generator`).

- :class:`TRLVLLMGenerator`: TRL's vLLM backend inside a trainer (``use_vllm=True``, colocate or server mode);
  TRL syncs the weights, this class only shapes each turn's call.
- :class:`VLLMServerGenerator`: TRL's vLLM server for asynchronous rollouts (``max_staleness=1``): each process sends
  its own prompts, from the background thread; the trainer pushes the weights between jobs.
- :class:`VLLMGenerator`: an offline ``vllm.LLM`` of its own, for evaluation without a trainer
  (``python -m trl_agentic.evaluate --use_vllm``).

Both stop at every end id (``eos_token_ids``, given to vLLM's sampling parameters) and at the stop strings, kept in the output
(``include_stop_str_in_output``) so that the closing tag is part of the sampled ids; the engine's
:func:`~trl_agentic.rollout.generation.cut_at_stop` then sees exactly what vLLM sampled.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..compat import vllm_generate, vllm_server_generate
from .generation import Generation


def stop_kwargs(stop_strings: Sequence[str], eos_token_ids: Sequence[int]) -> dict[str, Any]:
    """The ``SamplingParams`` fields of one turn's end: every end id, and the stop strings kept in the output."""
    kwargs: dict[str, Any] = {"stop_token_ids": list(eos_token_ids)}
    if stop_strings:
        kwargs.update(stop=list(stop_strings), include_stop_str_in_output=True)
    return kwargs


class TRLVLLMGenerator:
    """The generation seam over TRL's vLLM backend (colocate or server).

    Per call it sets vLLM's ``max_tokens`` to the turn budget and the turn's end (:func:`stop_kwargs`), then restores
    TRL's settings (:func:`trl_agentic.compat.vllm_generate`). The trainer's rollout pushes the policy's weights to
    vLLM (TRL's ``vllm_generation.sync_weights()``) before a round when the step changed.

    Several processes: every call is collective (the engine makes the same calls on every process, with a one-token
    dummy where a process has nothing active). TRL's server mode, and colocate mode with tensor parallelism, gather
    the prompts of several processes and slice the completions back by position, assuming equal counts; a turn's
    active trajectories differ between processes, so :func:`~trl_agentic.compat.vllm_generate` pads each call to the
    largest count and drops the padding's outputs (why padding and not slicing by counts: ``compat._padded_count``).
    ``tests/multiprocess/test_vllm_two_processes.py`` runs TRL's own code for both modes on two processes.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]:
        ids, logprobs = vllm_generate(self.trainer, prompts, max_new_tokens, stop_kwargs(stop_strings, eos_token_ids))
        return [Generation(ids=row, logprobs=None if logprobs is None else logprobs[i]) for i, row in enumerate(ids)]


class VLLMServerGenerator:
    """The generation seam over TRL's vLLM server for asynchronous rollouts: one request per call with this process's
    own prompts (:func:`~trl_agentic.compat.vllm_server_generate`: TRL's sampling settings, the turn's end, the
    sampled ids' log-probs, the behaviour policy's), sent from the background thread; no gather across processes, so
    no collective call leaves the training thread. The weights reach the server from the training thread between
    jobs (:class:`~trl_agentic.rollout.pipeline.ServerWeights`).

    Args:
        backend: TRL's ``VLLMGeneration`` in server mode (``trainer.vllm_generation``): its sampling settings.
        client: This process's client of the server (:func:`~trl_agentic.compat.vllm_server_client`).
    """

    def __init__(self, backend: Any, client: Any) -> None:
        self.backend = backend
        self.client = client

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]:
        ids, logprobs = vllm_server_generate(self.backend, self.client, prompts, max_new_tokens,
                                             stop_kwargs(stop_strings, eos_token_ids))
        return [Generation(ids=row, logprobs=logprobs[i]) for i, row in enumerate(ids)]


class VLLMGenerator:
    """The generation seam over an offline ``vllm.LLM``: one ``generate`` call per turn on token prompts, returning
    the sampled ids and the sampling log-prob of each (``logprobs=0``: the sampled token's only).

    Args:
        llm: A ``vllm.LLM``. Build it with ``enable_prefix_caching=True`` (vLLM's default where supported): each turn
            re-sends the whole history, and the cache turns that re-read into a lookup.
        greedy: Temperature 0 (``temperature`` and ``top_p`` are then ignored).
        temperature, top_p, seed: Sampling settings (``seed`` makes a run repeatable).
        structured_outputs_regex: Every turn must match this regex (vLLM's structured outputs; TRL's
            ``vllm_structured_outputs_regex``), or ``None``.
    """

    def __init__(self, llm: Any, greedy: bool = False, temperature: float = 1.0, top_p: float = 1.0,
                 seed: int | None = None, structured_outputs_regex: str | None = None) -> None:
        self.llm = llm
        self.sampling = dict(temperature=0.0 if greedy else temperature, top_p=1.0 if greedy else top_p, seed=seed)
        self.regex = structured_outputs_regex

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]:
        from vllm import SamplingParams

        constraint = {}
        if self.regex is not None:
            from vllm.sampling_params import StructuredOutputsParams

            constraint = {"structured_outputs": StructuredOutputsParams(regex=self.regex)}
        params = SamplingParams(max_tokens=max_new_tokens, logprobs=0, **stop_kwargs(stop_strings, eos_token_ids),
                                **self.sampling, **constraint)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], params, use_tqdm=False)
        return [_generation(out.outputs[0]) for out in outputs]


def _generation(completion: Any) -> Generation:
    """Our :class:`Generation` from a vLLM ``CompletionOutput``: its ids and the log-prob vLLM reported for each."""
    ids = list(completion.token_ids)
    if completion.logprobs is None:
        return Generation(ids=ids)
    return Generation(ids=ids, logprobs=[float(step[token].logprob) for token, step in zip(ids, completion.logprobs)])
