"""The one scheduling loop: observe -> decide -> apply -> advance, for any Backend."""

from __future__ import annotations

from collections.abc import Callable

from linkwise.cluster.domain import Backend, ClusterState, Decision, Policy


def drive(
    backend: Backend,
    policy: Policy,
    *,
    on_decision: Callable[[ClusterState, Decision], None] | None = None,
    max_steps: int | None = None,
) -> int:
    """Run ``policy`` on ``backend`` until the backend says it is done; return the steps taken.

    ``on_decision`` sees every (state, decision) pair before it is applied (for logging,
    datasets or shadow records).
    """
    steps = 0
    while max_steps is None or steps < max_steps:
        state = backend.observe()
        decision = policy.decide(state)
        if on_decision is not None:
            on_decision(state, decision)
        backend.apply(decision)
        steps += 1
        if not backend.advance():
            break
    return steps
