"""The generation seam: token ids in, token ids (and, where the backend reports them, log-probs) out.

The rollout engine talks to generation only through :class:`Generator`. Implementations:

- :class:`HFGenerator`: transformers ``generate`` (evaluation, the CPU demo, the trainer's non-vLLM path);
- ``trl_agentic.rollout.vllm.TRLVLLMGenerator``: TRL's vLLM backend (colocate or server) inside a trainer;
- scripted fakes in the tests.

End of a turn: every backend stops on the model's end ids (``eos_token_ids``: all of
``generation_config.eos_token_id`` and the tokenizer's EOS, as TRL's ``eos_token_ids``; see
:func:`get_eos_token_ids`) and on stop strings. A batched backend pads the rows that finished early, and transformers
``generate`` may overshoot a stop string by part of a token, so every backend's output goes through
:func:`cut_at_stop`, which keeps the shortest prefix of sampled ids that ends with an end id or whose text contains a
stop string. Nothing after an end id is ever kept. The kept ids are exactly ids the model sampled: nothing is
re-tokenized.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteriaList, StopStringCriteria

from .prefix_cache import CACHE_ARGUMENT, PrefixCache, unsupported_reason

logger = logging.getLogger(__name__)


@dataclass
class Generation:
    """One sampled continuation: ``ids`` and, when known, the sampling log-prob of each id."""

    ids: list[int]
    logprobs: list[float] | None = None


class Generator(Protocol):
    """Generate one continuation per prompt (all prompts of a turn in one batch), stopping at any of
    ``eos_token_ids`` and ``stop_strings`` or after ``max_new_tokens``."""

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]: ...


def get_eos_token_ids(processing_class: Any, generation_config: Any = None) -> list[int]:
    """Every id that ends the model's generation: ``generation_config.eos_token_id`` (an int or a list: instruct
    models list several, e.g. Qwen ``<|im_end|>`` and ``<|endoftext|>``, Llama-3 ``<|eot_id|>``, ``<|eom_id|>`` and
    ``<|end_of_text|>``) plus the tokenizer's ``eos_token_id``, in that order, without duplicates. The same list as
    TRL's ``GRPOTrainer.eos_token_ids``."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    configured = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    ids = [configured] if isinstance(configured, int) else list(configured or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids = [tokenizer.eos_token_id, *ids]
    if not ids:
        raise ValueError("the model has no end-of-sequence id: set generation_config.eos_token_id or the tokenizer's eos")
    return list(dict.fromkeys(int(i) for i in ids))


def cut_at_stop(
    ids: list[int], decode: Callable[[list[int]], str], stop_strings: Sequence[str], eos_token_ids: Sequence[int]
) -> tuple[int, str | None]:
    """Length of the prefix of ``ids`` to keep, and why it ends (``"stop"``, ``"eos"`` or ``None``).

    The prefix ends at the first end id (kept, as TRL keeps it) or at the first token after which the decoded text
    contains a stop string, whichever comes first. Nothing after an end id is kept.
    """
    eos = set(eos_token_ids)
    end, reason = len(ids), None
    for i, token in enumerate(ids):
        if token in eos:
            end, reason = i + 1, "eos"
            break
    if stop_strings and any(s in decode(ids[:end]) for s in stop_strings):
        lo, hi = 1, end  # the smallest k with a stop string in decode(ids[:k]); containment is monotone in k
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in decode(ids[:mid]) for s in stop_strings):
                hi = mid
            else:
                lo = mid + 1
        end, reason = lo, "stop"
    return end, reason


class ChosenTokenLogprobs(LogitsProcessor):
    """The log-prob of each token greedy ``generate`` chooses, recorded one step at a time.

    Greedy decoding takes the argmax of the processed scores (the logits after transformers' logits processors,
    e.g. a repetition penalty), so the token's log-prob is ``log_softmax(scores)[token]``. Called last at each step,
    this processor keeps that step's log-softmax and, at the next step, reads the chosen token from ``input_ids``:
    it holds one step's ``batch x vocabulary`` floats, where ``output_scores`` keeps every step's (with a 262k
    vocabulary and a batch of 100, 105 MB per generated token).
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self.pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.pending is not None:  # the token chosen at the previous step is the last of input_ids
            self.steps.append(self.pending.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def logprobs(self, new_ids: torch.Tensor) -> torch.Tensor | None:
        """``(batch, len(new_ids[0]))``: the log-prob of each generated id (transformers may run a step more than it
        returns, so extra steps are dropped); ``None`` when the steps recorded do not cover the ids (a ``generate``
        that did not call its logits processors, such as a test double)."""
        steps, n = list(self.steps), len(self.steps)
        if n < new_ids.shape[1] and self.pending is not None:  # the last token: no step came after it
            steps.append(self.pending.gather(-1, new_ids[:, n : n + 1].to(self.pending.device)).squeeze(-1))
        if len(steps) < new_ids.shape[1]:
            return None
        if not steps:
            return torch.zeros((new_ids.shape[0], 0))
        return torch.stack(steps, dim=1)[:, : new_ids.shape[1]].cpu()


class SampledTokenLogprobs(ChosenTokenLogprobs):
    """The log-prob of each token sampling ``generate`` draws, recorded one step at a time: that of the distribution
    it samples from, the processed scores after the sampling warpers (temperature, top-k, top-p, ...).

    transformers runs the processors a caller passes before its sampling warpers, so this one applies the same
    warpers (:func:`sampling_warpers`, built from the same settings in transformers' order) to a copy of the scores
    it sees, and records the log-softmax of that; the scores go on unchanged. It holds one step's ``batch x
    vocabulary`` floats, where ``output_scores`` keeps every step's until the call returns.
    """

    def __init__(self, warpers: LogitsProcessorList) -> None:
        super().__init__()
        self.warpers = warpers

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        super().__call__(input_ids, self.warpers(input_ids, scores.clone()))
        return scores


def sampling_warpers(config: Any) -> LogitsProcessorList | None:
    """The sampling warpers transformers' ``generate`` adds for ``config`` (``_get_logits_processor``, in its order:
    temperature, top-k, top-p, min-p, typical-p and epsilon cutoffs), for one sequence per prompt; ``None`` for a
    setting whose processor is not rebuilt here (the eta cutoff, ``top_h``, watermarking, ``renormalize_logits``,
    beams), where the caller keeps every step's scores instead."""
    from transformers.generation.logits_process import (
        EpsilonLogitsWarper,
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
        TypicalLogitsWarper,
    )

    if getattr(config, "top_h", None) is not None or getattr(config, "watermarking_config", None) is not None \
            or getattr(config, "renormalize_logits", False) or (config.num_beams or 1) > 1:
        return None
    warpers = LogitsProcessorList()
    if config.temperature is not None and config.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(config.temperature))
    if config.top_k is not None and config.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=config.top_k, min_tokens_to_keep=1))
    if config.top_p is not None and config.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=config.top_p, min_tokens_to_keep=1))
    if config.min_p is not None:
        warpers.append(MinPLogitsWarper(min_p=config.min_p, min_tokens_to_keep=1))
    if config.typical_p is not None and config.typical_p < 1.0:
        warpers.append(TypicalLogitsWarper(mass=config.typical_p, min_tokens_to_keep=1))
    if config.epsilon_cutoff is not None and 0.0 < config.epsilon_cutoff < 1.0:
        warpers.append(EpsilonLogitsWarper(epsilon=config.epsilon_cutoff, min_tokens_to_keep=1))
    if config.eta_cutoff is not None and 0.0 < config.eta_cutoff < 1.0:
        return None  # its warper needs the model's device: not rebuilt here
    return warpers


@contextlib.contextmanager
def gradient_checkpointing_off(model: Any) -> Iterator[None]:
    """Switch gradient checkpointing off on every module that has it for the duration, and back on after."""
    checkpointed = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    for module in checkpointed:
        module.gradient_checkpointing = False
    try:
        yield
    finally:
        for module in checkpointed:
            module.gradient_checkpointing = True


@contextlib.contextmanager
def generation_mode(model: Any) -> Iterator[Any]:
    """The model in eval mode with gradient checkpointing off, restored afterwards. transformers' ``generate`` on a
    checkpointed model in train mode (as ``SFTTrainer`` leaves it) drops the KV cache yet still feeds one token per
    step, so the model generates without seeing its context."""
    was_training = model.training
    model.eval()
    try:
        with gradient_checkpointing_off(model):
            yield model
    finally:
        model.train(was_training)


class HFGenerator:
    """Batched sampling with transformers ``generate``.

    Args:
        model: A causal LM (or a context-manager factory yielding one, see ``unwrap``).
        tokenizer: Tokenizer used for padding and for transformers' stop-string matching.
        generation_config: Sampling settings (``do_sample``, ``temperature``, ``top_p``, ...); ``max_new_tokens``
            is set per call. Defaults to the model's generation config with sampling on.
        unwrap: Optional zero-argument callable returning a context manager that yields the model to call
            ``generate`` on (the trainer passes TRL's ``unwrap_model_for_generation``); by default
            :func:`generation_mode`.
        return_logprobs: Also return the log-prob of each generated token: greedy, that of the processed scores the
            argmax chose from, recorded one step at a time (:class:`ChosenTokenLogprobs`); sampled, that of the
            sampling distribution, recorded one step at a time too (:class:`SampledTokenLogprobs`), or, for a
            setting whose warper it does not rebuild, from every step's scores kept in memory. Off in the trainer,
            which recomputes them, but for the policy copy of asynchronous rollouts (the behaviour log-probs).
            ``None`` when ``generate`` ran no step through the recorder or returned a plain tensor of ids (no
            scores), as transformers does without ``return_dict_in_generate`` and as TRL's tests' doubles do.
        keep_cache: Inside :meth:`session`, keep each row's KV cache between calls, so that a prompt extending an
            earlier one (the next turn of a trajectory) prefills only its new ids
            (:mod:`~trl_agentic.rollout.prefix_cache`). Where the model cannot keep it, the generator logs why once
            and re-prefills.
        max_cached_tokens: Most positions the kept cache holds (a position shared by several rows counts once; the
            least recently used go first); ``None``: no bound but the session's end (the distinct prefixes of one
            rollout: at most the positions of its rows' conversations, a shared prompt once).

    Attributes:
        prefilled_tokens: Prompt ids computed so far (padding excluded), ``shared_tokens`` included.
        reused_tokens: Prompt ids of the calls' rows taken from the kept cache instead.
        shared_tokens: Ids prefilled ahead of a call, once, for its rows to share (a common system prompt, a GRPO
            group's prompt). ``prefilled_tokens - shared_tokens + reused_tokens`` is the prompt ids of every call.
        peak_cached_tokens: The most positions the kept cache held between calls, over the sessions so far.
    """

    def __init__(
        self,
        model: Any,
        processing_class: Any,
        generation_config: Any = None,
        unwrap: Callable[[], ContextManager[Any]] | None = None,
        return_logprobs: bool = False,
        keep_cache: bool = True,
        max_cached_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = getattr(processing_class, "tokenizer", processing_class)
        if generation_config is None:
            generation_config = copy.deepcopy(model.generation_config)
            generation_config.do_sample = True
        self.generation_config = generation_config
        self.unwrap = unwrap or (lambda: generation_mode(self.model))
        self.return_logprobs = return_logprobs
        self.keep_cache = keep_cache
        if max_cached_tokens is not None and (isinstance(max_cached_tokens, bool) or not isinstance(
                max_cached_tokens, int) or max_cached_tokens < 0):
            raise ValueError(f"max_cached_tokens={max_cached_tokens!r}: pass a number of positions >= 0, or None for "
                             "no bound but the session's end")
        self.max_cached_tokens = max_cached_tokens
        self.prefilled_tokens = 0
        self.reused_tokens = 0
        self.shared_tokens = 0
        self.peak_cached_tokens = 0
        self._stop_criteria: dict[tuple[str, ...], StopStringCriteria] = {}
        self._prefix_cache: PrefixCache | None = None
        self._in_session = False
        self._cache_refused: str | None = None

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Calls made inside share a KV cache (``keep_cache``): one rollout, whose weights do not change. The cache
        is dropped on exit, so no call outside a session, or in a later one, reads keys and values of other weights."""
        if self._in_session:  # nested: the outer session owns the cache
            yield
            return
        self._in_session = True
        self._prefix_cache = PrefixCache(self.max_cached_tokens) if self.keep_cache and self._cache_refused is None else None
        try:
            yield
        finally:
            self._in_session = False
            self._prefix_cache = None

    def _refuse_cache(self, reason: str) -> None:
        """Stop keeping the cache for this generator's life, saying why once."""
        self._cache_refused = reason
        self._prefix_cache = None
        logger.warning("the KV cache is not kept across turns (each turn prefills the whole conversation): %s", reason)

    def _stopping_criteria(self, stop_strings: Sequence[str]) -> StoppingCriteriaList | None:
        """transformers' ``StopStringCriteria`` for these strings, built once per generator. transformers builds one
        from the whole vocabulary in every ``generate`` call given ``stop_strings`` (2.8 s with Gemma-3's 262k-token
        vocabulary, ``benchmarks/rollout_speed.py hotpath --gemma``; its own cache never hits because a fast
        tokenizer's ``get_vocab()`` order changes between calls); the criteria is stateless between calls."""
        if not stop_strings:
            return None
        key = tuple(stop_strings)
        if key not in self._stop_criteria:
            self._stop_criteria[key] = StopStringCriteria(self.tokenizer, list(key))
        return StoppingCriteriaList([self._stop_criteria[key]])

    def _prefill(self, model: Any, prefix_cache: PrefixCache, prompts: list[list[int]], pad_id: int, device: Any,
                 eos_token_ids: Sequence[int]) -> None:
        """One forward pass over what ``prompts`` add to the cache, kept in it (what the rows of the next call share:
        :meth:`~trl_agentic.rollout.prefix_cache.PrefixCache.shared_prefixes`). Position ids are counted from the
        attention mask, as ``generate`` counts them."""
        batch = prefix_cache.batch(prompts, pad_id, device, 0)
        new = batch.input_ids.shape[1] - batch.cache.get_seq_length()
        mask = batch.attention_mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -new:]
        model(input_ids=batch.input_ids[:, -new:].to(device), attention_mask=mask, position_ids=positions,
              use_cache=True, logits_to_keep=1, **{CACHE_ARGUMENT: batch.cache})
        self.prefilled_tokens += sum(batch.prefilled)
        self.shared_tokens += sum(batch.prefilled)
        prefix_cache.store(prompts, batch.input_ids, batch.cache, batch.input_ids.shape[1], eos_token_ids)

    def generate(
        self, prompts: list[list[int]], max_new_tokens: int, stop_strings: Sequence[str], eos_token_ids: Sequence[int]
    ) -> list[Generation]:
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos_token_ids[0]
        config = copy.deepcopy(self.generation_config)
        config.max_new_tokens = max_new_tokens
        config.pad_token_id = pad_id
        config.eos_token_id = list(eos_token_ids)
        config.return_dict_in_generate = True
        chosen: ChosenTokenLogprobs | None = None
        if self.return_logprobs and not config.do_sample:
            chosen = ChosenTokenLogprobs()
        elif self.return_logprobs and (warpers := sampling_warpers(config)) is not None:
            chosen = SampledTokenLogprobs(warpers)
        config.output_scores = self.return_logprobs and chosen is None
        with self.unwrap() as model, torch.no_grad():
            device = next(model.parameters()).device
            prefix_cache = self._prefix_cache
            if prefix_cache is not None and (reason := unsupported_reason(model, config)) is not None:
                self._refuse_cache(reason)
                prefix_cache = None
            if prefix_cache is not None:
                for shared in prefix_cache.shared_prefixes(prompts):
                    self._prefill(model, prefix_cache, shared, pad_id, device, eos_token_ids)
                batch = prefix_cache.batch(prompts, pad_id, device, max_new_tokens)
                input_ids, attention_mask = batch.input_ids, batch.attention_mask
                cache = {CACHE_ARGUMENT: batch.cache}
                config.use_cache = True
                self.prefilled_tokens += sum(batch.prefilled)
                self.reused_tokens += sum(batch.reused)
            else:
                input_ids, attention_mask = left_pad(prompts, pad_id)
                cache = {}
                self.prefilled_tokens += sum(len(p) for p in prompts)
            width = input_ids.shape[1]
            out = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                stopping_criteria=self._stopping_criteria(stop_strings),
                logits_processor=LogitsProcessorList([chosen]) if chosen is not None else None,
                **cache,
            )
        # transformers returns a GenerateOutput when asked (return_dict_in_generate), else a tensor of ids; a model
        # or a test double (TRL's tests mock generate so) may return the tensor anyway: then there are no scores
        sequences = out if isinstance(out, torch.Tensor) else out.sequences
        scores = None if isinstance(out, torch.Tensor) else out.scores
        if prefix_cache is not None and self._prefix_cache is prefix_cache:
            returned = None if isinstance(out, torch.Tensor) else getattr(out, CACHE_ARGUMENT, None)
            refused = prefix_cache.store(prompts, sequences, returned, width, eos_token_ids)
            if refused is not None:
                self._refuse_cache(refused)
            self.peak_cached_tokens = max(self.peak_cached_tokens, prefix_cache.peak_tokens)
        new_ids = sequences[:, width:].cpu()
        logprobs = None
        if chosen is not None:
            logprobs = chosen.logprobs(new_ids)
        elif self.return_logprobs and scores is not None:
            step_logps = torch.stack([torch.log_softmax(s.float(), dim=-1) for s in scores], dim=1).cpu()
            logprobs = step_logps.gather(-1, new_ids.unsqueeze(-1)).squeeze(-1)
        results = []
        for row in range(len(prompts)):
            ids = new_ids[row].tolist()
            results.append(Generation(ids=ids, logprobs=logprobs[row].tolist() if logprobs is not None else None))
        return results


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``prompts`` left-padded to the longest, as ``generate`` takes them."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(list(ids), dtype=torch.long)
        attention_mask[row, width - len(ids) :] = 1
    return input_ids, attention_mask


def generation_session(generator: Generator) -> ContextManager[None]:
    """The generator's :meth:`HFGenerator.session` (a KV cache shared by the calls inside), or a no-op for a
    generator without one (vLLM keeps its own prefix cache; test doubles)."""
    session = getattr(generator, "session", None)
    return session() if callable(session) else contextlib.nullcontext()
