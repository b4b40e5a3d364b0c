"""Slurm's own choice for a flexible GPU request against ``placement.slurm_select_flexible``.

Fragmented states drawn with ``--seed`` (``evaluation.slurm_flexible.cases``) plus the
hand-picked ones the live test runs, each in every request form of ``--forms``, on the local
Slurm of ``--slurm-dir`` (start it with ``LINKWISE_SLURM_TOPOLOGY=tree``). Prints Markdown
(agreement per form, then every disagreement) and, with ``--json``, every case.

    LINKWISE_SLURM_DIR=/tmp/lw-slurm-flex .venv/bin/python benchmarks/flexible_vs_slurm.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main() -> int:
    from linkwise.cluster.domain import Placement
    from linkwise.cluster.slurm.client import SlurmClient, read_env_file
    from linkwise.cluster.topology.load import load_topology
    from linkwise.evaluation.slurm_flexible import FORMS, HANDPICKED, FlexCase, cases, run_cases

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=16, help="drawn cases (besides the hand-picked)")
    p.add_argument("--forms", default=",".join(FORMS))
    p.add_argument(
        "--slurm-dir", default=os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm")
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    env = read_env_file(Path(args.slurm_dir) / "env")
    client = SlurmClient.from_env(env, "cli")
    topo = load_topology(str(Path(args.slurm_dir) / "etc"))
    forms = [f for f in args.forms.split(",") if f]
    todo = [FlexCase(u, g) for u, g in HANDPICKED]
    todo += cases(args.cases, args.seed, len(topo.nodes), topo.max_gpus_per_node)
    t0 = time.perf_counter()
    results = run_cases(client, topo, todo, forms)
    wall = time.perf_counter() - t0
    names = [n.name for n in topo.nodes]

    def show(pl: Placement | None) -> str:
        if pl is None:
            return "not started"
        return " ".join(f"{names[i]}:{g}" for i, g in pl.alloc)

    if args.json:
        rows = [
            {
                "used": list(r.case.used),
                "gpus": r.case.gpus,
                "form": r.form,
                "free": list(r.free),
                "slurm": show(r.slurm),
                "model": show(r.model),
                "agrees": r.agrees,
            }
            for r in results
        ]
        print(json.dumps(rows, indent=1))
        return 0
    version = env.get("LINKWISE_SLURM_VERSION", "?")
    print(f"Slurm {version}, topology/{topo.plugin or 'none'}, {len(todo)} states, {wall:.0f} s\n")
    print("| form | sbatch | model = Slurm (nodes and GPUs per node) |")
    print("|---|---|---:|")
    for form in forms:
        mine = [r for r in results if r.form == form]
        asked = " ".join(FORMS[form]).replace("{nodes}", str(len(names)))
        print(f"| {form} | `{asked}` | {sum(r.agrees for r in mine)} / {len(mine)} |")
    for r in results:
        if not r.agrees:
            print(
                f"\n{r.form}, free {list(r.free)}, {r.case.gpus} GPUs: "
                f"Slurm {show(r.slurm)}; model {show(r.model)}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
