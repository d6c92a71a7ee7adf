"""KeyedLock: one caller per key at a time, and no entry left once nobody holds it."""

from __future__ import annotations

import asyncio

from ratchet.actors.core.keyed_lock import KeyedLock


async def test_callers_of_one_key_take_turns_and_other_keys_do_not_wait() -> None:
    locks: KeyedLock[str] = KeyedLock()
    inside: list[str] = []
    most = 0
    a_in, b_free = asyncio.Event(), asyncio.Event()

    async def use(key: str, name: str, until: asyncio.Event | None = None) -> None:
        nonlocal most
        async with locks.hold(key):
            inside.append(key)
            most = max(most, inside.count("a"))
            if name == "a1":
                a_in.set()
            if until is not None:
                await until.wait()
            inside.remove(key)

    first = asyncio.create_task(use("a", "a1", b_free))
    await asyncio.wait_for(a_in.wait(), 5)
    second = asyncio.create_task(use("a", "a2"))
    await asyncio.wait_for(use("b", "b1"), 5)  # another key: not behind "a"
    assert len(locks) == 1 and inside == ["a"]
    b_free.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert most == 1 and inside == [] and len(locks) == 0


async def test_a_caller_that_raises_or_is_cancelled_leaves_no_entry_behind() -> None:
    locks: KeyedLock[str] = KeyedLock()
    try:
        async with locks.hold("k"):
            raise ValueError("boom")
    except ValueError:
        pass
    held = asyncio.Event()

    async def hold_forever() -> None:
        async with locks.hold("k"):
            held.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold_forever())
    await asyncio.wait_for(held.wait(), 5)
    waiter = asyncio.create_task(hold_forever())
    await asyncio.sleep(0)  # let it queue behind the holder
    waiter.cancel()
    holder.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert len(locks) == 0
