"""The KV cache kept across the turns of a rollout: each turn prefills only the tokens appended since the last one.

Without it, turn ``t`` of a trajectory hands the whole conversation to ``generate`` again, so a rollout of ``T`` turns
of ``n`` new tokens each prefills about ``n T^2 / 2`` tokens (TRL 1.16's tool loop does the same); with it, ``n T``.
vLLM gets the same from its automatic prefix caching; this is the transformers ``generate`` equivalent.

How (:class:`PrefixCache`, used by :class:`~trl_agentic.rollout.generation.HFGenerator` inside a
:meth:`~trl_agentic.rollout.generation.HFGenerator.session`):

- After each ``generate`` call the keys and values of every row (its prompt and its sampled ids up to the first end
  id) are kept (on the model's device, in the tree described under Storage below).
- For the next call each prompt takes the kept sequence sharing its longest common prefix (its own trajectory's last
  turn: the prompt is that turn's ids plus the observation). The key/value of position ``j`` depend only on ids ``0..j``
  (causal attention), so any common prefix is exact, whichever trajectory left it; a rewritten history reuses only
  what it still shares.
- The batch stays left-padded as without the cache: row ``i`` holds its ``p_i`` prompt ids right-aligned in a width
  ``W = max p_i``, and with ``N = max_i (p_i - u_i)`` (``u_i``: ids reusable, at most ``p_i - 1`` so that the last
  prompt id is fed and gives the next token's logits) the first ``W - N`` columns come from the cache and the last
  ``N`` are prefilled. Each row's ids stay contiguous, so position ids (transformers counts them from the attention
  mask) and sliding-window masks (in column space) are those of the uncached batch; a row that could reuse more
  recomputes ``N - (p_i - u_i)`` of its ids, which the batch computes anyway (it is ``N`` wide).
- Cache layers are always full (``DynamicLayer``): a sliding-window layer (Gemma 3) keeps every position so that a
  later turn can reuse them; its mask still sees only the window.

- Rows share prompts: every prompt of a batch begins with the same system prompt and tool schemas (337 of the 360
  ids of a question of the native-tool benchmark), and a GRPO group repeats one prompt ``num_generations`` times.
  Before a call the generator prefills what rows share once (:meth:`PrefixCache.shared_prefixes`: the batch's common
  prefix, then each repeated prompt but its last id) and keeps it, for every row to reuse: for ``B`` rows of ``p``
  ids sharing ``c``, about ``B p - (B - 1) c`` ids are prefilled instead of ``B p`` (vLLM shares such blocks between
  requests only once one request has computed them: not within one batch scheduled together).
- Across calls, any row reuses what any earlier call of the session computed: the agents of a GRPO group whose first
  requests reach the endpoint in different ``generate`` calls, or an engine's chunks, prefill their shared prompt
  once per session (``benchmarks/shared_prompt.py``).

Storage: a radix tree of token ids (SGLang's RadixAttention, Zheng et al. 2024, "SGLang: Efficient Execution of
Structured Language Model Programs", arXiv:2312.07104). Each node holds a run of ids and their keys and values; the
sequences kept are its root-to-node paths, so a position shared by several rows (a 20k-token system prompt and tool
schemas sent by every agent of a round) is held once: ``held_tokens`` is the number of distinct prefixes kept, not
the sum of the rows' lengths, and keeping a row's next turn copies only its new positions. ``max_tokens`` bounds
what is held: the least recently used leaves go first (a node is used whenever a row reuses it, so a prefix is
never evicted before the rows that extend it).

The cache is only valid for the weights that filled it: the generator keeps it inside ``session()`` (one rollout,
weights fixed) and drops it on exit. Log-probs and ids equal those of the re-prefilling path up to floating-point
summation order (``tests/rollout/test_prefix_cache.py``: the same ids, log-probs within 1e-5, every model family).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.generation.utils import GenerateDecoderOnlyOutput

logger = logging.getLogger(__name__)

CACHE_ARGUMENT = "cache" if "cache" in GenerateDecoderOnlyOutput.__dataclass_fields__ else "past_key_values"
"""The name under which ``generate`` takes and returns the cache (transformers 5.24 renamed ``past_key_values``)."""

SUPPORTED_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


def unsupported_reason(model: Any, generation_config: Any) -> str | None:
    """Why the KV cache cannot be kept across turns for this model, or ``None`` when it can: an encoder-decoder, a
    cache other than transformers' dynamic one (``cache_implementation``), or layers that are not attention
    (linear attention, state-space layers keep a state, not one key/value per position)."""
    config = getattr(model, "config", None)
    if config is None:
        return "the model has no config"
    if getattr(config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    implementation = getattr(generation_config, "cache_implementation", None)
    if implementation not in (None, "dynamic"):
        return f"generation_config.cache_implementation={implementation!r} (only the dynamic cache can be extended)"
    text_config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    layer_types = set(getattr(text_config, "layer_types", None) or ())
    if layer_types - SUPPORTED_LAYER_TYPES:
        return f"layers of type {sorted(layer_types - SUPPORTED_LAYER_TYPES)} keep no per-position keys and values"
    return None


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that writes each step's keys and values into buffers of ``capacity`` positions allocated
    once (doubled if ever exceeded), and hands attention views of the filled part. transformers' ``DynamicLayer``
    concatenates, copying the whole layer at every decode step: ``O(context)`` bytes per token, 20 % of a decode step
    of SmolLM2-135M at batch 8 and 800 positions on this project's CPU, and growing with the context."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self._buffers is None or self.keys.data_ptr() != self._buffers[0].data_ptr() \
                or self.keys.shape[-2] != self._length:  # first call, or a DynamicLayer method replaced the tensors
            self._adopt(self.keys if self.keys.numel() else key_states[..., :0, :],
                        self.values if self.values.numel() else value_states[..., :0, :])
        length = self._length + key_states.shape[-2]
        if length > self._buffers[0].shape[-2]:
            self._adopt(self.keys, self.values, room=length)
        keys, values = self._buffers
        keys[..., self._length:length, :] = key_states
        values[..., self._length:length, :] = value_states
        self._length = length
        self.keys, self.values = keys[..., :length, :], values[..., :length, :]
        return self.keys, self.values

    def _adopt(self, keys: torch.Tensor, values: torch.Tensor, room: int = 0) -> None:
        """New buffers holding ``keys``/``values``: ``capacity`` positions, or more for what they hold, or, grown to fit
        ``room``, at least twice what they hold."""
        size = max(self.capacity, keys.shape[-2], room, 2 * keys.shape[-2] if room else 0)
        shape = (*keys.shape[:-2], size, keys.shape[-1])
        self._buffers = (keys.new_empty(shape), values.new_empty(shape))
        self._buffers[0][..., : keys.shape[-2], :] = keys
        self._buffers[1][..., : values.shape[-2], :] = values
        self._length = keys.shape[-2]
        self.keys, self.values = self._buffers[0][..., : self._length, :], self._buffers[1][..., : self._length, :]


def preallocated_cache(capacity: int) -> DynamicCache:
    """A ``DynamicCache`` whose layers are :class:`PreallocatedLayer` of ``capacity`` positions."""
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(PreallocatedLayer, capacity)
    return cache


@dataclass(eq=False)
class _Node:
    """A node of the radix tree: ``ids`` following those of its ancestors, and their keys and values per layer,
    ``[heads, len(ids), head_dim]``; ``children`` keyed by their first id."""

    ids: np.ndarray
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    parent: _Node | None = None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0

    def split(self, at: int) -> None:
        """Keep the first ``at`` ids here and move the rest, with the children, into a new single child. Both halves
        are copied, so that each owns its memory (a view would keep the whole block alive after either is evicted)."""
        tail = _Node(self.ids[at:], [k[:, at:].clone() for k in self.keys], [v[:, at:].clone() for v in self.values],
                     self, self.children, self.last_used)
        for child in tail.children.values():
            child.parent = tail
        self.ids = self.ids[:at]
        self.keys = [k[:, :at].clone() for k in self.keys]
        self.values = [v[:, :at].clone() for v in self.values]
        self.children = {int(tail.ids[0]): tail}


@dataclass
class _Match:
    """The nodes a sequence runs through, from the root (the last possibly in part), and the ids they share."""

    path: list[_Node]
    length: int


@dataclass
class CachedBatch:
    """The inputs of one cached ``generate`` call: ``input_ids``/``attention_mask`` ``(B, W)`` left-padded as
    without a cache, and ``cache`` holding the first ``W - N`` columns."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    cache: DynamicCache
    reused: list[int] = field(default_factory=list)
    prefilled: list[int] = field(default_factory=list)


class PrefixCache:
    """Keys and values kept between ``generate`` calls in a radix tree of token ids, matched to new prompts by
    longest common prefix (module docstring).

    Args:
        max_tokens: Most positions held (the least recently used leaves go first); ``None``: no limit (the distinct
            prefixes of one rollout, dropped when it ends).

    Attributes:
        reused_tokens: Prompt ids taken from the cache, over the calls so far.
        prefilled_tokens: Prompt ids computed (the columns prefilled, padding excluded).
        held_tokens: Positions held now, each once however many kept sequences share it.
        peak_tokens: The most positions held between calls (a call's new positions are held with the rest until it
            returns, so with ``max_tokens`` up to one call's more).
    """

    def __init__(self, max_tokens: int | None = None) -> None:
        self.max_tokens = max_tokens
        self.reused_tokens = 0
        self.prefilled_tokens = 0
        self.peak_tokens = 0
        self.root = _Node(np.zeros(0, dtype=np.int64), [], [])
        self.held_tokens = 0
        self._clock = 0

    def sequences(self) -> list[list[int]]:
        """The sequences kept: the ids of each root-to-leaf path."""
        out, stack = [], [(self.root, np.zeros(0, dtype=np.int64))]
        while stack:
            node, ids = stack.pop()
            ids = np.concatenate([ids, node.ids])
            if not node.children and node is not self.root:
                out.append(ids.tolist())
            stack.extend((child, ids) for child in node.children.values())
        return sorted(out)

    # -- one call ------------------------------------------------------------------------------------------------
    def batch(self, prompts: Sequence[Sequence[int]], pad_id: int, device: Any, max_new_tokens: int) -> CachedBatch:
        """The left-padded batch of ``prompts`` with the cached columns filled in (see the module docstring), in a
        cache with room for ``max_new_tokens`` more positions."""
        self._clock += 1
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        matches = [self._walk(ids, len(ids) - 1, split=True) for ids in arrays]  # the last id is fed: never cached
        for node in (node for match in matches for node in match.path):
            node.last_used = self._clock  # what least recently used means for _evict
        width = max(len(ids) for ids in arrays)
        new = max(len(ids) - match.length for ids, match in zip(arrays, matches))
        cached = width - new
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, ids in enumerate(arrays):
            input_ids[row, width - len(ids):] = torch.from_numpy(ids)
            attention_mask[row, width - len(ids):] = 1
        reused = [max(0, len(ids) - new) for ids in arrays]
        cache = preallocated_cache(width + max_new_tokens)
        if cached > 0:
            for layer in range(len(next(m.path[0] for m in matches if m.path).keys)):
                keys, values = self._layer(matches, reused, layer, cached)
                cache.update(keys.to(device), values.to(device), layer)
        self.reused_tokens += sum(reused)
        prefilled = [len(ids) - k for ids, k in zip(arrays, reused)]
        self.prefilled_tokens += sum(prefilled)
        return CachedBatch(input_ids, attention_mask, cache, reused, prefilled)

    def store(self, prompts: Sequence[Sequence[int]], sequences: torch.Tensor, cache: Any, width: int,
              eos_token_ids: Sequence[int]) -> str | None:
        """Keep each row's keys and values: its prompt and its sampled ids up to the first end id (the rest of the
        row is padding ``generate`` appended after the row ended), copying only the positions the tree does not
        hold yet. Returns why nothing was kept (a cache that is not a dynamic cache of full attention layers), or
        ``None``."""
        layers = getattr(cache, "layers", None)
        if not isinstance(cache, DynamicCache) or not layers or any(
                not getattr(layer, "is_initialized", False) or getattr(layer, "keys", None) is None
                or layer.keys.dim() != 4 for layer in layers):
            return f"generate returned a {type(cache).__name__} whose layers are not all per-position keys and values"
        length = layers[0].keys.shape[-2]
        if any(layer.keys.shape[-2] != length for layer in layers) or length > sequences.shape[1]:
            return "the cache's layers do not hold every position (a sliding or shared cache)"
        eos = np.asarray(list(eos_token_ids), dtype=np.int64)
        generated = sequences[:, width:length].cpu().numpy()
        for row, prompt in enumerate(prompts):
            ends = np.flatnonzero(np.isin(generated[row], eos))
            kept = int(ends[0]) + 1 if ends.size else generated.shape[1]
            ids = np.concatenate([np.asarray(prompt, dtype=np.int64), generated[row, :kept]])
            match = self._walk(ids, len(ids), split=True)  # a row that leaves a node part-way branches there
            if match.length == len(ids):
                continue
            parent = match.path[-1] if match.path else self.root
            start = width - len(prompt) + match.length
            stop = width + kept
            leaf = _Node(ids[match.length:], [layer.keys[row, :, start:stop].clone() for layer in layers],
                         [layer.values[row, :, start:stop].clone() for layer in layers], parent,
                         last_used=self._clock)
            parent.children[int(leaf.ids[0])] = leaf
            self.held_tokens += len(leaf.ids)
        self._evict()
        self.peak_tokens = max(self.peak_tokens, self.held_tokens)
        return None

    def shared_prefixes(self, prompts: Sequence[Sequence[int]], minimum: int = 16) -> list[list[list[int]]]:
        """What the rows of a call share and the cache does not hold yet, to prefill before the call, in order: the
        batch's longest common prefix (capped a token short of the shortest prompt), then every prompt that occurs
        more than once, but its last id (which the call feeds to get the next token's logits). Each is kept only if
        it adds at least ``minimum`` ids to what the cache (and the steps before it) already give."""
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        if len(arrays) < 2:
            return []
        shortest = min(len(ids) for ids in arrays)
        common = np.ones(shortest, dtype=bool)
        for ids in arrays[1:]:
            common &= arrays[0][:shortest] == ids[:shortest]
        differ = np.flatnonzero(~common)
        length = min(int(differ[0]) if differ.size else shortest, shortest - 1)
        stages, covered = [], 0
        head = arrays[0][:length]
        if length - self._walk(head, len(head)).length >= minimum:  # what the cache holds of it
            stages.append([head.tolist()])
            covered = length
        repeated: dict[bytes, np.ndarray] = {}
        seen: set[bytes] = set()
        for ids in arrays:
            key = ids.tobytes()
            if key in seen:
                repeated[key] = ids
            seen.add(key)
        grouped = [ids[:-1].tolist() for ids in repeated.values()
                   if len(ids) - 1 - max(covered, self._walk(ids[:-1], len(ids) - 1).length) >= minimum]
        if grouped:
            stages.append(grouped)
        return stages

    # -- helpers -------------------------------------------------------------------------------------------------
    def _walk(self, ids: np.ndarray, limit: int, split: bool = False) -> _Match:
        """The path of the longest prefix of ``ids`` (at most ``limit`` ids) the tree holds. With ``split``, a match
        that ends part-way through its last node, short of the whole of ``ids``, splits that node there, so that
        every node of the path is used whole (and a row that goes on branches there)."""
        node, length, path = self.root, 0, []
        while length < limit and (child := node.children.get(int(ids[length]))) is not None:
            n = min(len(child.ids), limit - length)
            differ = np.flatnonzero(child.ids[:n] != ids[length:length + n])
            common = int(differ[0]) if differ.size else n
            path.append(child)
            length += common
            if common < len(child.ids):
                if split and length < len(ids):
                    child.split(common)
                break
            node = child
        return _Match(path, length)

    @staticmethod
    def _layer(matches: list[_Match], reused: list[int], layer: int, cached: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's ``(B, heads, cached, head_dim)`` keys and values, each row's reused positions right-aligned."""
        template = next(m.path[0] for m in matches if m.path).keys[layer]
        heads, _, dim = template.shape
        keys = torch.zeros((len(matches), heads, cached, dim), dtype=template.dtype, device=template.device)
        values = torch.zeros_like(keys)
        for row, (match, k) in enumerate(zip(matches, reused)):
            at = cached - k
            for node in match.path:
                n = min(len(node.ids), cached - at)
                if n <= 0:
                    break
                keys[row, :, at:at + n] = node.keys[layer][:, :n]
                values[row, :, at:at + n] = node.values[layer][:, :n]
                at += n
        return keys, values

    def _evict(self) -> None:
        """Drop least recently used leaves until at most ``max_tokens`` positions are held."""
        if self.max_tokens is None:
            return
        while self.held_tokens > self.max_tokens:
            leaves, stack = [], list(self.root.children.values())
            while stack:
                node = stack.pop()
                (stack.extend(node.children.values()) if node.children else leaves.append(node))
            leaf = min(leaves, key=lambda node: node.last_used)
            del leaf.parent.children[int(leaf.ids[0])]
            self.held_tokens -= len(leaf.ids)


