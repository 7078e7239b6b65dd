"""The seats another player plays, served over OpenAI's chat completions: for an ecosystem whose episodes call a
model per seat over HTTP (verifiers' ``user-sim``: the simulated user's harness calls its client), so that a seat the
policy does not play is answered by its :class:`~trl_agentic.rollout.players.Player` (a
:class:`~trl_agentic.rollout.players.ScriptedPlayer`, a :class:`~trl_agentic.rollout.players.ModelPlayer`) and
never reaches the policy's endpoint.

``POST http://127.0.0.1:<port>/s/<seat>/v1/chat/completions`` (JSON, or server-sent events with ``"stream": true``,
as the agents' endpoint answers them: :mod:`trl_agentic.agents.protocol`) answers with the seat's player's reply to
the request's messages; ``GET .../models`` lists the seat. A player that raises answers 500, one that does not answer
within ``timeout`` seconds 504, each with one line naming the seat and its player: the episode that called it fails
alone. A batched player (a model) answers one request at a time; a scripted one answers requests concurrently.

FastAPI reads the handlers' annotations, so they are objects here (this module does not postpone annotations) and
fastapi is imported only when an app is built (an optional extra), as in :mod:`trl_agentic.agents.server`.
"""

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

from ..agents.loopback import LOOPBACK, LoopbackServer


class SeatServer:
    """The app on 127.0.0.1, on a free port, served by uvicorn on a daemon thread (module docstring).

    Args:
        players: The player of each seat served, bound (:meth:`~trl_agentic.rollout.players.ModelPlayer.bound`).
        timeout: Seconds a player may take for one reply.
    """

    def __init__(self, players: Mapping[str, Any], timeout: float) -> None:
        self.players, self.timeout = dict(players), timeout
        self._locks = {seat: threading.Lock() for seat in self.players}
        self._served = LoopbackServer(self._app(), "the seat server")
        self.port = self._served.port

    def base_url(self, seat: str) -> str:
        """The base URL a client of ``seat`` is given: ``http://127.0.0.1:<port>/s/<seat>/v1``."""
        return f"http://{LOOPBACK}:{self.port}/s/{seat}/v1"

    def stop(self) -> None:
        self._served.stop()

    def reply(self, seat: str, messages: list[dict[str, Any]], stop_strings: list[str]) -> str:
        """The seat's player's move for ``messages`` (a batched player's calls one at a time)."""
        player = self.players[seat]
        conversation = [{"role": m["role"], "content": m.get("content") or ""} for m in messages]
        if not player.batched:
            return self._one(player, conversation, stop_strings)
        with self._locks[seat]:
            return self._one(player, conversation, stop_strings)

    @staticmethod
    def _one(player: Any, conversation: list[dict[str, str]], stop_strings: list[str]) -> str:
        moves = player.reply([conversation], stop_strings)
        if not isinstance(moves, list) or len(moves) != 1 or not isinstance(moves[0], str):
            raise TypeError(f"reply must return one str per conversation (1), got {moves!r:.80}")
        return moves[0]

    def _app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, StreamingResponse

        from ..agents.protocol import (
            Limits,
            Reply,
            RequestError,
            completion_body,
            error_body,
            models_body,
            parse_request,
            stream_events,
        )
        from ..rollout.seats import player_name

        app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
        limits = Limits()

        @app.post("/s/{seat}/v1/chat/completions")
        async def complete(seat: str, request: Request) -> Any:
            if seat not in self.players:
                return JSONResponse(error_body(f"no seat {seat!r} is served here (seats: {', '.join(self.players)})",
                                               "not_found_error"), status_code=404)
            try:
                chat = parse_request(await request.body(), limits)
            except RequestError as exc:
                return JSONResponse(exc.body(), status_code=exc.status)
            who = f"seat {seat!r} played by {player_name(self.players[seat])}"
            try:
                text = await asyncio.wait_for(asyncio.to_thread(self.reply, seat, chat.messages, chat.stop),
                                              self.timeout)
            except asyncio.TimeoutError:
                return JSONResponse(error_body(f"{who} took longer than {self.timeout:g} s", "timeout_error"),
                                    status_code=504)
            except Exception as exc:  # noqa: BLE001 - the player's failure: its episode fails, named
                return JSONResponse(error_body(f"{who} raised {type(exc).__name__}: {exc}"[:1000], "server_error"),
                                    status_code=500)
            reply = Reply(content=text, tool_calls=[], finish_reason="stop", token_ids=[], logprobs=None, tokens=[],
                          prompt_tokens=0)
            if chat.stream:
                return StreamingResponse(stream_events(reply, chat, seat), media_type="text/event-stream")
            return JSONResponse(completion_body(reply, chat, seat))

        @app.get("/s/{seat}/v1/models")
        async def models(seat: str) -> Any:
            return JSONResponse(models_body(seat))

        return app


__all__ = ["SeatServer"]
