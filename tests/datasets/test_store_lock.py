"""A store held by another process: a bounded retry, then a clear error (never a traceback)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from linkwise.cli import main
from linkwise.datasets.store import StoreLockedError, open_store


@contextmanager
def held(path: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the store open for ``seconds`` (DuckDB locks the file)."""
    code = (
        f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('ready', flush=True); "
        f"time.sleep({seconds!r}); c.close()"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_locked_store_is_retried_for_a_bounded_time_then_refused(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    with held(db, 60.0) as proc:
        t0 = time.monotonic()
        with pytest.raises(StoreLockedError, match=rf"locked by another process.*PID {proc.pid}"):
            open_store(db, lock_wait_s=1.0)
        # bounded: at least the wait, and not open-ended (loose: CI machines are loaded)
        assert 1.0 <= time.monotonic() - t0 < 30.0
    with held(db, 1.0):
        con = open_store(db, lock_wait_s=20.0)  # the holder lets go within the wait
        con.close()


def test_collect_on_a_locked_store_fails_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.duckdb"
    open_store(db).close()
    sysfs = tmp_path / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
    sysfs.mkdir(parents=True)
    (sysfs / "port_xmit_data").write_text("5\n")
    env = tmp_path / "env"
    env.write_text(f"SLURM_CONF={tmp_path / 'none.conf'}\nLINKWISE_SLURM_CLUSTER=c\n")
    with held(db, 60.0):
        code = main(["collect", "telemetry", "--db", str(db), "--sysfs", str(tmp_path / "sys"),
                     "--lock-wait", "0.5"])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1 and "is locked by another process" in err and "Traceback" not in err
        code = main(["collect", "accounting", "--db", str(db), "--slurm-env", str(env),
                     "--lock-wait", "0.5"])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 1 and "is locked by another process" in err
