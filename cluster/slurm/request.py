"""What a job asked Slurm for, read from one squeue / slurmrestd job record (``Request``).

The node count squeue prints (``node_count``) is, for a pending job, Slurm's estimate, not
the request: on 22.05.8 a held ``--gres=gpu:4 -n1 -c4`` job shows ``node_count`` 2 while its
TRES request says ``node=1`` (with ``-N1`` too: ``max_nodes`` 1, ``NumNodes=1-1``). Setting
``NumNodes`` to such an estimate gives the job twice its GPUs and CPUs. The TRES request's
``node=`` is the minimum node count Slurm holds, so the shape is read from it; ``node_count``
only when a record has no TRES request.

A request's shape is *enforced* (``nodes`` x ``gpus_per_node``: what setting ``NumNodes`` and
a node list of that length keeps) or *flexible* (``flexible`` says why: Slurm chooses the node
count or how the GPUs split):

- ``--gres=gpu:G`` / ``--gpus-per-node=G`` (``tres_per_node``): n x G, n the TRES minimum
  (one node without ``-N``); flexible where the TRES ``gres/gpu=`` count is not n x G;
- ``-N a-b`` with a < b: flexible;
- ``--gpus=N`` (``tres_per_job``): 1 x N on exactly one node (``-N1``), else flexible (with
  ``-N2`` Slurm still chooses the split);
- ``--gpus-per-task`` (``tres_per_task``): flexible;
- GPUs asked two ways at once, or a GPU request that cannot be read: flexible;
- no GPUs: n x 0.

A flexible request the loop can still place (``flexible_gpus``: a GPU count in any split,
``--gpus=N`` or ``-n N --gpus-per-task=1``, on ``min_nodes`` to ``max_nodes`` nodes, at most
one node per GPU) is started with ``NumNodes`` and a node list: Slurm then allocates exactly
those nodes and splits the GPUs over them itself (``placement.split_job_gpus``); the other
flexible requests (a per-node count over a node range, several GPUs per task, GPUs asked two
ways) are handed back untouched.

Counts are plain numbers (22.05) or ``{set, infinite, number}`` (later); unset, infinite and
NO_VAL read as 0. GPU items read ``gres:gpu:N`` (22.05) and ``gres/gpu:N`` / ``gres/gpu=N``
(later), typed (``gres/gpu:a100:2``) or not; other items (``cpu=4``, ``gres/shard:2``) are not
GPUs and are ignored here.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from linkwise.cluster.slurm.schema import number

__all__ = ["Request", "count_request", "flexible_gpus", "read_request", "widens"]

_NO_VAL = 0xFFFFFFFE  # 32-bit NO_VAL / INFINITE and above: not set
# a GPU item of tres_per_node/job/task: gres:gpu:4, gres/gpu:a100:2, gres/gpu=1 (24.11 per task)
_GPU_ITEM = re.compile(r"gres[:/]gpu(?:[:=]|\Z)")
_GPU_COUNT = re.compile(r"gres[:/]gpu(?::(?P<type>[^:=,]+?))?[:=](?P<count>\d+)\Z")
_GPU_FIELDS = ("tres_per_node", "tres_per_job", "tres_per_task")


@dataclass(frozen=True, slots=True)
class Request:
    """A job's request as Slurm holds it, and the shape a node list must keep (module doc)."""

    min_nodes: int  # the minimum node count Slurm holds (TRES node=; node_count without TRES)
    max_nodes: int  # -N a-b's b (0: not fixed)
    tasks: int  # -n (0: not known)
    node_gpus: int  # GPUs per node asked (--gres=gpu:G, --gpus-per-node=G)
    job_gpus: int  # GPUs per job asked (--gpus=N)
    task_gpus: int  # GPUs per task asked (--gpus-per-task=T)
    gpu_type: str  # the type of a typed GPU request (gres/gpu:a100:2), else ""
    tres_nodes: int  # node= of the TRES request (0: no TRES request)
    tres_gpus: int  # gres/gpu= of the TRES request (0: none)
    node_count: int  # squeue's node_count (for a pending job an estimate)
    nodes: int  # the enforced node count (0: flexible)
    gpus_per_node: int  # the enforced GPUs per node
    flexible: str = ""  # why Slurm chooses the shape ("": nodes x gpus_per_node is enforced)

    @property
    def gpus(self) -> int:
        """GPUs of the enforced shape (0 when flexible)."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class _GpuAsk:
    """GPUs one of ``tres_per_node/job/task`` asks: count, type, whether it could be read."""

    count: int
    type: str
    readable: bool


def read_request(job: Mapping[str, Any]) -> Request:
    """The request of one squeue / slurmrestd job record (module doc for the rules).

    Raises ``ValueError`` naming the field for a count that cannot be read."""
    tres = _tres_counts(str(job.get("tres_req_str") or ""))
    node_count = _count(job, "node_count")
    min_nodes = tres.get("node", node_count)
    asks = {key: _gpu_ask(str(job.get(key) or "")) for key in _GPU_FIELDS}
    ask_type = next((a.type for a in asks.values() if a.type), "")
    base = Request(
        min_nodes=max(1, min_nodes),
        max_nodes=_count(job, "max_nodes"),
        tasks=_count(job, "tasks") or _count(job, "num_tasks"),
        node_gpus=asks["tres_per_node"].count,
        job_gpus=asks["tres_per_job"].count,
        task_gpus=asks["tres_per_task"].count,
        gpu_type=ask_type,
        tres_nodes=tres.get("node", 0),
        tres_gpus=tres.get("gres/gpu", 0),
        node_count=node_count,
        nodes=0,
        gpus_per_node=0,
    )
    unread = [f"{k}={str(job.get(k))[:60]}" for k, a in asks.items() if not a.readable]
    nodes, per, why = _shape(base, unread)
    return dataclasses.replace(base, nodes=nodes, gpus_per_node=per, flexible=why)


def count_request(nodes: int, gpus: int) -> Request:
    """The request of a record built by hand (no squeue record behind it): ``gpus`` split
    evenly over ``nodes`` (at least one), as ``-N nodes --gres=gpu:G`` asks; flexible when
    they do not split evenly (and then not placeable: ``flexible_gpus`` 0)."""
    if nodes < 0 or gpus < 0:
        raise ValueError(f"count_request: negative nodes ({nodes}) or GPUs ({gpus})")
    n = max(1, nodes)
    even = gpus % n == 0
    return Request(
        min_nodes=n,
        max_nodes=n,
        tasks=0,
        node_gpus=gpus // n if even else 0,
        job_gpus=0,  # no record behind it: nothing asked per job (not placeable)
        task_gpus=0,
        gpu_type="",
        tres_nodes=n,
        tres_gpus=gpus,
        node_count=nodes,
        nodes=n if even else 0,
        gpus_per_node=gpus // n if even else 0,
        flexible="" if even else f"{gpus} GPU(s) over {n} nodes: an uneven split",
    )


def flexible_gpus(request: Request) -> int:
    """The GPU count of a flexible request the loop can place in any split (module doc):
    ``--gpus=N`` (``N``) or ``-n T --gpus-per-task=1`` (``T``); 0 for an enforced shape and
    for every other flexible request."""
    if not request.flexible or request.node_gpus:
        return 0
    if request.job_gpus and not request.task_gpus:
        count = request.job_gpus
    elif request.task_gpus == 1 and request.tasks and not request.job_gpus:
        count = request.tasks
    else:
        return 0
    if request.tres_gpus and request.tres_gpus != count:
        return 0  # the TRES request says otherwise: not read right
    return count if request.min_nodes <= count else 0


def widens(request: Request, gpus_per_node: Sequence[int]) -> str | None:
    """Why starting the job with ``gpus_per_node[k]`` GPUs on each of its nodes (``NumNodes``
    and a node list that long) would change what it gets (more nodes: more GPUs and CPUs
    than it asked; another GPU count; a node count outside its range), or that its shape is
    Slurm's alone to choose; None when the start keeps exactly its request. A flexible request
    the loop can place (``flexible_gpus``) keeps it with its GPU count on ``min_nodes`` to
    ``max_nodes`` nodes, each with at least one GPU."""
    nodes, total = len(gpus_per_node), sum(gpus_per_node)
    if request.flexible:
        count = flexible_gpus(request)
        if not count:
            return f"its shape is Slurm's to choose ({request.flexible})"
        top = request.max_nodes or count
        if total != count or not request.min_nodes <= nodes <= top or min(gpus_per_node) < 1:
            return (
                f"{total} GPU(s) on {nodes} node(s) ({'+'.join(map(str, gpus_per_node))}) is "
                f"not its request ({count} GPU(s) on {request.min_nodes}-{top} nodes)"
            )
        return None
    per = gpus_per_node[0] if gpus_per_node else 0
    if (nodes, per) != (request.nodes, request.gpus_per_node) or any(
        g != per for g in gpus_per_node
    ):
        shown = (
            f"{nodes} node(s) x {per} GPU(s)"
            if len(set(gpus_per_node)) <= 1
            else (f"{'+'.join(map(str, gpus_per_node))} GPU(s) on {nodes} node(s)")
        )
        return f"{shown} is not its request ({request.nodes} x {request.gpus_per_node})"
    return None


def _shape(r: Request, unread: list[str]) -> tuple[int, int, str]:
    """(nodes, GPUs per node, "") when the request enforces a shape, else (0, 0, why)."""
    n = r.min_nodes
    gpus = (r.node_gpus, r.job_gpus, r.task_gpus)
    asked = [(k, v) for k, v in zip(_GPU_FIELDS, gpus, strict=True) if v]
    if unread:
        return 0, 0, "a GPU request not read: " + ", ".join(unread)
    if len(asked) > 1:
        both = ", ".join(f"{k}={v}" for k, v in asked)
        return 0, 0, f"GPUs asked two ways at once ({both})"
    if r.max_nodes and r.max_nodes != n:
        return 0, 0, f"{n}-{r.max_nodes} nodes: Slurm chooses the node count"
    if r.task_gpus:
        return 0, 0, f"{r.task_gpus} GPU(s) per task: Slurm places the tasks and their GPUs"
    if r.job_gpus:
        if r.max_nodes == 1:
            return 1, r.job_gpus, ""
        over = f"{n} node(s)" if r.max_nodes else f"{n} or more node(s)"
        return 0, 0, f"{r.job_gpus} GPU(s) per job over {over}: Slurm chooses the split"
    if r.node_gpus:
        if r.tres_gpus and r.tres_gpus != n * r.node_gpus:
            return 0, 0, f"TRES asks {r.tres_gpus} GPU(s), not {n} x {r.node_gpus}"
        return n, r.node_gpus, ""
    if r.tres_gpus:
        return 0, 0, f"TRES asks {r.tres_gpus} GPU(s) with no per-node, job or task request"
    return n, 0, ""


def _gpu_ask(text: str) -> _GpuAsk:
    """The GPUs of one ``tres_per_*`` field (other items ignored)."""
    items = [t.strip() for t in text.split(",") if _GPU_ITEM.match(t.strip())]
    if not items:
        return _GpuAsk(0, "", True)
    found = _GPU_COUNT.match(items[0])
    if len(items) > 1 or found is None or not 0 < int(found.group("count")) < _NO_VAL:
        return _GpuAsk(0, "", False)  # several GPU items (types), or no count
    return _GpuAsk(int(found.group("count")), found.group("type") or "", True)


def _tres_counts(text: str) -> dict[str, int]:
    """``node`` and ``gres/gpu`` of a TRES string (``cpu=2,node=2,gres/gpu=8``)."""
    out: dict[str, int] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        if eq and key in ("node", "gres/gpu"):
            if not value.isdigit():
                raise ValueError(f"tres_req_str: {key}={value[:40]!r} is not a count")
            out[key] = int(value)
    return out


def _count(job: Mapping[str, Any], field: str) -> int:
    """A count of either generation: unset, infinite and NO_VAL read as 0; ``ValueError``
    naming ``field`` for anything else that is not a non-negative integer."""
    value = job.get(field)
    try:
        v = number(value)
    except ValueError as exc:
        raise ValueError(f"{field}: {str(value)[:60]!r} is not a count") from exc
    if v is None or v == math.inf or (isinstance(v, (int, float)) and v >= _NO_VAL):
        return 0
    if v < 0 or (isinstance(v, float) and not v.is_integer()):
        raise ValueError(f"{field}: {str(value)[:60]!r} is not a count")
    return int(v)
