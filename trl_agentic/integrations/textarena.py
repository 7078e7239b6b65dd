"""A single-player TextArena game (``textarena``, the games behind TRL's OpenEnv Wordle example) as an
:class:`~trl_agentic.Environment`, in one line:

    trainer = AgenticGRPOTrainer(..., environment=textarena_environment("GuessTheNumber-v0"),
                                 train_dataset=textarena_dataset(64), reward_funcs=game_reward())

- **One game per trajectory.** ``reset(seed=...)`` makes the game (``textarena.make(game_id)``, with the wrappers its
  id names) and resets it for one player with the row's ``seed``, so that the ``num_generations`` rollouts of a row
  play the same game; the game's first observation is appended to the row's prompt.
- **Each turn** the model's text is the game's action (``env.step(action)``; the game's own wrappers format it), and
  what the game says next is the observation: the new part of its observation (a wrapped game's observation is
  its whole history, so the part already shown is not repeated; a raw game's messages are written ``[GAME] ...``,
  the player's own action left out).
- **The game's own reward.** When the game is done, ``env.close()`` gives its rewards; the player's is the turn's
  reward (``StepResult.reward``) and the episode is ``terminated``; :func:`game_reward` (a
  :class:`~trl_agentic.rewards.TurnReward`) reads it. A game cut by the training's budgets gets no reward (0).
  TextArena 0.7 reports no reward before the game is done (its ``state.rewards`` is ``None`` until a game sets its
  outcome, which ends it): the turns before the last earn 0.
- **The game's state.** Each turn's ``info["state_key"]`` is the game's own record of its state
  (``game.state.game_state``: the board, the guesses so far, the cars' places) as canonical text
  (:func:`~trl_agentic.integrations.state_keys.state_key`), so that GiGPO groups the turns that start from the same
  board however it was reached. A game that keeps no state there (an empty ``game_state``: Countdown, Cryptarithm,
  Slitherlink and ThreeCardMonte keep theirs in attributes of their own) gives no key: its turns are keyed by the
  observation history (``gigpo_state_key``).
- **A game that raises** (in ``make``, ``reset`` or ``step``) ends its own trajectory with ``env_error``. A game that
  cannot be made or reset says so in one line (:func:`_game_failure`): the game's own message, or, for a word game
  whose NLTK data is missing (NLTK's ``LookupError`` is a framed block of lines), the resource and the command that
  fetches it.

TextArena's single-player states seed Python's global ``random`` at each reset (``random.seed(seed)``); resets are
therefore made one at a time (a lock), so that a row's games are the same whichever thread resets them.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any, Callable

from ..environments.base import Environment, StepResult
from .state_keys import state_key

_RESET_LOCK = threading.Lock()
"""Held while a game is made and reset: TextArena seeds Python's global ``random`` there."""
_RESET_LOCK_TIMEOUT_S = 30.0


def _ta() -> Any:
    """``textarena``, or one line saying how to install it."""
    try:
        import textarena
    except ImportError:
        raise ImportError("TextArena games need the textarena package: pip install 'trl-agentic[textarena]'") from None
    return textarena


class TextArenaEnvironment(Environment):
    """One single-player TextArena game per trajectory (module docstring).

    Args:
        game_id: A registered game id (``"GuessTheNumber-v0"``; ``"-raw"`` ids are the game without its wrappers).
        make: Instead of ``textarena.make(game_id)``, a zero-argument function that returns the game (a game class
            of your own, or a wrapped one).
        game_kwargs: Keyword arguments of ``textarena.make``.
    """

    def __init__(self, game_id: str | None = None, make: Callable[[], Any] | None = None, **game_kwargs: Any) -> None:
        if (game_id is None) == (make is None):
            raise ValueError("TextArenaEnvironment takes a game id (e.g. 'GuessTheNumber-v0') or make=, one of them")
        self.game_id, self.make, self.game_kwargs = game_id, make, game_kwargs
        self.game: Any = None
        self._shown = ""

    def _make(self) -> Any:
        return self.make() if self.make is not None else _ta().make(self.game_id, **self.game_kwargs)

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Make and reset the game for one player with the row's ``seed``; its first observation."""
        if not _RESET_LOCK.acquire(timeout=_RESET_LOCK_TIMEOUT_S):
            raise TimeoutError(f"another game's reset held TextArena's seeding lock for {_RESET_LOCK_TIMEOUT_S:g} s")
        try:
            stage = "made"
            self.game = self._make()
            stage = "reset for one player"
            self.game.reset(num_players=1, seed=seed)
        except Exception as exc:
            raise _game_failure(self.game_id or getattr(self.make, "__name__", "the game"), stage, exc) from exc
        finally:
            _RESET_LOCK.release()
        self._shown = ""
        return self._observe()

    def step(self, action: str) -> StepResult:
        """The game's step on the turn's text; the game's next message and the key of its state, and its reward when
        it is done."""
        done, info = self.game.step(action)
        observation = self._observe()
        key = self._game_state_key()
        keyed = {} if key is None else {"state_key": key}
        if not done:
            return StepResult(observation or None, info={"textarena": dict(info or {}), **keyed})
        rewards, game_info = self.game.close()
        self.game = None
        player = (game_info or {}).get(0, {})
        reward = float((rewards or {}).get(0, 0.0))
        player_info = {k: v for k, v in player.items() if isinstance(v, (str, int, float))}
        return StepResult(observation or None, reward=reward, terminated=True,
                          info={"textarena": player_info, **keyed})

    def _game_state_key(self) -> str | None:
        """The key of the game's state (module docstring), ``None`` when its ``game_state`` is empty or holds a
        value without a stable text."""
        game_state = getattr(getattr(self.game, "state", None), "game_state", None)
        return state_key(game_state) if isinstance(game_state, Mapping) and game_state else None

    def close(self) -> None:
        game, self.game = self.game, None
        if game is not None:
            game.close()

    def _observe(self) -> str:
        """What the game says that the model has not seen yet."""
        _, observation = self.game.get_observation()
        if isinstance(observation, str):
            text = observation[len(self._shown):] if observation.startswith(self._shown) else observation
            self._shown = observation
            return text.strip("\n")
        return "\n".join(f"[GAME] {message}" if sender < 0 else f"[Player {sender}] {message}"
                         for sender, message, kind in observation or [] if getattr(kind, "name", "") != "PLAYER_ACTION")


def textarena_environment(game_id: str, **game_kwargs: Any) -> Callable[[], TextArenaEnvironment]:
    """``environment=`` for a TextArena game: a factory of :class:`TextArenaEnvironment`. The game is made and reset
    once here, so that an unknown id or a game for several players is refused before training, in one line.

    Raises:
        ValueError: ``game_id`` is not registered, the game needs more than one player, or it cannot be made or reset
            (:func:`_game_failure`), in one line.
    """
    ta = _ta()
    from textarena.envs.registration import ENV_REGISTRY

    if not isinstance(game_id, str) or game_id not in ENV_REGISTRY:
        raise ValueError(f"{game_id!r} is not a registered TextArena game id; pass one such as 'GuessTheNumber-v0' "
                         "(textarena.envs.registration.ENV_REGISTRY lists them)")
    try:
        game = ta.make(game_id, **game_kwargs)
    except Exception as exc:
        raise _game_failure(game_id, "made", exc) from None
    try:
        with _RESET_LOCK:
            game.reset(num_players=1, seed=0)
    except AssertionError as exc:
        raise ValueError(f"{game_id} is not a single-player game ({exc}); only single-player games train here") \
            from None
    except Exception as exc:
        raise _game_failure(game_id, "reset for one player", exc) from None
    return functools.partial(TextArenaEnvironment, game_id, **game_kwargs)


_NLTK_PACKAGE = re.compile(r"nltk\.download\('([^']+)'\)")
_NLTK_RESOURCE = re.compile(r"Attempted to load '([^'/]+)/")


def _game_failure(game_id: str, stage: str, exc: Exception) -> ValueError:
    """The error of a game that could not be ``stage`` (``"made"``, ``"reset for one player"``), in one line. NLTK's
    ``LookupError`` (a framed block that shows ``nltk.download('<package>')``) becomes the package, the folder it
    fills and the command that fetches it; any other error is quoted by its type and first line."""
    text = str(exc)
    package = _NLTK_PACKAGE.search(text) if isinstance(exc, LookupError) else None
    if package is not None:
        name = package.group(1)
        kind = _NLTK_RESOURCE.search(text)
        folder = f"{kind.group(1)}/{name}" if kind is not None else name
        return ValueError(f"{game_id} needs NLTK's {name!r} data, which is not installed: run `python -m "
                          f"nltk.downloader {name}` (or set NLTK_DATA to a folder that holds {folder})")
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    detail = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return ValueError(f"{game_id} could not be {stage}: {detail}")


def textarena_dataset(num_games: int, seed: int = 0, prompt: str = "") -> Any:
    """``num_games`` rows, each a game seed (``seed``, ``seed + 1``, ...) and a user message ``prompt`` that the game's
    first observation is appended to; a ``datasets.Dataset``."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": prompt}]] * num_games,
                              "seed": list(range(seed, seed + num_games))})


def game_reward() -> Any:
    """The game's own reward (the player's, given when the game is done): the trajectory's turn rewards summed, as
    ``textarena_reward`` in the logs. The last turn's reward already holds it: with ``gigpo=True`` pass
    ``gigpo_step_rewards="turns"``, so that GiGPO's step returns count it once (``docs/credit.md``)."""
    from ..rewards.turns import TurnReward

    return TurnReward("sum", name="textarena_reward")


__all__ = ["TextArenaEnvironment", "game_reward", "textarena_dataset", "textarena_environment"]
