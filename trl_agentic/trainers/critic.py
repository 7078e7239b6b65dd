"""The critic of PPO: a scalar value head over a causal LM's decoder.

Two layouts:
    - :class:`ValueModel`: a separate value model (its own decoder, optionally with its own LoRA, and a head), as in
      RLHF PPO (Ouyang et al. 2022) and Search-R1 (Jin et al. 2025, arXiv 2503.09516). Costs a second copy of the
      weights; the critic never interferes with the policy.
    - :class:`SharedValueHead`: a head over the policy's own decoder, to fit one GPU. Either the policy's hidden
      states feed the head (shared actor-critic: the value loss also trains the policy's weights unless the caller
      detaches them), or, with a PEFT policy, the critic runs the shared base weights under a LoRA adapter of its
      own, so that only the base weights are shared and the two losses train disjoint parameters.

Alignment of the values: ``values[:, i]`` for a completion token ``i`` is the head applied to the hidden state of
the position *before* it, i.e. the value of the state in which token ``i`` is sampled. With ``completion_length=n``
the forward returns the values of the last ``n`` tokens in that alignment (hidden states ``[-n-1:-1]``, the same
slice TRL takes of the logits), which is what :mod:`trl_agentic.algorithms.gae` expects.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel, get_peft_model
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import AutoModel, PreTrainedModel, TrainerCallback

from ..rollout.generation import gradient_checkpointing_off

VALUE_HEAD_FILE = "value_head.safetensors"


def _transformers_model(model: nn.Module) -> PreTrainedModel:
    """The transformers model under a PEFT wrapper (the model itself otherwise)."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def _decoder(model: nn.Module) -> nn.Module:
    """The decoder without its LM head (``Qwen2Model`` for ``Qwen2ForCausalLM``); LoRA layers injected by PEFT stay
    in place, so calling it runs the active adapter."""
    return _transformers_model(model).base_model


def _new_value_head(hidden_size: int) -> nn.Linear:
    """``Linear(hidden, 1)`` in float32 with zero weight and bias: the untrained critic predicts ``V = 0`` in every
    state, a constant baseline (explained variance 0), whatever the scale of the hidden states.

    The reward-head init of Ziegler et al. 2019 (arXiv 1909.08593), weights ~ N(0, 1/(hidden+1)), gives values
    ~ N(0, rms(h)^2), unit-scale only on unit-scale hidden states. Gemma-3-270M's last hidden states have an RMS of
    2 to 5 per token, so its first values swung by up to 10 between neighbouring tokens against returns in [0, 1]
    (value loss 8.7 and explained variance -30 at the first PPO step, docs/benchmarks.md). From zero the head
    still learns at once, ``dL/dw = (V - R) h``; the decoder (or the critic's adapter) gets its gradient, which
    flows through ``w``, from the second optimizer step on.
    """
    head = nn.Linear(hidden_size, 1, dtype=torch.float32)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def _hidden_size(model: nn.Module) -> int:
    return _transformers_model(model).config.get_text_config().hidden_size


def _apply_head(head: nn.Linear, hidden_states: torch.Tensor, completion_length: int | None) -> torch.Tensor:
    if completion_length is not None:
        hidden_states = hidden_states[:, hidden_states.shape[1] - completion_length - 1 : -1]
    return head(hidden_states.to(head.weight.dtype)).squeeze(-1).float()


def _save_head(head: nn.Linear, directory: str | os.PathLike, metadata: dict[str, str]) -> None:
    Path(directory).mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in head.state_dict().items()}
    save_file(tensors, str(Path(directory) / VALUE_HEAD_FILE), metadata=metadata)


def _load_head(directory: str | os.PathLike) -> tuple[nn.Linear, dict[str, str]]:
    path = str(Path(directory) / VALUE_HEAD_FILE)
    state = load_file(path)
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
    head = nn.Linear(state["weight"].shape[1], 1, dtype=state["weight"].dtype)
    head.load_state_dict(state)
    return head, metadata


class ValueModel(nn.Module):
    """A separate critic: decoder (optionally LoRA-wrapped) + ``Linear(hidden, 1)`` head.

    Build it with :meth:`from_policy` (from the policy's checkpoint path or a copy of the policy's weights), persist
    it with :meth:`save_pretrained` / :meth:`from_pretrained`.

    Args:
        backbone: A decoder returning ``last_hidden_state`` (``AutoModel``, i.e. the causal LM without its head),
            possibly a :class:`peft.PeftModel` around it.
        head: The value head; a fresh one when None.
    """

    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        if head is None:
            head = _new_value_head(_hidden_size(backbone))
        self.head = head.to(next(backbone.parameters()).device)

    @classmethod
    def from_policy(
        cls,
        policy: str | os.PathLike | PreTrainedModel | PeftModel,
        peft_config: PeftConfig | None = None,
        **from_pretrained_kwargs,
    ) -> ValueModel:
        """A value model initialised from the policy's weights, with a fresh head.

        Args:
            policy: A checkpoint path of the policy (loaded with ``AutoModel.from_pretrained``, which drops the LM
                head), or the policy model itself: its decoder is deep-copied (a PEFT policy is copied and merged
                first, so the critic starts from the policy's current weights and shares nothing with it).
            peft_config: Optional LoRA (or other PEFT) config for the critic's own adapter, with ``task_type`` None
                or ``"FEATURE_EXTRACTION"``; the base weights are then frozen and the adapter and head train.
                Without it the whole critic trains.
            **from_pretrained_kwargs: Passed to ``AutoModel.from_pretrained`` (``dtype``, ...) for a path.
        """
        if isinstance(policy, (str, os.PathLike)):
            backbone = AutoModel.from_pretrained(policy, **from_pretrained_kwargs)
        elif isinstance(policy, PeftModel):
            backbone = copy.deepcopy(policy).merge_and_unload().base_model
        else:
            backbone = copy.deepcopy(policy.base_model)
        backbone.requires_grad_(True)  # a copy of a PEFT policy's base comes frozen
        if peft_config is not None:
            backbone = get_peft_model(backbone, peft_config)
        return cls(backbone)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        completion_length: int | None = None,
    ) -> torch.Tensor:
        """Values, float32: (B, L) for every position (the value after reading tokens ``0..j``), or (B, n) for the
        last ``n = completion_length`` tokens (the value of the state before each of them, see the module
        docstring)."""
        hidden_states = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return _apply_head(self.head, hidden_states, completion_length)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write the backbone (``save_pretrained``: full weights, or only the adapter for a PEFT backbone) and the
        head (``value_head.safetensors``) to ``save_directory``."""
        self.backbone.save_pretrained(save_directory)
        _save_head(self.head, save_directory, metadata={})

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        is_trainable: bool = True,
        base_model_name_or_path: str | os.PathLike | None = None,
        **from_pretrained_kwargs,
    ) -> ValueModel:
        """Load what :meth:`save_pretrained` wrote.

        A directory with an ``adapter_config.json`` holds a PEFT backbone: its base decoder is loaded from
        ``base_model_name_or_path`` (default: the one recorded in the adapter config) and the adapter on top,
        trainable when ``is_trainable``.
        """
        if (Path(path) / "adapter_config.json").exists():
            base = base_model_name_or_path or PeftConfig.from_pretrained(path).base_model_name_or_path
            backbone = AutoModel.from_pretrained(base, **from_pretrained_kwargs)
            backbone = PeftModel.from_pretrained(backbone, path, is_trainable=is_trainable)
        else:
            backbone = AutoModel.from_pretrained(path, **from_pretrained_kwargs)
        head, _ = _load_head(path)
        return cls(backbone, head)


class SharedValueHead(nn.Module):
    """A value head over the policy's own decoder (no second copy of the weights).

    The policy is referenced, not registered: ``parameters()`` / ``state_dict()`` of this module hold the head only.
    :meth:`critic_parameters` adds the critic adapter's parameters for the critic's optimizer param group.

    Two uses:
        - Head only (``adapter_config=None``): :meth:`forward` runs the policy's decoder and the head. The value loss
          then trains the policy's trainable weights too (shared actor-critic), unless ``detach_backbone``.
        - Critic adapter (PEFT policy, ``adapter_config`` given): the adapter ``adapter_name`` is added to the
          policy, and :meth:`forward` runs the decoder with it active (a second forward over the same base weights),
          then switches back to the policy's adapter. Policy and critic adapters are both left trainable
          (``requires_grad=True``): when one optimizer covers the policy, put :meth:`critic_parameters` in their own
          group (critic learning rate) and the rest in the policy's. The critic pass never uses gradient checkpointing
          (a recomputation in backward would run the policy's adapter): it keeps its activations, while the policy's
          own passes stay checkpointed. The policy must be the unwrapped model (not DDP/DeepSpeed-wrapped) when
          :meth:`forward` runs.

    Args:
        policy: The policy, a transformers causal LM or a :class:`peft.PeftModel` around one (unwrapped).
        adapter_config: LoRA (or other PEFT) config of the critic's own adapter; requires a PEFT policy.
        adapter_name: Name of the critic adapter.
        detach_backbone: Without a critic adapter, run the decoder without gradient in :meth:`forward`, so that
            the value loss trains the head alone. By default (False) it also trains the policy's weights (a shared
            trunk, as in TRL's former ``AutoModelForCausalLMWithValueHead``).
    """

    def __init__(
        self,
        policy: PreTrainedModel | PeftModel,
        adapter_config: PeftConfig | None = None,
        adapter_name: str = "critic",
        detach_backbone: bool = False,
    ):
        super().__init__()
        self._policy = (policy,)  # a tuple hides the policy from nn.Module registration
        self.detach_backbone = detach_backbone
        self.adapter_name: str | None = None
        self.head = _new_value_head(_hidden_size(policy)).to(next(policy.parameters()).device)
        if adapter_config is not None:
            self._add_adapter(adapter_name, adapter_config)

    @property
    def policy(self) -> PreTrainedModel | PeftModel:
        return self._policy[0]

    def _add_adapter(self, adapter_name: str, adapter_config: PeftConfig | None) -> None:
        """Add (``adapter_config`` given) or adopt (already loaded) the critic adapter, and make it trainable."""
        if not isinstance(self.policy, PeftModel):
            raise TypeError("a critic adapter needs a PEFT policy (peft.PeftModel); got " + type(self.policy).__name__)
        if adapter_config is not None:
            self.policy.add_adapter(adapter_name, adapter_config)
        self.adapter_name = adapter_name
        for parameter in self._adapter_parameters():
            parameter.requires_grad_(True)

    def _adapter_parameters(self) -> list[nn.Parameter]:
        tag = f".{self.adapter_name}."
        return [p for name, p in self.policy.named_parameters() if tag in name]

    def critic_parameters(self) -> list[nn.Parameter]:
        """The parameters the value loss should update: the head, plus the critic adapter's when there is one."""
        return list(self.head.parameters()) + (self._adapter_parameters() if self.adapter_name else [])

    @contextmanager
    def _critic_adapter_active(self) -> Iterator[None]:
        if self.adapter_name is None:
            yield
            return
        previous = self.policy.active_adapter
        # PEFT's set_adapter freezes inactive adapters; a gradient reaches a parameter only if it still requires
        # grad at backward time, so every flag is restored on the way out.
        flags = [(p, p.requires_grad) for p in self.policy.parameters()]
        self.policy.set_adapter(self.adapter_name)
        try:
            # Gradient checkpointing would recompute this forward during backward, with whichever adapter is active
            # then (the policy's): the critic pass keeps its activations instead.
            with gradient_checkpointing_off(self.policy):
                yield
        finally:
            self.policy.set_adapter(previous)
            for parameter, requires_grad in flags:
                parameter.requires_grad_(requires_grad)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        completion_length: int | None = None,
    ) -> torch.Tensor:
        """Values (float32) from a pass of the policy's decoder (no LM head), under the critic adapter if any:
        (B, L), or (B, n) for the last ``n = completion_length`` tokens."""
        no_grad = self.detach_backbone and self.adapter_name is None
        with self._critic_adapter_active(), torch.set_grad_enabled(torch.is_grad_enabled() and not no_grad):
            hidden_states = _decoder(self.policy)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return _apply_head(self.head, hidden_states, completion_length)

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write the head (``value_head.safetensors``) and, with a critic adapter, that adapter alone (PEFT writes
        it to ``save_directory/<adapter_name>``)."""
        metadata = {"adapter_name": self.adapter_name} if self.adapter_name else {}
        _save_head(self.head, save_directory, metadata)
        if self.adapter_name:
            self.policy.save_pretrained(save_directory, selected_adapters=[self.adapter_name])

    @classmethod
    def from_pretrained(cls, policy: PreTrainedModel | PeftModel, path: str | os.PathLike) -> SharedValueHead:
        """Attach a saved head (and its critic adapter, loaded into the PEFT policy as trainable) to ``policy``."""
        head, metadata = _load_head(path)
        shared = cls(policy)
        shared.head = head.to(shared.head.weight.device)
        adapter_name = metadata.get("adapter_name")
        if adapter_name:
            policy.load_adapter(str(Path(path) / adapter_name), adapter_name=adapter_name, is_trainable=True)
            shared._add_adapter(adapter_name, None)
        return shared


class CriticGradients(TrainerCallback):
    """The Trainer's gradient plumbing for a critic's parameters outside the policy model (a separate critic, a
    shared head), which the Trainer does not own: DDP does not average their gradients and ``model.zero_grad()`` does
    not clear them (without it they would add up over steps). Clipping them together with the model's is the
    trainer's (``GRPOTrainerBoundary.extra_parameters``).

    Args:
        parameters: Returns the parameters to look after.
    """

    def __init__(self, parameters: Callable[[], list[nn.Parameter]]) -> None:
        self.parameters = parameters

    def average_over_processes(self, accelerator) -> None:
        """Average the gradients over processes; call after the last micro-batch of an optimizer step."""
        if accelerator.num_processes == 1:
            return
        for parameter in self.parameters():
            if parameter.grad is not None:
                parameter.grad = accelerator.reduce(parameter.grad, reduction="mean")

    def on_step_end(self, args, state, control, **kwargs) -> None:
        """Clear the gradients after each optimizer step, as the Trainer clears the model's."""
        for parameter in self.parameters():
            parameter.grad = None
