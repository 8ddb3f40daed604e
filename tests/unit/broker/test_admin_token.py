"""The generated admin token is one token even when several processes start on one data dir
at once (host mode, ``flowmq cluster``): every process must use the token the file keeps."""

from __future__ import annotations

import multiprocessing as mp
import stat

from flowmq_broker.admin_token import TOKEN_FILE, load_or_create_token

PROCESSES = 8


def _race(data_dir: str, barrier, out) -> None:
    """One starting process.  Generating a token is made slow (this forked child only), so
    every process has found no token file before any has written one: the race on purpose."""
    import secrets
    import time
    from pathlib import Path

    generate = secrets.token_urlsafe

    def slow_token(nbytes: int) -> str:
        time.sleep(0.2)
        return generate(nbytes)

    secrets.token_urlsafe = slow_token
    barrier.wait()
    out.put(load_or_create_token("", Path(data_dir)))


def test_processes_starting_together_share_one_generated_token(tmp_path):
    ctx = mp.get_context("fork")  # start at once: no interpreter start-up between them
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(tmp_path), barrier, out)) for _ in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join(10)
    tokens = {token for token, _ in results}
    assert len(tokens) == 1
    assert sum(generated for _, generated in results) == 1
    kept = tmp_path / TOKEN_FILE
    assert kept.read_text().strip() in tokens
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == [TOKEN_FILE]  # no temporary file left


def test_a_configured_token_wins_and_an_empty_file_is_replaced(tmp_path):
    assert load_or_create_token("given", tmp_path) == ("given", False)
    (tmp_path / TOKEN_FILE).write_text("\n")
    token, generated = load_or_create_token("", tmp_path)
    assert generated and (tmp_path / TOKEN_FILE).read_text().strip() == token
    assert load_or_create_token("", tmp_path) == (token, False)
