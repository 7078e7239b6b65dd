"""A TextArena game (``textarena``, the games behind TRL's OpenEnv Wordle example) as an environment, in one line:

    trainer = AgenticGRPOTrainer(..., environment=textarena_environment("GuessTheNumber-v0"),
                                 train_dataset=textarena_dataset(64), reward_funcs=game_reward())

A game of several players (TicTacToe, Kuhn Poker, Simple Negotiation) is played by seats ``"Player 0"``,
``"Player 1"``, ...; ``players=`` says who plays each and the result is a
:class:`~trl_agentic.rollout.seats.Seats` (:class:`TextArenaGame`, below):

    environment=textarena_environment("TicTacToe-v0", players={"Player 0": "policy", "Player 1": "policy"})

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

**Several players** (:class:`TextArenaGame`, a :class:`~trl_agentic.environments.seats.SeatedEnvironment`): the game
is reset for its number of players with the row's seed; whose turn it is and what that player sees come from the
game's own ``get_observation()`` (each seat is shown what is new to it: the other players' moves, the game's
messages; a raw game's messages of other players are written ``[Player k] ...``), the text of the seat to act is the
game's ``step``, and when the game is done ``env.close()`` gives every player's reward, each added to that seat's last
turn (TicTacToe: ``{"Player 0": 1, "Player 1": -1}``). An invalid move is the game's business: TextArena asks the
same player again (its error allowance), then ends the game.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Mapping
from typing import Any, Callable

from ..environments.base import Environment, StepResult
from ..environments.seats import SeatedEnvironment, SeatTurn
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

    def reset(self, seed: int | None = None, **row: Any) -> str:
        """Make and reset the game for one player with the row's ``seed``; its first observation."""
        self.game = _new_game(self.game_id, self.make, self.game_kwargs, 1, seed)
        self._shown = ""
        return self._observe()

    def step(self, action: str) -> StepResult:
        """The game's step on the turn's text; the game's next message and the key of its state, and its reward when
        it is done."""
        done, info = self.game.step(action)
        observation = self._observe()
        keyed = _keyed(self.game)
        if not done:
            return StepResult(observation or None, info={"textarena": dict(info or {}), **keyed})
        rewards, game_info = self.game.close()
        self.game = None
        player = (game_info or {}).get(0, {})
        reward = float((rewards or {}).get(0, 0.0))
        player_info = {k: v for k, v in player.items() if isinstance(v, (str, int, float))}
        return StepResult(observation or None, reward=reward, terminated=True,
                          info={"textarena": player_info, **keyed})

    def close(self) -> None:
        game, self.game = self.game, None
        if game is not None:
            game.close()

    def _observe(self) -> str:
        """What the game says that the model has not seen yet."""
        player, observation = self.game.get_observation()
        text, self._shown = _new_text(observation, self._shown, player)
        return text


class TextArenaGame(SeatedEnvironment):
    """One TextArena game of several players per game of a :class:`~trl_agentic.rollout.seats.Seats` (module
    docstring): seats ``"Player 0"``, ``"Player 1"``, ...

    Args:
        game_id: A registered game id (``"TicTacToe-v0"``; ``"-raw"`` ids are the game without its wrappers).
        make: Instead of ``textarena.make(game_id)``, a zero-argument function that returns the game.
        num_players: How many players the game is reset for.
        game_kwargs: Keyword arguments of ``textarena.make``.
    """

    def __init__(self, game_id: str | None = None, make: Callable[[], Any] | None = None, num_players: int = 2,
                 **game_kwargs: Any) -> None:
        if (game_id is None) == (make is None):
            raise ValueError("TextArenaGame takes a game id (e.g. 'TicTacToe-v0') or make=, one of them")
        self.game_id, self.make, self.game_kwargs = game_id, make, game_kwargs
        self.seats = tuple(seat_name(i) for i in range(num_players))
        self.game: Any = None
        self._shown: dict[int, str] = {}

    def reset(self, seed: int | None = None, **row: Any) -> SeatTurn:
        """Make and reset the game for its players with the row's ``seed``; who opens and what it sees."""
        self.game = _new_game(self.game_id, self.make, self.game_kwargs, len(self.seats), seed)
        self._shown = {}
        return self._turn()

    def step(self, action: str) -> SeatTurn:
        """The game's step on the text of the seat to act; the next seat and what it sees, with the key of the game's
        state; every player's reward when the game is done."""
        done, info = self.game.step(action)
        if not done:
            return self._turn({"textarena": dict(info or {}), **_keyed(self.game)})
        keyed = _keyed(self.game)
        rewards, game_info = self.game.close()
        self.game = None
        return SeatTurn(None, rewards={seat_name(int(p)): float(r) for p, r in (rewards or {}).items()},
                        info={"textarena": _plain(game_info), **keyed})

    def close(self) -> None:
        game, self.game = self.game, None
        if game is not None:
            game.close()

    def _turn(self, info: dict[str, Any] | None = None) -> SeatTurn:
        player, observation = self.game.get_observation()
        text, self._shown[player] = _new_text(observation, self._shown.get(player, ""), player)
        return SeatTurn(seat_name(player), text or None, info=info or {})


def seat_name(player: int) -> str:
    """TextArena's name of a player's role: ``"Player 0"``, ``"Player 1"``, ..."""
    return f"Player {player}"


def _new_game(game_id: str | None, make: Callable[[], Any] | None, game_kwargs: dict[str, Any], num_players: int,
              seed: int | None) -> Any:
    """The game made and reset for ``num_players`` with ``seed``, under the seeding lock (module docstring); a game
    that cannot be said in one line (:func:`_game_failure`)."""
    if not _RESET_LOCK.acquire(timeout=_RESET_LOCK_TIMEOUT_S):
        raise TimeoutError(f"another game's reset held TextArena's seeding lock for {_RESET_LOCK_TIMEOUT_S:g} s")
    try:
        stage = "made"
        game = make() if make is not None else _ta().make(game_id, **game_kwargs)
        stage = _reset_stage(num_players)
        game.reset(num_players=num_players, seed=seed)
        return game
    except Exception as exc:
        raise _game_failure(game_id or getattr(make, "__name__", "the game"), stage, exc) from exc
    finally:
        _RESET_LOCK.release()


def _reset_stage(num_players: int) -> str:
    return "reset for one player" if num_players == 1 else f"reset for {num_players} players"


def _new_text(observation: Any, shown: str, player: int) -> tuple[str, str]:
    """What ``player`` has not seen yet of its ``observation``, and what it has seen after it: a wrapped game's
    observation is the player's whole history as one string (the part ``shown`` already is left out); a raw game's is
    its new messages, written ``[GAME] ...`` and ``[Player k] ...`` (the player's own moves left out)."""
    if isinstance(observation, str):
        text = observation[len(shown):] if observation.startswith(shown) else observation
        return text.strip("\n"), observation
    text = "\n".join(f"[GAME] {message}" if sender < 0 else f"[Player {sender}] {message}"
                     for sender, message, kind in observation or []
                     if not (sender == player and getattr(kind, "name", "") == "PLAYER_ACTION"))
    return text, shown


def _keyed(game: Any) -> dict[str, str]:
    """``{"state_key": ...}``: the key of the game's state (module docstring), or ``{}`` when its ``game_state`` is
    empty or holds a value without a stable text."""
    game_state = getattr(getattr(game, "state", None), "game_state", None)
    key = state_key(game_state) if isinstance(game_state, Mapping) and game_state else None
    return {} if key is None else {"state_key": key}


def _plain(game_info: Any) -> dict[str, Any]:
    """The game's per-player info as plain values, keyed by seat."""
    return {seat_name(int(p)): {k: v for k, v in (values or {}).items() if isinstance(v, (str, int, float))}
            for p, values in (game_info or {}).items()}


def textarena_environment(game_id: str, players: Mapping[str, Any] | None = None, trained: Any = None,
                          **game_kwargs: Any) -> Any:
    """``environment=`` for a TextArena game: a factory of :class:`TextArenaEnvironment` for a single-player game;
    with ``players`` (a game of several players), a :class:`~trl_agentic.rollout.seats.Seats` of
    :class:`TextArenaGame`, ``players`` mapping each seat (``"Player 0"``, ``"Player 1"``, ...) to ``"policy"``,
    ``FrozenCopy()``, ``ModelPlayer(...)`` or ``ScriptedPlayer(fn)`` and ``trained`` the seats that train (default:
    the policy's). The game is made and reset once here, so that an unknown id, a game for several players without
    ``players`` (or with the wrong number of them) is refused before training, in one line.

    Raises:
        ValueError: ``game_id`` is not registered, the game needs other players than given, or it cannot be made or
            reset (:func:`_game_failure`), in one line.
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
    count = len(players) if players is not None else 1
    if players is not None and sorted(players) != [seat_name(i) for i in range(count)]:
        raise ValueError(f"TextArena's seats are {', '.join(repr(seat_name(i)) for i in range(count))}: name them so "
                         f"in players=, got {', '.join(map(repr, players))}")
    try:
        with _RESET_LOCK:
            game.reset(num_players=count, seed=0)
    except AssertionError as exc:
        if players is None:
            raise ValueError(f"{game_id} is a game of several players ({exc}): say who plays each seat, e.g. "
                             "players={'Player 0': 'policy', 'Player 1': 'policy'} (self-play), or FrozenCopy(), "
                             "ModelPlayer(...) or ScriptedPlayer(fn) for a fixed opponent") from None
        raise ValueError(f"{game_id} cannot be played by {count} players ({exc}): give players= one player per "
                         "seat it has") from None
    except Exception as exc:
        raise _game_failure(game_id, _reset_stage(count), exc) from None
    if players is None:
        return functools.partial(TextArenaEnvironment, game_id, **game_kwargs)
    from ..rollout.seats import Seats

    return Seats(functools.partial(TextArenaGame, game_id, num_players=count, **game_kwargs), players, trained)


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
    """The game's own reward (the player's, given when the game is done; a seat's own in a game of several
    players): the trajectory's turn rewards summed, as ``textarena_reward`` in the logs. The last turn's reward already holds it: with ``gigpo=True`` pass
    ``gigpo_step_rewards="turns"``, so that GiGPO's step returns count it once (``docs/credit.md``)."""
    from ..rewards.turns import TurnReward

    return TurnReward("sum", name="textarena_reward")


__all__ = ["TextArenaEnvironment", "TextArenaGame", "game_reward", "seat_name", "textarena_dataset",
           "textarena_environment"]
