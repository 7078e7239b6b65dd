"""Games with several seats, one policy: who plays each seat, which seats train, and the turn loop that plays them.

    trainer = AgenticGRPOTrainer(..., environment=Seats(TicTacToe, players={"Player 0": "policy",
                                                                           "Player 1": "policy"}))

:class:`Seats` is the ``environment=`` of such a game (:mod:`trl_agentic.environments.seats`): the game's factory,
each seat's player (``"policy"``, the policy being trained; :class:`~trl_agentic.rollout.players.FrozenCopy`;
:class:`~trl_agentic.rollout.players.ModelPlayer`; :class:`~trl_agentic.rollout.players.ScriptedPlayer`) and the
seats that train (by default every seat the policy plays; each trained seat is the policy's).

**One trajectory per trained seat.** A game is played for as many rows as it has trained seats: the ``i``-th row
of a batch trains seat ``trained[i % k]`` (``k`` trained seats), and consecutive equal rows (the ``num_generations``
copies of a prompt) share one game, one row per trained seat. A row's run is its seat's trajectory: its own context
(the row's prompt with the seat's opening appended, then its moves, token-exact, ``env_mask`` 1, and what it saw
before each next turn, the other seats' moves among it, ``env_mask`` 0), its own rewards (each
:class:`~trl_agentic.environments.seats.SeatTurn`'s reward for the seat added to its last turn) and its ``seat``.
Reward functions score each run, as for any environment; GRPO groups runs by prompt and seat
(:mod:`trl_agentic.algorithms.seats`). A seat the policy plays without training it is played the same way and
its trajectory dropped.

**One generation call per turn.** Each pass of the loop every active game has one seat to act: every seat the policy
plays, in every game, is generated in ONE call of the rollout's generator (the engine's budgets, end ids, stop
strings and observation encoding: :class:`~trl_agentic.rollout.engine.RolloutEngine`), every other seat by its
player (a model's seats in one batched call, a scripted player's one call per game, all concurrently); then every
game steps, concurrently, each under ``env_timeout``. The loop runs while any process has an active game
(``sync_any``), so every rank makes the same generation calls.

**Budgets.** ``max_turns`` and the token budgets hold per policy seat; a game stops when one of its policy seats
reaches one (that seat ends ``max_turns`` / ``max_tokens``, the others ``env_truncated``), or after more than
``max_turns`` moves per seat in all (``max_turns``): a game whose other seats never hand the turn back ends too.

**Failures stay in their game.** A game whose factory, ``reset`` or ``step`` raises, hangs past ``env_timeout`` or
returns anything but a :class:`~trl_agentic.environments.seats.SeatTurn` naming its own seats, and a game whose
player raises or hangs (a model's batched call that raises is retried one game at a time, so that a game that
breaks it costs itself alone), ends every trajectory of that game (``env_error`` / ``env_timeout``, the game or the
seat and its player named in one line); the other games go on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..environments.base import EnvironmentFactory, environment_class
from ..environments.seats import SeatTurn, check_seat_turn
from ..trajectory import StopReason, Trajectory
from .config import RolloutConfig
from .engine import RolloutEngine, with_reset_text
from .engine_seams import EngineSeam
from .env_calls import EnvFailure, call_all
from .generation import Generator, generation_session
from .observations import is_conversational
from .players import POLICY, bind_player


class Seats:
    """A game with several seats (``environment=``): who plays each seat and which seats train (module docstring).

    Args:
        game: A class or zero-argument factory giving a fresh
            :class:`~trl_agentic.environments.seats.SeatedEnvironment` per game.
        players: Each seat's player: ``"policy"``, :class:`~trl_agentic.rollout.players.FrozenCopy`,
            :class:`~trl_agentic.rollout.players.ModelPlayer` or :class:`~trl_agentic.rollout.players.ScriptedPlayer`.
        trained: The seats that train, each played by ``"policy"`` (default: every seat the policy plays).

    Raises:
        ValueError: a seat of the game (its class's ``seats``) without a player, a trained seat the policy does not
            play, or no trained seat; in one line.
    """

    def __init__(self, game: EnvironmentFactory, players: Mapping[str, Any],
                 trained: Sequence[str] | None = None) -> None:
        if not callable(game) or (not isinstance(game, type) and hasattr(game, "step")):
            raise TypeError(f"Seats takes the game's class or a zero-argument factory of games, got "
                            f"{type(game).__name__}: each game needs a fresh instance")
        if not isinstance(players, Mapping) or not players:
            raise ValueError("Seats needs players={seat: 'policy' | FrozenCopy() | ModelPlayer(...) | "
                             "ScriptedPlayer(fn)}, one per seat of the game")
        declared = tuple(getattr(environment_class(game), "seats", ()) or ())
        missing = [seat for seat in declared if seat not in players]
        if missing:
            raise ValueError(f"seat {missing[0]!r} of {environment_class(game).__name__} has no player: pass "
                             f"players={{{missing[0]!r}: 'policy' | FrozenCopy() | ...}}")
        policy = tuple(seat for seat, player in players.items() if player == POLICY)
        trained = policy if trained is None else tuple(trained)
        unknown = [seat for seat in trained if seat not in players]
        if unknown:
            raise ValueError(f"trained= names seat {unknown[0]!r}, which players= does not (seats: "
                             f"{', '.join(map(repr, players))})")
        strangers = [seat for seat in trained if players[seat] != POLICY]
        if strangers:
            raise ValueError(f"seat {strangers[0]!r} is trained but played by {players[strangers[0]]!r}: only the "
                             "policy's seats train; play it with 'policy' or leave it out of trained=")
        if not trained:
            raise ValueError("no seat is trained: play at least one seat with 'policy' (players={seat: 'policy'})")
        self.game, self.players, self.trained = game, dict(players), trained

    def __repr__(self) -> str:
        name = getattr(environment_class(self.game), "__name__", None) or getattr(self.game, "__name__", "game")
        return f"Seats({name}, trained={list(self.trained)})"


@dataclass
class _Seat:
    """One seat of one game: its player, and what it has seen and done."""

    name: str
    player: Any
    trajectory: Trajectory | None = None  # a policy seat's record, from its first turn
    messages: list[dict[str, str]] | None = None  # another player's conversation, from its first turn
    reward: float = 0.0  # rewards given before its first turn


@dataclass
class _Game:
    """One game: its environment, its row's prompt, its seats, where it stands."""

    env: Any
    prompt: Any
    seats: dict[str, _Seat]
    turn: SeatTurn | None = None  # whose turn, what it sees now
    moves: int = 0
    over: bool = False
    cut: bool = False  # the last policy move was cut by the turn's token budget (chat: no end-of-turn)

    @property
    def active(self) -> bool:
        return not self.over

    @property
    def actor(self) -> _Seat:
        return self.seats[self.turn.seat]


class _Moves:
    """One call of a player over some of its seats' conversations (``step``, as the environment calls run it)."""

    def __init__(self, player: Any, stop_strings: list[str]) -> None:
        self.player, self.stop_strings = player, stop_strings

    def step(self, conversations: list[list[dict[str, str]]]) -> list[str]:
        moves = self.player.reply(conversations, self.stop_strings)
        if not isinstance(moves, list) or len(moves) != len(conversations) or \
                not all(isinstance(move, str) for move in moves):
            raise TypeError(f"reply must return one str per conversation ({len(conversations)}), got {moves!r:.80}")
        return moves


class SeatEngine(RolloutEngine):
    """The engine of games with several seats (module docstring): :meth:`run` plays the rows' games and returns one
    run per row, its trained seat's trajectory. The policy's seats are the engine's trajectories (its generator,
    budgets and encoding); ``players`` are the seats' bound players (:func:`~trl_agentic.rollout.players.
    bind_player`).

    Args:
        generator, processing_class, config, sync_any, eos_token_ids, sync_max: As
            :class:`~trl_agentic.rollout.engine.RolloutEngine`'s.
        seats: The game, its players and its trained seats.
        players: Each seat's player, bound to this rollout.
    """

    def __init__(self, generator: Generator, processing_class: Any, seats: Seats, players: Mapping[str, Any],
                 config: RolloutConfig | None = None, sync_any: Callable[[bool], bool] | None = None,
                 eos_token_ids: Sequence[int] | None = None, sync_max: Callable[[int], int] | None = None) -> None:
        super().__init__(generator, processing_class, seats.game, config, sync_any, eos_token_ids, sync_max)
        self.seats, self.players = seats, dict(players)

    def run(self, prompts: Sequence[Any], rows: Sequence[dict[str, Any]] | None = None,
            environments: Sequence[Any] | None = None) -> list[Trajectory]:
        """One run per prompt: the trajectory of the seat its row trains (``rows[i]`` goes to its game's
        ``reset``). ``environments``: not taken (each game is made by the factory)."""
        if environments is not None:
            raise ValueError("games with several seats make their own environments: pass environments=None")
        rows = [dict(row) for row in rows] if rows is not None else [{} for _ in prompts]
        if len(rows) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(rows)} rows")
        for player in {id(p): p for p in self.players.values()}.values():
            getattr(player, "start_rollout", lambda: None)()  # optional hook (FrozenCopy's refresh)
        with generation_session(self.generator):
            return self._play(list(prompts), rows)

    # -- the loop ----------------------------------------------------------------------------------------------
    def _play(self, prompts: list[Any], rows: list[dict[str, Any]]) -> list[Trajectory]:
        plan = games_of_rows(rows, self.seats.trained)
        games = [_Game(self._make_environment(), prompts[first],
                       {name: _Seat(name, player) for name, player in self.players.items()})
                 for first, _ in plan]
        for game in games:
            if isinstance(game.env, EnvFailure):
                self._fail_game(game, game.env)
        live = [j for j, g in enumerate(games) if g.active]
        stop_strings = self._stop_strings([games[j].env for j in live])
        results = call_all([games[j].env for j in live], "reset", [dict(rows[plan[j][0]]) for j in live],
                           self.config.env_timeout, check_seat_turn)
        for j, result in zip(live, results):
            self._advance(games[j], result)
        while self.sync_any(any(g.active for g in games)):
            for game in [g for g in games if g.active]:
                self._show(game)
            due = [g for g in games if g.active]
            actions = self._policy_moves([g for g in due if g.actor.player == POLICY], stop_strings)
            actions.update(self._player_moves([g for g in due if g.actor.player != POLICY], stop_strings))
            stepping = [g for g in due if g.active and id(g) in actions]
            results = call_all([g.env for g in stepping], "step", [actions[id(g)] for g in stepping],
                               self.config.env_timeout, check_seat_turn)
            for game, result in zip(stepping, results):
                self._record_move(game, actions[id(game)], result)
        self._close_games(games)
        runs: dict[int, Trajectory] = {row: self._trajectory(game, seat)
                                       for game, (_, seats) in zip(games, plan) for seat, row in seats.items()}
        return [runs[i] for i in range(len(rows))]

    def _show(self, game: _Game) -> None:
        """Give the seat to act what it sees now; a policy seat past its budget ends the game instead."""
        seat, observation = game.actor, game.turn.observation
        if seat.player != POLICY:
            if seat.messages is None:
                seat.messages = opening_messages(game.prompt, observation)
            else:
                seat.messages.append({"role": "user", "content": observation or ""})
            return
        t = seat.trajectory
        if t is None:
            seat.trajectory = self._new_trajectory(game, seat, observation)
        elif t.num_turns >= self.config.max_turns:
            self._finish(game, "env_truncated", {seat.name: "max_turns"})
        elif not self._append_observation(t, observation):  # the token budget: the engine ended it max_tokens
            self._finish(game, "env_truncated")

    def _policy_moves(self, due: list[_Game], stop_strings: list[str]) -> dict[int, str]:
        """ONE generation call for every seat the policy is to play, when any process has one (a dummy on a process
        with none); the moves of those whose turn did not exhaust their token budget."""
        if not self.sync_any(bool(due)):  # every seat to act is another player's, on every process
            return {}
        trajectories = [g.actor.trajectory for g in due]
        ends = self._generate_turn(trajectories or [Trajectory(prompt_ids=[])], list(range(len(due))), stop_strings)
        moves = {}
        for i, game in enumerate(due):
            if ends[i] == "max_tokens":
                self._end(trajectories[i], "max_tokens")
                self._finish(game, "env_truncated")
            else:
                moves[id(game)] = trajectories[i].actions[-1]
                game.cut = ends[i] is None
        return moves

    def _player_moves(self, due: list[_Game], stop_strings: list[str]) -> dict[int, str]:
        """The moves of the seats other players play: a batched player's seats in one call (retried one game at a
        time if it raises), every other player's one call per game; all concurrently, each under ``env_timeout``.
        A game whose player failed ends (:meth:`_fail_game`)."""
        calls: list[tuple[Any, list[_Game]]] = []
        for player in {id(g.actor.player): g.actor.player for g in due}.values():
            mine = [g for g in due if g.actor.player is player]
            calls += [(player, mine)] if player.batched else [(player, [g]) for g in mine]
        moves: dict[int, str] = {}
        retry = self._call_players(calls, stop_strings, moves)
        self._call_players([(player, [g]) for player, games in retry for g in games], stop_strings, moves)
        return moves

    def _call_players(self, calls: list[tuple[Any, list[_Game]]], stop_strings: list[str],
                      moves: dict[int, str]) -> list[tuple[Any, list[_Game]]]:
        """Run ``calls`` (a player and the games it answers in one call); their moves into ``moves``; returns the
        batched calls of several games that raised (to retry one game at a time). Any other failure ends its game."""
        names = [f"seat {games[0].actor.name!r} played by {player_name(player)}" if len(games) == 1 else
                 f"{player_name(player)} playing {len(games)} seats" for player, games in calls]
        results = call_all([_Moves(player, stop_strings) for player, _ in calls], "step",
                           [[g.actor.messages for g in games] for _, games in calls], self.config.env_timeout,
                           lambda result, where: result, names)
        retry = []
        for (player, games), result in zip(calls, results):
            if isinstance(result, EnvFailure):
                if result.kind == "env_error" and len(games) > 1:
                    retry.append((player, games))
                else:
                    for game in games:
                        self._fail_game(game, result)
                continue
            for game, move in zip(games, result):
                moves[id(game)] = move
        return retry

    def _record_move(self, game: _Game, action: str, result: SeatTurn | EnvFailure) -> None:
        """The mover's turn recorded (its turn reward, the move's info), then the game advanced by ``result``."""
        if isinstance(result, EnvFailure):
            self._fail_game(game, result)
            return
        seat = game.actor
        if seat.player == POLICY:
            seat.trajectory.turn_rewards.append(seat.reward)
            seat.trajectory.turn_infos.append(dict(result.info))
            seat.reward = 0.0
        else:
            seat.messages.append({"role": "assistant", "content": action})
        game.moves += 1
        self._advance(game, result)
        if game.active and game.moves > self.config.max_turns * len(game.seats):
            self._finish(game, "max_turns")

    def _advance(self, game: _Game, result: SeatTurn | EnvFailure) -> None:
        """Where ``result`` leaves the game: each seat's reward added to its last turn, then the next seat to act,
        or the game's end."""
        if isinstance(result, EnvFailure):
            self._fail_game(game, result)
            return
        stranger = next((s for s in [*result.rewards, result.seat] if s is not None and s not in game.seats), None)
        if stranger is not None:
            name = type(game.env).__name__
            self._fail_game(game, EnvFailure("env_error", f"{name} named seat {stranger!r}, which has no player (seats: "
                                                          f"{', '.join(game.seats)}): pass players={{{stranger!r}: ...}}"))
            return
        for name, reward in result.rewards.items():
            seat = game.seats[name]
            t = seat.trajectory
            if t is not None and t.turn_rewards:
                t.turn_rewards[-1] += float(reward)
            else:
                seat.reward += float(reward)
        if result.seat is None:
            mover = game.actor if game.turn is not None else None
            own = {mover.name: "max_tokens"} if (mover is not None and mover.player == POLICY and game.cut
                                                 and self.config.rollout_mode == "chat") else {}
            self._finish(game, "terminated", own)
        else:
            game.turn = result

    # -- ends ----------------------------------------------------------------------------------------------------
    def _finish(self, game: _Game, reason: StopReason, own: Mapping[str, StopReason] | None = None) -> None:
        """End the game: each policy seat with ``reason``, or its own (``own``) when it has not ended already."""
        game.over = True
        for seat in game.seats.values():
            if seat.player == POLICY:
                t = self._trajectory(game, seat.name)
                if t.stop_reason is None:
                    self._end(t, (own or {}).get(seat.name, reason))

    def _fail_game(self, game: _Game, failure: EnvFailure) -> None:
        """End the game as failed: every policy seat's trajectory ends with the failure, named."""
        game.over = True
        for seat in game.seats.values():
            if seat.player == POLICY:
                t = self._trajectory(game, seat.name)
                if t.stop_reason is None:
                    self._fail(t, failure)

    def _trajectory(self, game: _Game, name: str) -> Trajectory:
        """The seat's trajectory (one with the row's prompt alone when the seat never had a turn)."""
        seat = game.seats[name]
        if seat.trajectory is None:
            seat.trajectory = self._new_trajectory(game, seat, None)
        return seat.trajectory

    def _new_trajectory(self, game: _Game, seat: _Seat, opening: str | None) -> Trajectory:
        t = Trajectory(prompt_ids=self.encoder.encode_prompt(game.prompt, opening), seat=seat.name)
        t.prompt = with_reset_text(game.prompt, opening)
        return t

    def _close_games(self, games: list[_Game]) -> None:
        live = [g for g in games if not isinstance(g.env, EnvFailure)]
        results = call_all([g.env for g in live], "close", [None] * len(live), self.config.env_timeout)
        for game, result in zip(live, results):
            if isinstance(result, EnvFailure):
                for seat in game.seats.values():
                    if seat.trajectory is not None:
                        seat.trajectory.count("env_close_error")


def games_of_rows(rows: Sequence[dict[str, Any]], trained: Sequence[str]) -> list[tuple[int, dict[str, int]]]:
    """The games of a batch: each game's first row and, per trained seat it trains, the row whose run that seat's
    trajectory is. Row ``i`` trains seat ``trained[i % k]``; a row joins the game before it when the rows are equal
    and its seat is free there (the ``num_generations`` copies of a prompt: one game per ``k`` of them)."""
    games: list[tuple[int, dict[str, int]]] = []
    for i, row in enumerate(rows):
        seat = trained[i % len(trained)]
        if games and rows[games[-1][0]] == row and seat not in games[-1][1]:
            games[-1][1][seat] = i
        else:
            games.append((i, {seat: i}))
    return games


def player_name(player: Any) -> str:
    """How failures name a player: its ``repr`` (``ScriptedPlayer(fn)``, ``FrozenCopy()``), or its class's name
    when it has no ``repr`` of its own."""
    text = repr(player)
    return type(player).__name__ if text.startswith("<") else text


def opening_messages(prompt: Any, opening: str | None) -> list[dict[str, str]]:
    """A seat's conversation at its first turn: the row's prompt (chat messages; a text prompt as one user message)
    with the seat's opening appended to its last message."""
    messages = [dict(m) for m in prompt] if is_conversational(prompt) else [{"role": "user", "content": prompt or ""}]
    return [dict(m) for m in with_reset_text(messages, opening)]


class SeatSeam(EngineSeam):
    """Games with several seats behind the rollout seam (:mod:`~trl_agentic.rollout.seam`), as
    :class:`~trl_agentic.rollout.engine_seams.EngineSeam` over a :class:`SeatEngine`: each row's run is its trained
    seat's trajectory, reward functions receive ``trajectory``; the metrics add each trained seat's mean game reward
    (``agentic/seats/<seat>/reward``).

    Args:
        engine: The engine, built once (its generator, encoder and players).
        prompt_column: The column that holds each row's prompt.
    """

    def __init__(self, engine: SeatEngine, prompt_column: str = "prompt") -> None:
        super().__init__(engine, prompt_column)
        self.trained_seats = engine.seats.trained

    def sums(self, runs: Sequence[Trajectory]) -> Counter:
        """:func:`~trl_agentic.rollout.metrics.rollout_sums`, and per trained seat its runs and their rewards."""
        sums = super().sums(runs)
        for t in runs:
            sums[f"seat/{t.seat}/count"] += 1
            sums[f"seat/{t.seat}/reward"] += t.env_reward
        return sums

    def metrics(self, sums: Counter) -> dict[str, float]:
        """``agentic/*`` and ``agentic/seats/<seat>/reward``: the mean game reward of each trained seat's runs."""
        metrics = super().metrics(sums)
        for seat in self.trained_seats:
            count = sums.get(f"seat/{seat}/count", 0)
            if count:
                metrics[f"agentic/seats/{seat}/reward"] = sums[f"seat/{seat}/reward"] / count
        return metrics


def bound_players(seats: Seats, generator: Generator, processing_class: Any,
                  config: RolloutConfig) -> dict[str, Any]:
    """Each seat's player ready for a rollout of ``generator`` (:func:`~trl_agentic.rollout.players.bind_player`)."""
    return {seat: bind_player(player, generator, processing_class, config) for seat, player in seats.players.items()}


__all__ = ["SeatEngine", "SeatSeam", "Seats", "bound_players", "games_of_rows", "opening_messages"]
