"""Running the async bodies of unit tests of pure asyncio code (admission, the prefill lane)."""

from __future__ import annotations

import asyncio


def run(coro_fn):
    """Run an async test body with a hard timeout, so that a bug cannot hang the suite."""

    async def bounded():
        return await asyncio.wait_for(coro_fn(), timeout=5)

    return asyncio.run(bounded())


async def settle():
    """Let every ready task run."""
    for _ in range(5):
        await asyncio.sleep(0)
