"""The thread a tool session runs blocking tool code on: a pykka ``ThreadingActor``, one
call at a time (actors/effects/tool_session.py).

Its own module, imported by the first blocking tool call: pykka (~4 ms of imports) is not
loaded by a node whose tools are all async, nor before a restarted node resumes its tasks
(docs/operations.md, "Restart (W4)").
"""

from __future__ import annotations

import asyncio
from typing import Any

import pykka

__all__ = ["BlockingRunner"]


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return  # the caller gave up (timeout); the late outcome is dropped here
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class BlockingRunner(pykka.ThreadingActor):
    """Runs blocking tool code on its own thread, one call at a time. A message is
    ``(call, loop, future)``: the outcome of ``call()`` settles ``future`` on ``loop``."""

    # A call that never returns must not keep the process alive after the node stopped.
    use_daemon_thread = True

    def on_receive(self, message: Any) -> None:
        call, loop, fut = message
        try:
            result = call()
        except BaseException as exc:
            ok, value = False, exc
        else:
            ok, value = True, result
        try:
            loop.call_soon_threadsafe(_settle, fut, ok, value)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass
