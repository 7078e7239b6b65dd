"""The boundary with TRL: every override of a private ``GRPOTrainer`` method and every private TRL (or transformers
``Trainer``) name used by trl-agentic lives in this module, and nowhere else. ``tests/test_boundary.py`` enforces it
and also lists every public TRL attribute our code reads and every public method our trainers override;
``tests/test_compat.py`` and ``tests/test_round.py`` hold the contract tests.

:class:`GRPOTrainerBoundary` hands our trainers named hooks: ``training_batch(rows) -> TRLBatch`` (one generation
round; default TRL's ``_generate_and_score_completions``, untouched), ``loss(model, batch)`` (one micro-batch;
default TRL's, :meth:`~GRPOTrainerBoundary.trl_loss`), ``extra_parameters()`` (a critic's parameters outside the
model), ``reshuffle_each_pass`` (PPO's new permutation per epoch) and ``group_by_length`` (micro-batches of rows of
similar length, each cut to its own width); and the services a round of our own needs:
TRL's reward functions (``trl_rewards``), log-probs computed as TRL computes them (``policy_logps``,
``reference_logps``, ``logps_and_entropies``) and TRL's logging (``add_metrics``, ``count_tokens``,
``take_round_logs``, ``log_round_table``, ``log_completion_columns``).

What it relies on, with the place in trl 1.16.0 (``trl/trainer/grpo_trainer.py`` unless named):

=====================================================  ==========================================================
TRL internal                                           used for
=====================================================  ==========================================================
``_generate_and_score_completions(inputs)`` (l. 2324)   overridden: ``training_batch``; TRL's called by its default
``_calculate_rewards(inputs, prompts, ...)`` (l. 1579)  called once per round: ``trl_rewards``
``_compute_loss(model, inputs)`` (l. 3020)              overridden: ``loss``; called by ``trl_loss``
``_get_per_token_logps_and_entropies`` (l. 1419)        called: ``logps_and_entropies``, ``policy_logps``,
                                                        ``reference_logps`` (with ``trl.trainer.utils.use_adapter``
                                                        for a PEFT reference, l. 2727)
``_prepare_inputs(generation_batch)`` (l. 1522)         overridden: ``reshuffle_each_pass``, ``group_by_length``,
                                                        with ``_step`` (l. 948),
                                                        ``_buffered_inputs`` (l. 951) and ``trl.trainer.utils``'
                                                        ``split_tensor_dict``, ``shuffle_sequence_dict``,
                                                        ``(un)split_pixel_values_by_grid``
``_metrics`` (l. 1080)                                  ``add_metrics``, ``count_tokens`` (TRL's ``num_tokens``,
                                                        l. 2293): averaged and logged with TRL's metrics
``_logs``, ``_pending_extra_logs``, ``_pending_metrics``  ``take_round_logs``, ``log_round_table``: TRL's completions
(l. 1088-1098)                                          table and the reward functions' ``log_extra`` / ``log_metric``
                                                        (l. 2833-2855)
``_log_completion_extra`` (l. 1553)                     ``log_completion_columns``
``_dist`` (l. 1177)                                     ``unwrap_for_generation``: FSDP parameter gathering
``Trainer._clip_grad_norm(model)`` (transformers)       overridden: the critic's gradients clipped with the model's
``VLLMGeneration.max_completion_length``,               ``TRLVLLMGenerator``: per-turn budget and stop strings
``.generation_kwargs``, ``.generate`` (vllm_generation)
``VLLMGeneration.mode``, ``.tensor_parallel_size``,     ``vllm_generate``: which processes ``generate`` gathers
``.tp_group`` (vllm_generation)                         (each call padded to the same count on all of them)
=====================================================  ==========================================================

``REQUIRED_SIGNATURES`` lists the parameters we call the private methods with. Nothing here replaces a method on an
instance or writes a TRL attribute that TRL also writes, except ``_buffered_inputs`` (as TRL's own
``_prepare_inputs``), ``model_wrapped`` (``end_training``), and TRL's logging state as TRL writes it
(``count_tokens``, ``take_round_logs``, ``log_round_table``), which only a round of our own writes (TRL's does not run then).
TRL's vLLM backend (``VLLMGeneration.max_completion_length`` / ``.generation_kwargs`` / ``.generate(...)`` /
``.mode`` / ``.tensor_parallel_size`` / ``.tp_group``) is reached only through :func:`vllm_generate`.
``trl.chat_template_utils.parse_response`` is reached only through :func:`parse_response`, its copy of Qwen2.5's chat
template only through :func:`qwen2_5_chat_template`.
TRL's GRPO script (``trl.scripts.grpo``, what ``trl grpo`` runs) is reached only through :func:`trl_grpo_script`.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
import warnings
from typing import Any, Callable, Iterator, Sequence

import torch
import trl
from packaging.version import Version
from trl import GRPOTrainer

from .algorithms.masked import zero_masked


# -- TRL's batch ------------------------------------------------------------------------------------------------
class TRLBatch:
    """Typed view of the batch dict TRL's ``_generate_and_score_completions`` returns (and ``_compute_loss``
    takes). Shapes: ``B`` rows (this process), ``P`` prompt width, ``C`` completion width.

    =============================  =======================================================================
    property (TRL key)             meaning
    =============================  =======================================================================
    ``prompt_ids``, ``prompt_mask``  (B, P), **left**-padded
    ``completion_ids``              (B, C), right-padded with the pad id
    ``completion_mask``             (B, C), 1 on real completion positions (0 on padding)
    ``env_mask`` (``tool_mask``)    (B, C), 1 where the model sampled the token, 0 on observations
    ``loss_mask``                   ``completion_mask * env_mask``: the positions the loss trains
    ``advantages``                  (B,) group advantages, or (B, C) per-token advantages
    ``old_logps`` / ``ref_logps``   (B, C) or None (``old_per_token_logps`` / ``ref_per_token_logps``)
    ``sampling_logps``              (B, C) or None: the log-probs vLLM sampled with (``sampling_per_token_logps``)
    ``num_items_in_batch``          scalar: trained positions over all processes (for ``loss_type="dapo"``)
    =============================  =======================================================================
    """

    LEFT_PADDED = ("prompt_ids", "prompt_mask")
    TRL_ORDER = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "advantages", "num_items_in_batch",
                 "old_per_token_logps", "importance_sampling_ratio", "sampling_per_token_logps",
                 "ref_per_token_logps", "tool_mask")
    """The keys in the order TRL's ``_generate_and_score_completions`` writes them (its buffer shuffle reads the
    first value)."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def in_trl_order(self) -> None:
        """Put TRL's keys in TRL's order (:data:`TRL_ORDER`), any other key after them."""
        rank = {key: i for i, key in enumerate(self.TRL_ORDER)}
        self.data = dict(sorted(self.data.items(), key=lambda item: rank.get(item[0], len(rank))))

    # -- ids and masks
    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.data["prompt_ids"]

    @property
    def prompt_mask(self) -> torch.Tensor:
        return self.data["prompt_mask"]

    @property
    def completion_ids(self) -> torch.Tensor:
        return self.data["completion_ids"]

    @property
    def completion_mask(self) -> torch.Tensor:
        return self.data["completion_mask"]

    @property
    def env_mask(self) -> torch.Tensor:
        mask = self.data.get("tool_mask")
        return torch.ones_like(self.completion_mask) if mask is None else mask

    @env_mask.setter
    def env_mask(self, value: torch.Tensor) -> None:
        self.data["tool_mask"] = value

    @property
    def loss_mask(self) -> torch.Tensor:
        """``completion_mask * tool_mask``: the positions the loss trains on (sampled tokens only)."""
        return self.data["completion_mask"] * self.env_mask

    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    # -- learning signal
    @property
    def advantages(self) -> torch.Tensor:
        return self.data["advantages"]

    @advantages.setter
    def advantages(self, value: torch.Tensor) -> None:
        self.data["advantages"] = value

    @property
    def old_logps(self) -> torch.Tensor | None:
        return self.data.get("old_per_token_logps")

    @old_logps.setter
    def old_logps(self, value: torch.Tensor) -> None:
        self.data["old_per_token_logps"] = value

    @property
    def ref_logps(self) -> torch.Tensor | None:
        return self.data.get("ref_per_token_logps")

    @property
    def sampling_logps(self) -> torch.Tensor | None:
        return self.data.get("sampling_per_token_logps")

    def pop_ref_logps(self) -> torch.Tensor | None:
        """Remove the reference log-probs (PPO puts the KL in the reward, so TRL's loss must not see them)."""
        return self.data.pop("ref_per_token_logps", None)

    @property
    def num_items_in_batch(self) -> torch.Tensor:
        return self.data["num_items_in_batch"]

    def recount_items(self, gather: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Recompute ``num_items_in_batch`` after the loss mask changed (``gather`` concatenates over processes)."""
        self.data["num_items_in_batch"] = gather(self.loss_mask.sum().reshape(1)).sum()

    def __getitem__(self, key: str) -> Any:  # extra keys our trainers add (PPO's values, returns)
        return self.data[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key] = value

    # -- layout, for merging rounds
    def row_keys(self) -> list[str]:
        """Keys of per-row tensors (dim 0 = this process's rows), in TRL's order."""
        rows = self.prompt_ids.size(0)
        return [k for k, v in self.data.items() if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == rows]

    def pad_value(self, key: str, pad_token_id: int) -> float:
        return pad_token_id if key in ("prompt_ids", "completion_ids") else 0

    def is_left_padded(self, key: str) -> bool:
        return key in self.LEFT_PADDED

    def select(self, rows: torch.Tensor) -> TRLBatch:
        """The batch of ``rows`` (indices): every per-row tensor indexed, the rest (``num_items_in_batch``) kept."""
        keys = set(self.row_keys())
        return TRLBatch({key: value[rows.to(value.device)] if key in keys else value for key, value in self.data.items()})

    def completion_lengths(self) -> torch.Tensor:
        """(B,) each row's completion length: its last real position + 1 (0 for an empty row)."""
        mask = self.completion_mask
        if mask.size(1) == 0:
            return mask.new_zeros(mask.size(0))
        return (mask.bool() * torch.arange(1, mask.size(1) + 1, device=mask.device)).amax(dim=1)

    def longest_first(self) -> torch.Tensor:
        """The row indices by completion length, longest first, ties in their order (a stable sort)."""
        return torch.sort(self.completion_lengths(), descending=True, stable=True).indices

    def trimmed(self, multiple: int | None = None) -> TRLBatch:
        """The batch with the completion padding that every row has cut off: each (B, C) value (the completion ids,
        masks, log-probs, per-token advantages, PPO's values) cut to the longest completion, rounded up to
        ``multiple``. The loss is unchanged: the model is causal, so the cut positions, after every row's real
        tokens, never reach a kept one, and every per-token term is masked at them. The prompt (left-padded:
        cutting it would shift the positions of every token) is kept whole."""
        rows, width = self.completion_ids.shape
        if rows == 0 or width == 0:
            return self
        keep = max(1, int(self.completion_lengths().max()))
        if multiple:
            keep = -(-keep // multiple) * multiple
        if keep >= width:
            return self
        data = {key: value[:, :keep] if isinstance(value, torch.Tensor) and value.dim() >= 2
                and not self.is_left_padded(key) and value.size(1) == width else value
                for key, value in self.data.items()}
        return TRLBatch(data)


def by_completion_length(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` (a TRL generation batch) with its rows ordered by completion length, longest first, ties kept in
    their order (a stable sort of the shuffled batch), so that the micro-batches ``split_tensor_dict`` cuts from it
    hold rows of similar length (the longest first: a micro-batch too large for memory fails at once)."""
    order = TRLBatch(data).longest_first().cpu()

    def reorder(value: Any) -> Any:
        if value is None or (isinstance(value, torch.Tensor) and value.dim() == 0):
            return value
        if isinstance(value, torch.Tensor):
            return value[order.to(value.device)]
        return [value[i] for i in order.tolist()]

    return {key: reorder(value) for key, value in data.items()}



def _no_reward_kwargs_dump(record: logging.LogRecord) -> bool:
    """A logging filter that drops TRL 1.16's "All reward functions returned None for the following kwargs" warning
    (``GRPOTrainer._calculate_rewards``), which prints a whole row of keyword arguments."""
    return "All reward functions returned None for the following kwargs" not in str(record.msg)


TESTED_TRL = (Version("1.15.0"), Version("1.17.0"))  # [min, max)

# Private methods of GRPOTrainer this module overrides or calls, with the parameters it relies on.
REQUIRED_SIGNATURES: dict[str, list[str]] = {
    "_generate_and_score_completions": ["self", "inputs"],
    "_compute_loss": ["self", "model", "inputs"],
    "_get_per_token_logps_and_entropies": ["self", "model", "input_ids", "attention_mask", "logits_to_keep"],
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_prepare_inputs": ["self", "generation_batch"],
    "_clip_grad_norm": ["self", "model"],
    "__init__": ["self", "model", "reward_funcs", "args"],
}


def parse_response(processing_class: Any, ids: Sequence[int], prefix: Sequence[int], tools: Sequence[Any]) -> dict[str, Any]:
    """TRL's ``trl.chat_template_utils.parse_response`` (TRL 1.16, ``chat_template_utils.py``), the parser its tool
    loop uses (``GRPOTrainer._generate``): the tokenizer's response template reads one assistant turn into
    ``{"role", "content", "tool_calls"?}``, arguments typed by ``tools``' schemas; a turn it cannot read comes back
    as its decoded text. Kept in the boundary: the module is not part of TRL's top-level exports.

    An empty turn (a rollout whose environment failed before the model spoke) is an empty assistant message: TRL
    never parses one, and transformers >= 5.24 reads an empty id list as an empty *batch* and returns ``[]``, which
    TRL's parser then fails on (``'list' object has no attribute 'get'``). Any other result that is not one message
    falls back to the decoded text, as TRL's parser does for a turn it cannot read."""
    from trl.chat_template_utils import parse_response as trl_parse_response

    if not ids:
        return {"role": "assistant", "content": ""}
    try:
        parsed = trl_parse_response(processing_class, list(ids), prefix=list(prefix), tools=list(tools) or None)
    except AttributeError:  # a parser result TRL could not read (not one message)
        parsed = None
    if not isinstance(parsed, dict):
        tokenizer = getattr(processing_class, "tokenizer", processing_class)
        parsed = {"role": "assistant", "content": tokenizer.decode(list(ids), skip_special_tokens=True)}
    return parsed


def qwen2_5_chat_template() -> str:
    """Qwen2.5-Instruct's chat template as TRL 1.16 keeps it (``trl/chat_templates/qwen2_5.jinja``, the hub's bytes):
    a tool-calling template that TRL's ``supports_tool_calling`` accepts and whose calls its ``add_response_schema``
    knows how to parse. Kept in the boundary: ``trl.chat_template_utils`` is not part of TRL's top-level exports."""
    from trl.chat_template_utils import qwen2_5_chat_template as template

    return template


def trl_tool_chat_template(processing_class: Any) -> str | None:
    """The chat template TRL 1.16's ``GRPOTrainer`` renders tool rollouts with instead of the tokenizer's own, or
    ``None`` when it keeps that one: when the template is not prefix-preserving (Qwen3's strips earlier reasoning),
    TRL swaps in its training variant (``trl.get_training_chat_template``; ``GRPOTrainer.__init__``, with
    ``trl.chat_template_utils.is_chat_template_prefix_preserving``, which is not a top-level export)."""
    from trl import get_training_chat_template
    from trl.chat_template_utils import is_chat_template_prefix_preserving

    if is_chat_template_prefix_preserving(processing_class):
        return None
    return get_training_chat_template(processing_class)


def check_trl_version() -> None:
    """Warn when TRL is outside the tested range (the contract tests say exactly what broke)."""
    version = Version(trl.__version__)
    if not TESTED_TRL[0] <= version < TESTED_TRL[1]:
        warnings.warn(
            f"trl-agentic is tested with trl>={TESTED_TRL[0]},<{TESTED_TRL[1]}; found trl {trl.__version__}. Run "
            "tests/test_compat.py to see whether the TRL internals it uses still match.",
            stacklevel=2,
        )


def signature_mismatches() -> list[str]:
    """Names whose parameters no longer include what we call them with (empty when compatible)."""
    problems = []
    for name, required in REQUIRED_SIGNATURES.items():
        fn = getattr(GRPOTrainer, name, None)
        if fn is None:
            problems.append(f"GRPOTrainer.{name} is gone")
            continue
        params = list(inspect.signature(fn).parameters)
        missing = [p for p in required if p not in params]
        if missing:
            problems.append(f"GRPOTrainer.{name} lost parameters {missing}")
    return problems


class _OnePerPrompt(int):
    """The group size 1, except that it is not "less than 2": it passes ``GRPOConfig``'s check that GRPO samples
    at least two completions per prompt, and every divisibility check sees 1."""

    def __new__(cls) -> "_OnePerPrompt":
        return super().__new__(cls, 1)

    def __lt__(self, other: Any) -> bool:
        return False if other == 2 else int(self) < other


def post_init_with_one_generation(config: Any, post_init: Callable[[], None]) -> None:
    """Run ``GRPOConfig.__post_init__`` (``post_init``) for a config that samples one completion per prompt (PPO),
    which GRPOConfig refuses (GRPOTrainer itself handles it), then leave ``num_generations`` a plain ``1``."""
    if config.num_generations != 1:
        post_init()
        return
    config.num_generations = _OnePerPrompt()
    try:
        post_init()
    finally:
        config.num_generations = 1


class GRPOTrainerBoundary(GRPOTrainer):
    """``GRPOTrainer`` with TRL's private methods overridden once, behind named hooks (module docstring).

    Without any hook overridden it behaves exactly as ``GRPOTrainer``.
    """

    reshuffle_each_pass: bool = False
    group_by_length: bool = False  # micro-batches of rows of similar completion length, each cut to its own width
    # The batch keys TRL's _compute_loss passes to _get_per_token_logps_and_entropies besides the ids and masks.
    MULTIMODAL_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                       "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")
    settle_seconds: float = 1.0  # end_training: time for gloo's workers to release their last work objects

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._full_generation_batch: dict[str, Any] | None = None
        super().__init__(*args, **kwargs)

    # -- hooks -----------------------------------------------------------------------------------------------
    def training_batch(self, rows: list[dict[str, Any]]) -> TRLBatch:
        """The batch to train on for one generation round of dataset ``rows`` (default: TRL's
        ``_generate_and_score_completions``, untouched)."""
        return TRLBatch(super()._generate_and_score_completions(rows))

    def loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """The loss of one micro-batch (default: TRL's)."""
        return self.trl_loss(model, batch)

    def after_loss(self) -> None:
        """After each micro-batch's loss (default: nothing)."""

    def extra_parameters(self) -> list[torch.nn.Parameter]:
        """Trained parameters that are not the model's (default: none): clipped together with the model's."""
        return []

    # -- services --------------------------------------------------------------------------------------------
    def trl_rewards(self, rows: list[dict[str, Any]], prompts: list[Any], completions: list[Any],
                    completion_ids: list[list[int]]) -> torch.Tensor:
        """TRL's reward functions on one round (``GRPOTrainer._calculate_rewards``, l. 1579), with TRL's keyword
        arguments: every column of ``rows`` but ``prompt`` (our ``trajectory`` included), ``prompts``,
        ``completions``, ``completion_ids``, ``trainer_state``, ``log_extra``, ``log_metric``. Returns the
        (B_global, num_reward_funcs) rewards of every process, NaN where a function returned ``None``.

        TRL's warning for a completion that no function scored prints all its keyword arguments (our
        ``Trajectory`` objects with their token ids: kilobytes a row); it is left out here, and the trainer names
        such completions in one line instead."""
        trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
        trl_logger.addFilter(_no_reward_kwargs_dump)
        try:
            return self._calculate_rewards(rows, prompts, completions, completion_ids)
        finally:
            trl_logger.removeFilter(_no_reward_kwargs_dump)

    def trl_loss(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """TRL's loss (``GRPOTrainer._compute_loss``), its k3 KL term included when ``beta != 0``.

        TRL masks by multiplication (``per_token_loss * mask``), so a non-finite value at a masked position would
        turn the loss into NaN. Before TRL reads them, non-finite old, reference and sampling log-probs at masked
        positions are set to 0, per-token advantages there to 0 and importance ratios to 1; values at trained
        positions are untouched, so the loss and TRL's metrics are unchanged (finite values at masked positions
        count 0). Limit: a masked position where the policy's own log-prob is below about -88 still overflows TRL's
        k3 (``exp(ref - logp)`` in float32), as it would in TRL.
        """
        mask = batch.loss_mask.bool()
        data = dict(batch.data)
        if data["advantages"].dim() == 2:
            data["advantages"] = zero_masked(data["advantages"], mask)
        for key, neutral in (("old_per_token_logps", 0.0), ("ref_per_token_logps", 0.0),
                             ("sampling_per_token_logps", 0.0), ("importance_sampling_ratio", 1.0)):
            value = data.get(key)
            if isinstance(value, torch.Tensor) and value.shape == mask.shape:
                data[key] = torch.where(mask | torch.isfinite(value), value, torch.full_like(value, neutral))
        return super()._compute_loss(model, data)

    def logps_and_entropies(self, model: Any, batch: TRLBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token log-probs (with gradient) and entropies of the completion under ``model``, computed as TRL's
        loss computes them (multimodal inputs passed through)."""
        logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, batch.input_ids(), batch.attention_mask(), batch.completion_ids.size(1), compute_entropy=True,
            **{key: batch.data.get(key) for key in self.MULTIMODAL_KEYS},
        )
        return logps, entropies

    def policy_logps(self, model: Any, batch: TRLBatch) -> torch.Tensor:
        """Per-token log-probs of the completion under ``model``, computed as TRL computes them (no gradient; in
        chunks of the mode's per-device batch size, l. 2511). With ``group_by_length`` in training, the chunks are
        rows of similar completion length (longest first), each computed at its own width (:meth:`TRLBatch.trimmed`);
        the positions a chunk cuts, after every one of its rows' completion, hold 0."""
        size = self.args.per_device_train_batch_size if self.model.training else self.args.per_device_eval_batch_size
        if not (self.group_by_length and self.model.training):
            return self._chunk_logps(model, batch, size)
        order = batch.longest_first()
        logps = torch.zeros(batch.completion_mask.shape, device=batch.completion_mask.device)
        for start in range(0, len(order), size):
            rows = order[start:start + size]
            chunk = self._chunk_logps(model, batch.select(rows).trimmed(self.pad_to_multiple_of), size)
            logps = logps.to(chunk.dtype)
            logps[rows, :chunk.size(1)] = chunk
        return logps

    def _chunk_logps(self, model: Any, batch: TRLBatch, size: int) -> torch.Tensor:
        with torch.no_grad():
            logps, _, _ = self._get_per_token_logps_and_entropies(
                model, batch.input_ids(), batch.attention_mask(), batch.completion_ids.size(1), batch_size=size,
            )
        return logps

    def reference_logps(self, batch: TRLBatch) -> torch.Tensor:
        """Per-token log-probs of the completion under the reference policy, as TRL computes them (l. 2709-2738):
        TRL's ``ref_model``, or with a PEFT adapter the base model (adapters disabled), or the initial copy of a
        re-trained adapter loaded as ``"ref"``."""
        if self.ref_model is not None:
            return self.policy_logps(self.ref_model, batch)
        from trl.trainer.utils import use_adapter

        model = self.accelerator.unwrap_model(self.model)
        with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
            return self.policy_logps(self.model, batch)

    def count_tokens(self, tokens: int) -> None:
        """Add a round's prompt and completion tokens (all processes) to ``state.num_input_tokens_seen`` in training
        and log it as TRL's ``num_tokens`` (l. 2290-2293)."""
        mode = "train" if self.model.training else "eval"
        if mode == "train":
            self.state.num_input_tokens_seen += tokens
        self._metrics[mode]["num_tokens"] = [self.state.num_input_tokens_seen]

    def take_round_logs(self) -> tuple[dict[str, list[Any]], dict[str, list[float]]]:
        """This process's columns logged during the round (``log_extra``, our multi-turn columns) and the values
        its reward functions logged (``log_metric``), taken (TRL's pending logs are left empty)."""
        columns, metrics = dict(self._pending_extra_logs), dict(self._pending_metrics)
        self._pending_extra_logs.clear()
        self._pending_metrics.clear()
        return columns, metrics

    def log_round_table(self, prompts: list[Any], completions: list[Any], advantages: list[float],
                        columns: dict[str, list[Any]], metrics: dict[str, float],
                        rewards_per_func: torch.Tensor) -> None:
        """Add a round of every process (values already gathered: no collective call here) to TRL's completions
        table (``_logs``: prompt, completion, rewards per function, advantage, the ``log_extra`` columns) and log the
        metrics reward functions logged with ``log_metric`` (averaged over processes), as TRL does at the end of
        ``_generate_and_score_completions`` (l. 2832-2855)."""
        mode = "train" if self.model.training else "eval"
        self._logs["prompt"].extend(prompts)
        self._logs["completion"].extend(completions)
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(advantages)
        for column, values in columns.items():
            self._logs["extra"][column].extend(values)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def end_training(self) -> None:
        """End a run: destroy the process group (``Accelerator.end_training``, which also closes trackers) and free
        the distributed wrapper of the model, which holds the group, while Python is still running.

        Why: gloo's worker threads destroy each finished collective's work object, which can hold Python objects, so
        a worker may need the GIL right after a collective. With ``accelerator.end_training()`` alone the DDP wrapper
        keeps the group and its workers alive until interpreter shutdown; a worker that needs the GIL then aborts
        the process ("terminate called without an active exception") after a successful run. Freeing the wrapper
        while a worker still waits for the GIL would deadlock instead (the group's destructor holds the GIL and waits
        for the worker), so with several processes all ranks first meet at a barrier and the GIL is left free for
        ``settle_seconds``. Call it once, at the end of a script; the trainer cannot train afterwards.
        """
        if self.accelerator.num_processes > 1:
            self.accelerator.wait_for_everyone()
            time.sleep(self.settle_seconds)
        self.accelerator.end_training()
        self.model_wrapped = self.model
        self.accelerator.free_memory()  # drops accelerate's references to the prepared objects, then gc.collect()

    def end(self) -> None:
        """transformers' ``Trainer.end()`` (what TRL's scripts call last), as :meth:`end_training`."""
        self.end_training()

    def add_metrics(self, metrics: dict[str, float]) -> None:
        """Append metrics for the current mode, once each; TRL averages and logs them with its own."""
        logged = self._metrics["train" if self.model.training else "eval"]
        for name, value in metrics.items():
            logged[name].append(value)

    def log_completion_columns(self, columns: dict[str, list[Any]]) -> None:
        """Add columns (one value per completion of this process's round) to TRL's completions table: what TRL
        gives reward functions as ``log_extra``. Call it during the round (the rollout), before TRL gathers it."""
        for name, values in columns.items():
            self._log_completion_extra(name, values)

    # -- TRL's private methods, overridden here and only here ------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        return self.training_batch(inputs).data

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        batch = TRLBatch(inputs)
        if self.group_by_length and self.model.training:
            batch = batch.trimmed(self.pad_to_multiple_of)
        loss = self.loss(model, batch)
        self.after_loss()
        return loss

    def _prepare_inputs(self, generation_batch: Any) -> Any:
        """TRL's, or, with ``reshuffle_each_pass`` or ``group_by_length``, TRL's steps with a new permutation each
        pass (PPO's epochs) or once a round (TRL's), the shuffled rows then ordered by completion length
        (:func:`by_completion_length`) before the split into micro-batches."""
        if not ((self.reshuffle_each_pass or self.group_by_length) and self.model.training):
            return super()._prepare_inputs(generation_batch)
        from trl.trainer.utils import (
            shuffle_sequence_dict,
            split_pixel_values_by_grid,
            split_tensor_dict,
            unsplit_pixel_values_by_grid,
        )

        passes_of = self.args.steps_per_generation
        new_round = self._step % (passes_of * self.num_iterations) == 0 or self._full_generation_batch is None
        if new_round:
            self._full_generation_batch = split_pixel_values_by_grid(self._generate_and_score_completions(generation_batch))
        new_pass = self._step % passes_of == 0 or self._buffered_inputs is None
        if new_round or (new_pass and self.reshuffle_each_pass):  # a new permutation
            rows = shuffle_sequence_dict(self._full_generation_batch)
            if self.group_by_length:
                rows = by_completion_length(rows)
            self._buffered_inputs = [unsplit_pixel_values_by_grid(b) for b in split_tensor_dict(rows, passes_of)]
        return self._buffered_inputs[self._step % passes_of]

    def _clip_grad_norm(self, model: Any) -> Any:
        extra = [p for p in self.extra_parameters() if p.grad is not None]
        if not extra:
            return super()._clip_grad_norm(model)
        params = list(model.parameters()) + extra
        return self.accelerator.clip_grad_norm_(params, self.args.max_grad_norm)


# -- generation ------------------------------------------------------------------------------------------------
def unwrap_for_generation(trainer: Any) -> contextlib.AbstractContextManager[Any]:
    """TRL's public ``unwrap_model_for_generation`` plus FSDP parameter gathering, as its HF generate path does."""
    from trl.models import unwrap_model_for_generation

    @contextlib.contextmanager
    def ctx() -> Iterator[Any]:
        dist = getattr(trainer, "_dist", None)
        summon = dist.summon_full_params(trainer.model_wrapped, recurse=False) if dist else contextlib.nullcontext()
        with unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=getattr(trainer, "generation_kwargs", None),
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model, summon:
            yield model

    return ctx()


def vllm_generate(
    trainer: Any, prompts: list[list[int]], max_tokens: int, sampling_kwargs: dict[str, Any]
) -> tuple[list[list[int]], list[list[float]] | None]:
    """One batched call to TRL's vLLM backend (``trainer.vllm_generation``, colocate or server) with this call's
    ``max_tokens`` and extra ``SamplingParams`` fields, TRL's own settings restored afterwards. Returns the sampled
    ids of each prompt and, when TRL asked vLLM for them, the sampling log-prob of each sampled id.

    Every process must make the same calls (a collective), each with at least one prompt: the rollout engine sends a
    one-token dummy when a process has nothing active. Where TRL gathers the prompts of several processes
    (:func:`_padded_count`), each call is padded to the same count on every process (see there).
    """
    if not prompts:
        raise ValueError("vllm_generate needs at least one prompt on every process: send a one-token dummy prompt "
                         "when this process has nothing to generate (RolloutEngine does)")
    backend = trainer.vllm_generation
    count = _padded_count(backend, len(prompts))
    padded = prompts + [prompts[0][:1]] * (count - len(prompts))
    saved_max, saved_kwargs = backend.max_completion_length, backend.generation_kwargs
    backend.max_completion_length = max_tokens
    backend.generation_kwargs = {**saved_kwargs, **sampling_kwargs}
    try:
        _, completion_ids, logprobs, _ = backend.generate(prompts=padded, images=None, num_generations=1)
    finally:
        backend.max_completion_length, backend.generation_kwargs = saved_max, saved_kwargs
    ids = [list(row) for row in completion_ids[: len(prompts)]]
    return ids, None if logprobs is None else [[lp[0] for lp in row] for row in logprobs[: len(prompts)]]


def vllm_server_client(backend: Any) -> Any:
    """This process's client of TRL's vLLM server (``trainer.vllm_generation`` in server mode): the main process's,
    TRL's own (its communicator pushes the weights), or, on another process, a client of the same server for
    requests only (TRL's ``VLLMClient`` without ``init_communicator``; TRL 1.16 builds one on the main process only)."""
    client = getattr(backend, "vllm_client", None)
    if client is not None:
        return client
    from trl.generation import vllm_generation

    base_url = backend.server_base_url or f"http://{backend.server_host}:{backend.server_port}"
    return vllm_generation.VLLMClient(base_url=base_url, group_port=backend.group_port,
                                      connection_timeout=backend.server_timeout)


def vllm_server_generate(backend: Any, client: Any, prompts: list[list[int]], max_tokens: int,
                         sampling_kwargs: dict[str, Any]) -> tuple[list[list[int]], list[list[float]]]:
    """One request of this process's ``prompts`` to vLLM's server through ``client`` (:func:`vllm_server_client`),
    with the sampling fields TRL 1.16's ``VLLMGeneration.generate`` sends in server mode (read from ``backend``: its
    temperature, top-p, top-k, min-p, repetition penalty, structured-outputs regex, ``generation_kwargs``), this call's
    ``max_tokens`` and ``sampling_kwargs`` (the turn's end) in ``generation_kwargs``, and the sampled ids' log-probs
    (``logprobs=0`` when TRL asked for none). No gather: only this process's prompts, so nothing collective runs (the
    asynchronous rollouts' background thread). Returns the sampled ids and the log-prob of each."""
    output = client.generate(
        prompts=prompts, features=None, n=1, repetition_penalty=backend.repetition_penalty,
        temperature=backend.temperature, top_p=backend.top_p, top_k=backend.top_k,
        min_p=0.0 if backend.min_p is None else backend.min_p, max_tokens=max_tokens,
        logprobs=0 if backend.logprobs is None else backend.logprobs,
        structured_outputs_regex=backend.structured_outputs_regex,
        generation_kwargs={**backend.generation_kwargs, **sampling_kwargs})
    ids = [list(row) for row in output["completion_ids"]]
    return ids, [[lp[0] for lp in row] for row in output["logprobs"]]


def _padded_count(backend: Any, count: int) -> int:
    """How many prompts this process must send so that TRL's ``VLLMGeneration.generate`` hands it back its own
    completions: the largest ``count`` over the processes whose prompts TRL gathers into one request, else ``count``.

    TRL 1.16 (``trl/generation/vllm_generation.py``, ``generate``) gathers the prompts of every process in server mode
    (``gather_object``, one request from the main process, ``broadcast_object_list``) and of the tensor-parallel group
    in colocate mode with ``tensor_parallel_size > 1`` (``all_gather_object`` over ``tp_group``), then gives process
    ``i`` the slice ``[i * len(prompts), (i + 1) * len(prompts))``: right only when every process sent as many
    prompts. A multi-turn rollout sends each turn only the trajectories still active, which differ between
    processes; with unequal counts a process silently gets another process's tokens (or too few).

    Two ways out: slice by the gathered counts, or send equal counts. Slicing by counts means re-implementing TRL's
    ``generate`` for both modes (the gathers, the request, the broadcast, the multimodal branches) and keeping it in
    step with every TRL release; padding keeps TRL's code path as it is. Its cost: per call, each process sends
    ``max - count`` one-token dummy prompts (a copy of its first prompt's first id) whose outputs it drops; vLLM
    decodes them in the same batch as the real ones, at most ``max_tokens`` each. One small all-gather of the counts
    per call, over the same processes as TRL's own gather.
    """
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return count
    if backend.mode == "server":
        group = None  # every process
    elif backend.mode == "colocate" and backend.tensor_parallel_size > 1:
        group = backend.tp_group
    else:
        return count  # colocate without tensor parallelism: each process generates its own prompts
    counts: list[Any] = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(counts, count, group=group)
    return max(counts)


# -- TRL's command-line script -------------------------------------------------------------------------------------
def trl_grpo_script() -> Any:
    """TRL's GRPO script, the module ``trl grpo`` runs (``trl/scripts/grpo.py``): its ``GRPOScriptArguments`` (the
    ``--reward_funcs`` / ``--reward_model_name_or_path`` flags) and ``main(script_args, training_args, model_args,
    dataset_args)``, which builds whatever ``trl.GRPOTrainer`` names when it runs (``trl_agentic.cli``)."""
    from trl.scripts import grpo

    return grpo
