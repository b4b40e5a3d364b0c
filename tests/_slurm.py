"""The local cluster's own Slurm commands, for tests that run them directly.

``scripts/local-slurm`` writes ``LINKWISE_SLURM_BIN`` (``$LINKWISE_SLURM_DIR/bin``) into its env
file: wrappers that run the instance's Slurm (the host's 22.05, or 24.11 / 26.05 in a chroot).
A test that calls ``sbatch`` or ``scancel`` itself goes through :func:`slurm_cmd`, so it talks
to the cluster it started, whichever version that is.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# raw output of Slurm 24.11 and 26.05 for one job mix (its README says what was submitted):
# read where it is, never copied into the project
SHARED_SLURM_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "slurm"


def slurm_cmd(env: Mapping[str, str], name: str) -> str:
    """``env["LINKWISE_SLURM_BIN"]/name`` when the env file names a bin folder, else ``name``."""
    bin_dir = env.get("LINKWISE_SLURM_BIN")
    return os.path.join(bin_dir, name) if bin_dir else name


def slurm_argv(env: Mapping[str, str], name: str, *args: str, user: str | None = None) -> list[str]:
    """The argv that runs Slurm command ``name`` with ``args`` on the cluster of ``env`` (its
    ``SLURM_CONF``), as ``user`` when given. With ``LINKWISE_SLURM_BIN`` the instance's wrapper
    switches user itself (``LINKWISE_SLURM_AS``: inside the chroot of 24.11 / 26.05, where the
    users are the chroot's own); without it, ``setpriv`` on the host."""
    conf = f"SLURM_CONF={env['SLURM_CONF']}"
    if env.get("LINKWISE_SLURM_BIN"):
        who = [f"LINKWISE_SLURM_AS={user}"] if user is not None else []
        return ["env", conf, *who, slurm_cmd(env, name), *args]
    cmd = ["env", conf, name, *args]
    if user is not None:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", *cmd]
    return cmd
