import asyncio

from flowmq_core.periodic import PeriodicTask


async def test_runs_repeatedly_and_survives_a_failing_run():
    calls = 0
    third_call = asyncio.Event()

    async def action() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first run fails")
        if calls == 3:
            third_call.set()

    task = PeriodicTask("test", 0.001, action)
    task.start()
    await asyncio.wait_for(third_call.wait(), 5)
    await task.stop()
    stopped_at = calls
    await asyncio.sleep(0.01)  # would let a still-running loop call again
    assert calls == stopped_at >= 3


async def test_stop_before_start_and_twice_is_harmless():
    task = PeriodicTask("idle", 10, lambda: asyncio.sleep(0))
    await task.stop()
    task.start()
    await task.stop()
    await task.stop()
