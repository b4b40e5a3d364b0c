"""The accounting's job runs as the log replay (``datasets.decisions``) and the backlogs
(``datasets.backlog``) read them: which cluster a store holds (``store_cluster``), a flat
topology from its ``nodes`` table (``topology_from_store``), and the usable runs of a span
with the count of the others by reason (``load_log_jobs``)."""

from __future__ import annotations

import math

import duckdb
import polars as pl

from linkwise.cluster.domain import Node, Topology
from linkwise.cluster.hostlist import natural_key
from linkwise.cluster.topology.spec import DEFAULT_INTRA_GBPS, DEFAULT_NIC_GBPS

__all__ = ["load_log_jobs", "resolve_cluster", "store_cluster", "topology_from_store"]


def resolve_cluster(con: duckdb.DuckDBPyConnection, table: str, cluster: str | None) -> str:
    """``cluster`` when given, else the only cluster in ``table`` (ValueError when it holds
    none or several)."""
    if cluster is not None:
        return cluster
    names = [str(r[0]) for r in con.execute(f"SELECT DISTINCT cluster FROM {table}").fetchall()]
    if not names:
        raise ValueError(f"the store's {table} table is empty: no cluster in it")
    if len(names) != 1:
        raise ValueError(
            f"the store's {table} table holds {len(names)} clusters ({', '.join(sorted(names))}): "
            "name one"
        )
    return names[0]


def store_cluster(con: duckdb.DuckDBPyConnection, cluster: str | None = None) -> str:
    """The Slurm cluster a store's accounting is of: ``cluster`` when given, else the only one
    in its ``jobs`` table (ValueError when it holds none or several). Datasets and evaluations
    name their spans by it, so that a held-out window and a training span of one store compare
    whether or not ``--slurm-cluster`` was given."""
    return resolve_cluster(con, "jobs", cluster)


def topology_from_store(
    con: duckdb.DuckDBPyConnection,
    cluster: str | None = None,
    *,
    nic_gbps: float = DEFAULT_NIC_GBPS,
    intra_gbps: float = DEFAULT_INTRA_GBPS,
) -> Topology:
    """A flat topology (all nodes under one leaf switch) from the store's ``nodes`` table.

    For when no slurm.conf/topology.conf is at hand; nodes in natural name order with their
    ``gpus_total``. ValueError if the cluster has no nodes (or ``cluster`` is None and the
    table holds several clusters).
    """
    name = resolve_cluster(con, "nodes", cluster)
    rows = con.execute("SELECT node, gpus_total FROM nodes WHERE cluster = ?", [name]).fetchall()
    if not rows:
        raise ValueError(f"no nodes of cluster {name!r} in the store (ingest them first)")
    rows.sort(key=lambda r: natural_key(str(r[0])))
    nodes = tuple(
        Node(name=str(n), gpus=max(0, int(g)), leaf=0, intra_gbps=intra_gbps, nic_gbps=nic_gbps)
        for n, g in rows
    )
    return Topology(
        name=name,
        nodes=nodes,
        leaf_names=("leaf1",),
        leaf_agg=(0,),
        leaf_uplink_gbps=(len(nodes) * nic_gbps,),
    )


_LOAD_SQL = """
SELECT j.job_id, j.run_index, j.state, j.settled, j.submit_time, j.start_time, j.end_time,
       j.gpus, j.name, j.user_name, j.time_limit_s,
       list(n.node ORDER BY n.node) FILTER (WHERE n.node IS NOT NULL) AS alloc_nodes,
       list(n.gpus ORDER BY n.node) FILTER (WHERE n.node IS NOT NULL) AS alloc_gpus
FROM jobs AS j
LEFT JOIN job_nodes AS n
  ON n.cluster = j.cluster AND n.job_id = j.job_id AND n.submit_time = j.submit_time
 AND n.run_index = j.run_index
WHERE j.cluster = ? AND coalesce(j.end_time, 'infinity'::DOUBLE) > ? AND j.submit_time < ?
GROUP BY ALL
ORDER BY j.submit_time, j.job_id, j.run_index
"""


def load_log_jobs(
    con: duckdb.DuckDBPyConnection,
    topology: Topology,
    cluster: str,
    *,
    since: float | None = None,
    until: float | None = None,
) -> tuple[pl.DataFrame, dict[str, int]]:
    """The usable job runs overlapping ``[since, until)`` and the count of the others by reason.

    Columns: ``job_id`` (the run's id in the replay: Slurm's id for a first run, a negative
    id for a requeued run or a later job under an id Slurm reused), ``slurm_job_id``,
    ``run_index``, ``submit``, ``start``, ``end``, ``gpus``, ``alloc_idx`` / ``alloc_gpus``
    (node indices into ``topology`` and GPUs), ``time_limit`` (seconds, 0 where Slurm had none).
    """
    lo = -math.inf if since is None else float(since)
    hi = math.inf if until is None else float(until)
    rel = con.sql(_LOAD_SQL, params=[cluster, lo, hi])
    assert rel is not None
    raw: pl.DataFrame = rel.pl()
    node_frame = pl.DataFrame(
        {
            "node": [n.name for n in topology.nodes],
            "node_idx": list(range(len(topology.nodes))),
            "node_cap": [n.gpus for n in topology.nodes],
        },
        schema={"node": pl.String, "node_idx": pl.Int64, "node_cap": pl.Int64},
    )
    per_node = (
        raw.select("job_id", "submit_time", "run_index", "alloc_nodes", "alloc_gpus")
        .explode(["alloc_nodes", "alloc_gpus"])
        .drop_nulls("alloc_nodes")
        .rename({"alloc_nodes": "node"})
        .join(node_frame, on="node", how="left")
        .group_by("job_id", "submit_time", "run_index")
        .agg(
            pl.col("node_idx").is_null().any().alias("unknown_node"),
            (pl.col("alloc_gpus") > pl.col("node_cap")).fill_null(False).any().alias("over_cap"),
            pl.col("alloc_gpus").sum().alias("alloc_total"),
            pl.col("node_idx"),
            pl.col("alloc_gpus"),
        )
    )
    df = raw.drop("alloc_gpus").join(
        per_node, on=["job_id", "submit_time", "run_index"], how="left"
    )
    # a job id Slurm reused (its state cleared): each later job with that id is generation
    # 1, 2, ... (a new job starts at run 0), and its runs get ids of their own
    df = df.with_columns(
        ((pl.col("run_index") == 0).cum_sum().over("job_id", order_by="submit_time") - 1)
        .clip(lower_bound=0)
        .alias("_generation")
    )
    df = df.with_columns(_skip_reason(topology.total_gpus))
    skipped = {
        str(r): int(n)
        for r, n in df.filter(pl.col("reason").is_not_null()).group_by("reason").len().rows()
    }
    good = (
        df.filter(pl.col("reason").is_null())
        .with_columns(
            pl.when((pl.col("run_index") == 0) & (pl.col("_generation") == 0))
            .then(pl.col("job_id"))
            .otherwise(
                -(pl.col("job_id") * 1000 + pl.col("_generation") * 100 + pl.col("run_index"))
            )
            .alias("rid"),
            pl.min_horizontal("submit_time", "start_time").alias("submit"),
        )
        .select(
            pl.col("rid").alias("job_id"),
            pl.col("job_id").alias("slurm_job_id"),
            "run_index",
            "submit",
            pl.col("start_time").alias("start"),
            pl.col("end_time").alias("end"),
            pl.col("gpus").cast(pl.Int64),
            pl.col("name").fill_null(""),
            pl.col("user_name").fill_null(""),
            pl.col("node_idx").alias("alloc_idx"),
            "alloc_gpus",
            pl.col("time_limit_s").fill_null(0.0).alias("time_limit"),
        )
        .sort("submit", "job_id")
    )
    return good, skipped


def _skip_reason(total_gpus: int) -> pl.Expr:
    """Why a run is left out (null: usable), first reason first."""
    return (
        pl.when(~pl.col("settled"))
        .then(pl.lit("unsettled"))
        .when(pl.col("start_time").is_null())
        .then(pl.lit("never started"))
        .when(pl.col("end_time").is_null())
        .then(pl.lit("not finished"))
        .when(pl.col("gpus") <= 0)
        .then(pl.lit("no GPUs"))
        .when(pl.col("end_time") <= pl.col("start_time"))
        .then(pl.lit("zero duration"))
        .when(pl.col("gpus") > total_gpus)
        .then(pl.lit("more GPUs than the cluster"))
        .when(pl.col("alloc_total").is_null())
        .then(pl.lit("no node allocation"))
        .when(pl.col("unknown_node"))
        .then(pl.lit("node not in the topology"))
        .when(pl.col("over_cap"))
        .then(pl.lit("more GPUs than the node has"))
        .when(pl.col("alloc_total") != pl.col("gpus"))
        .then(pl.lit("allocation does not add up"))
        .otherwise(pl.lit(None, dtype=pl.String))
        .alias("reason")
    )
