"""The scontrol argument lists the loop and the watchdog run on a job (release, untag, clear
its node list)."""

from __future__ import annotations

from linkwise.deployer.holds import RELEASED_TAG


def release_command(job_id: int) -> list[str]:
    """The argument list that releases a held job."""
    return ["scontrol", "release", str(int(job_id))]


def clear_nodes_command(job_id: int) -> list[str]:
    """The argument list that clears a pending job's node list (Slurm places it again)."""
    return ["scontrol", "update", f"JobId={int(job_id)}", "ReqNodeList="]


def untag_command(job_id: int) -> list[str]:
    """The argument list that ends the loop's claim on a job no longer held."""
    return ["scontrol", "update", f"JobId={int(job_id)}", f"AdminComment={RELEASED_TAG}"]
