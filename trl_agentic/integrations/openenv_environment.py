"""The base of TRL's ``environment_factory`` class around an OpenEnv client: it keeps what the client's calls return,
so that each turn carries the environment's reward and the key of the state it led to (``docs/credit.md``).

    class GuessGame(OpenEnvEnvironment):
        def __init__(self):
            self.client = GuessEnv(base_url=servers.url()).sync()  # as TRL's OpenEnv docs open it

        def reset(self, seed, **kwargs) -> str:
            return self._reset(seed=seed).observation.message

        def guess(self, number: int) -> str:
            '''Guess the number. (and its Args:)'''
            return self._step(GuessAction(number=number)).observation.message

- ``_reset(**kwargs)`` and ``_step(action)`` call ``self.client``'s ``reset`` and ``step`` (the synchronous client,
  ``EnvClient(...).sync()``) and return its ``StepResult``, kept as :attr:`OpenEnvEnvironment.result`;
  :attr:`~OpenEnvEnvironment.episode_reward` sums the rewards of the steps since the reset (a reward function may
  return it).
- ``_turn_reward()``, called by our engine after each turn: the rewards of the turn's steps (its tool calls), summed;
  0 for a turn that called none.
- ``_state_key()``, called after it: the key of the observation the last call returned, its fields but ``reward``
  (the reward belongs to the step, not to the state it led to) as canonical text
  (:func:`~trl_agentic.integrations.state_keys.state_key`): two turns that led to equal observations start the next
  turn from the same state for GiGPO, however they got there. A subclass may return a key of its own, or ``None``
  for the observation history (``gigpo_state_key``). OpenEnv's ``state()`` is not read: its ``episode_id`` differs
  in every episode, its ``step_count`` on every path, and it costs a request per turn.

Every name the class adds starts with ``_`` (or is an attribute): TRL 1.16 shows the model a class's other public
methods as its tools and never calls these, so the subclass trains in TRL's own ``GRPOTrainer`` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .state_keys import state_key


class OpenEnvEnvironment:
    """The base of a TRL ``environment_factory`` class around an OpenEnv client (module docstring). The subclass
    opens the client as ``self.client``, defines ``reset`` and its tools, and calls :meth:`_reset` / :meth:`_step`.

    Attributes:
        client: The environment's synchronous client (``EnvClient(...).sync()``), opened by the subclass.
        result: The ``StepResult`` the client's last ``reset`` or ``step`` returned (``None`` before the first).
        episode_reward: The rewards of the steps since the last reset, summed.
    """

    client: Any
    result: Any = None
    episode_reward: float = 0.0
    _pending_reward: float = 0.0

    def _reset(self, **kwargs: Any) -> Any:
        """``self.client.reset(**kwargs)``, kept; the episode's and the turn's rewards start at 0."""
        self.result = self.client.reset(**kwargs)
        self.episode_reward = self._pending_reward = 0.0
        return self.result

    def _step(self, action: Any) -> Any:
        """``self.client.step(action)``, kept; its reward (``None``: 0) added to the episode's and the turn's."""
        self.result = self.client.step(action)
        reward = float(self.result.reward or 0.0)
        self.episode_reward += reward
        self._pending_reward += reward
        return self.result

    def _turn_reward(self) -> float:
        """The rewards of the steps since the last call (the turn's tool calls), summed."""
        reward, self._pending_reward = self._pending_reward, 0.0
        return reward

    def _state_key(self) -> str | None:
        """The key of the last observation, its fields but ``reward`` (module docstring); ``None`` before a reset."""
        return None if self.result is None else observation_key(self.result.observation)


def observation_key(observation: Any) -> str | None:
    """The key of an OpenEnv observation (a pydantic ``Observation``, or its fields): its fields but ``reward`` (the
    reward belongs to the step, not to the state it led to) as canonical text
    (:func:`~trl_agentic.integrations.state_keys.state_key`); ``None`` when a field has no stable text."""
    fields = observation.model_dump() if callable(getattr(observation, "model_dump", None)) else observation
    if isinstance(fields, Mapping):
        fields = {name: value for name, value in fields.items() if name != "reward"}
    return state_key(fields)


__all__ = ["OpenEnvEnvironment", "observation_key"]
