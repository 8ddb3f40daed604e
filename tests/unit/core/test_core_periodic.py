import asyncio
import logging

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


async def test_a_store_outage_is_logged_once_and_its_end_once(caplog):
    """Failures of the kinds named in ``faults`` are an outage: one WARNING line without a
    traceback however many runs fail, one INFO line at the first run that succeeds; another
    failure keeps its traceback."""
    caplog.set_level(logging.INFO, logger="flowmq_core.periodic")
    outcomes = [OSError("down"), OSError("down"), OSError("down"), None, ValueError("bug"), None]
    done = asyncio.Event()

    async def action() -> None:
        if not outcomes:
            return
        outcome = outcomes.pop(0)
        if not outcomes:
            done.set()
        if outcome is not None:
            raise outcome

    task = PeriodicTask("upkeep", 0.001, action, faults=(OSError,))
    task.start()
    await asyncio.wait_for(done.wait(), 5)
    await task.stop()
    told = [(r.levelname, r.exc_info is not None) for r in caplog.records]
    assert told == [("WARNING", False), ("INFO", False), ("ERROR", True)]
    assert "storage unavailable (down)" in caplog.records[0].getMessage()
