"""The dashboard and the alerts against a real Prometheus (issue 24 item 3): Debian's
``prometheus`` started by ``scripts/local-prometheus`` (an instance of its own: directory and
port), scraping live ``linkwise serve`` loops in shadow mode on the shared local Slurm: one
on a heuristic, one whose model cannot be loaded (it decides with the fallback), and one
address where nothing listens (a loop that is down). ``promtool`` checks the shipped files;
every PromQL expression of the Grafana dashboard and of the alert rules is asked of
Prometheus's HTTP API and must return a series (an alert's comparison, empty in normal
operation, is checked on its underlying expression); the fallback and loop-down alerts go
pending for the loops that are in those states, and for no other."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from linkwise.cluster.slurm.client import SlurmClient, read_env_file
from linkwise.cluster.slurm.errors import SlurmError

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[2]
OPS = ROOT / "ops"
DASHBOARD = OPS / "grafana" / "linkwise-serve.json"
RULES = OPS / "prometheus" / "rules.yml"
CONFIG = OPS / "prometheus" / "prometheus.yml"
SCRIPT = ROOT / "scripts" / "local-prometheus"
SLURM_DIR = Path(os.environ.get("LINKWISE_SLURM_DIR", "/tmp/linkwise-slurm"))

# Grafana's variables, as Grafana would expand them for "All" loops
GRAFANA_VARS = {"$__rate_interval": "1m", "$instance": ".+"}
# alerts whose expression is empty in normal operation -> the part that must return a series
# (each a substring of the alert's expression)
UNDERLYING = {
    "LinkwiseLoopNotCycling": 'increase(linkwise_serve_cycles_total{outcome="ok"}[5m])',
    "LinkwiseLeaseExpired": "linkwise_serve_lease_expires_timestamp",
    "LinkwiseJobHeldTooLong": "linkwise_serve_oldest_hold_seconds",
    "LinkwiseDecisionLatencyOverBudget": (
        "histogram_quantile(0.99, sum by (job, instance, le) "
        "(rate(linkwise_serve_decision_seconds_bucket[10m])))"
    ),
    "LinkwisePolicyErrors": 'increase(linkwise_serve_fallbacks_total{reason="decide_error"}[10m])',
    "LinkwiseRecordsLost": "increase(linkwise_serve_lost_records_total[15m])",
}
RHS_ALSO = {"LinkwiseJobHeldTooLong": "linkwise_serve_max_hold_seconds + 60"}
# alerts over series only a loop with data exports (a calibration fitted on the cluster, its
# telemetry): the live loops here have none, and say so -> the series that must say it
WITHOUT_DATA = {
    "LinkwiseContentionModelDrift": (
        'linkwise_serve_slowdown_unobserved_jobs{reason="no_calibration"}'
    ),
}

# the drift series of single running jobs (only with a cluster calibration and telemetry)
PER_JOB_DRIFT = (
    "linkwise_serve_slowdown_ratio",
    "linkwise_serve_slowdown_observed",
    "linkwise_serve_slowdown_predicted",
)


def require_slurm(env_file: Path) -> None:
    """The shared local Slurm answers (other engineers' jobs may keep its nodes busy)."""
    try:
        SlurmClient.from_env(read_env_file(env_file), "cli").nodes()
    except (OSError, SlurmError) as exc:
        pytest.fail(
            f"local Slurm is not up in {SLURM_DIR} ({exc}): run `scripts/local-slurm start`"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.5)


class Prom:
    """Prometheus's HTTP API."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/api/v1"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.loads(r.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return list(data["result"])


def _serve(env_file: str, tmp: Path, name: str, port: int, policy: str) -> subprocess.Popen[bytes]:
    args = [
        sys.executable, "-m", "linkwise.cli", "serve", "--mode", "shadow",
        "--partition", "gpu", "--slurm-env", env_file, "--policy", policy,
        "--db", str(tmp / f"{name}.duckdb"), "--state-dir", str(tmp / f"{name}-state"),
        "--lease-root", str(tmp / "leases"), "--interval", "1", "--metrics-port", str(port),
    ]  # fmt: skip
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    env_file = SLURM_DIR / "env"
    require_slurm(env_file)
    tmp = tmp_path_factory.mktemp("prom-live")
    (tmp / "broken-package").mkdir()
    ports = {"good": _free_port(), "fallback": _free_port(), "down": _free_port()}
    loops = [
        _serve(str(env_file), tmp, "good", ports["good"], "backfill"),
        # a package folder that is there but holds no package: serve starts (a missing one
        # is refused at start), its load fails, and it falls back to the heuristic
        _serve(str(env_file), tmp, "fallback", ports["fallback"], f"model:{tmp}/broken-package"),
    ]
    # the shipped configuration, pointed at these loops and scraping every second
    config = yaml.safe_load(CONFIG.read_text())
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(RULES)]
    job = config["scrape_configs"][0]
    job["static_configs"][0]["targets"] = [f"127.0.0.1:{p}" for p in ports.values()]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    prom_port = _free_port()
    penv = {
        **os.environ,
        "LINKWISE_PROM_DIR": str(tmp / "prom"),
        "LINKWISE_PROM_PORT": str(prom_port),
        "LINKWISE_PROM_CONFIG": str(tmp / "prometheus.yml"),
    }
    try:
        subprocess.run([str(SCRIPT), "start"], env=penv, check=True, timeout=600)
        prom = Prom(prom_port)
        instances = {k: f"127.0.0.1:{p}" for k, p in ports.items()}

        def scraped() -> bool:
            ups = {r["metric"]["instance"]: r["value"][1] for r in prom.query("up")}
            n = prom.query(f'count_over_time(up{{instance="{instances["good"]}"}}[1m])')
            ok = prom.query('linkwise_serve_cycles_total{outcome="ok"} >= 2')
            return (
                ups.get(instances["good"]) == "1"
                and ups.get(instances["fallback"]) == "1"
                and ups.get(instances["down"]) == "0"
                and bool(n)
                and float(n[0]["value"][1]) >= 8
                and {r["metric"]["instance"] for r in ok}
                == {instances["good"], instances["fallback"]}
            )

        wait_for(scraped, 300, "Prometheus scraping both loops, each past two cycles")
        yield {"prom": prom, "instances": instances, "tmp": tmp, "job": job["job_name"]}
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=penv, check=False, timeout=60)
        for p in loops:
            p.send_signal(signal.SIGTERM)
        for p in loops:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return exprs


def _grafana(expr: str) -> str:
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    m = re.fullmatch(r"label_values\((\w+), (\w+)\)", expr)
    return f"count by ({m[2]}) ({m[1]})" if m else expr


def _rules() -> list[dict[str, Any]]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_checks_the_rules_and_the_config() -> None:
    subprocess.run([str(SCRIPT), "install"], check=True, timeout=600)  # promtool comes with it
    rules = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert f"{len(_rules())} rules found".encode() in rules.stdout
    config = subprocess.run(["promtool", "check", "config", str(CONFIG)], capture_output=True)
    assert config.returncode == 0, config.stdout + config.stderr


def test_prometheus_scrapes_the_live_loops(live: dict[str, Any]) -> None:
    prom, inst = live["prom"], live["instances"]
    targets = {t["labels"]["instance"]: t for t in prom.get("targets")["activeTargets"]}
    assert targets[inst["good"]]["health"] == "up"
    assert targets[inst["fallback"]]["health"] == "up"
    assert targets[inst["down"]]["health"] == "down"
    assert all(t["labels"]["job"] == live["job"] == "linkwise-serve" for t in targets.values())
    cycles = prom.query(f'linkwise_serve_cycles_total{{instance="{inst["good"]}",outcome="ok"}}')
    assert cycles and float(cycles[0]["value"][1]) >= 1  # the loop cycles


def test_every_dashboard_expression_returns_a_series(live: dict[str, Any]) -> None:
    """Every expression returns a series; the per-job drift panels only with a calibration
    fitted on the cluster, which the live loops here lack: they say so instead (the names
    are checked against the loop's metrics in tests/ops/test_dashboard.py)."""
    prom = live["prom"]
    names = set(prom.get("label/__name__/values"))
    exprs = _dashboard_exprs()
    assert len(exprs) >= 20
    for expr in exprs:
        if any(m in expr for m in PER_JOB_DRIFT):
            assert prom.query(WITHOUT_DATA["LinkwiseContentionModelDrift"]), expr
            continue
        for metric in re.findall(r"\blinkwise_\w+", expr):  # no misspelt name
            assert metric in names, (metric, expr)
        assert prom.query(_grafana(expr)), f"no series: {expr}"
    info = prom.query('linkwise_serve_calibration_info{source="shipped"}')
    assert info and all(float(s["value"][1]) == 1 for s in info)  # no fit here: shipped


def test_every_alert_expression_evaluates_and_returns_a_series(live: dict[str, Any]) -> None:
    prom = live["prom"]
    rules = _rules()
    assert {r["alert"] for r in rules} >= {
        "LinkwiseLoopDown",
        "LinkwiseLeaseExpired",
        "LinkwiseJobHeldTooLong",
        "LinkwiseDecisionLatencyOverBudget",
        "LinkwiseFallbackToHeuristic",
    }
    assert set(UNDERLYING) <= {r["alert"] for r in rules}
    for rule in rules:
        expr = rule["expr"]
        result = prom.query(expr)  # parses and evaluates
        parts = [UNDERLYING[rule["alert"]]] if rule["alert"] in UNDERLYING else []
        parts += [RHS_ALSO[rule["alert"]]] if rule["alert"] in RHS_ALSO else []
        for part in parts:
            assert part in expr, (rule["alert"], part)
            assert prom.query(part), f"{rule['alert']}: no series for {part}"
        if rule["alert"] in WITHOUT_DATA:
            companion = WITHOUT_DATA[rule["alert"]]
            assert prom.query(companion), f"{rule['alert']}: no series for {companion}"
        elif not parts:
            assert result, f"{rule['alert']}: no series for {expr}"
    # Prometheus itself evaluated every rule without an error
    loaded = [r for g in prom.get("rules")["groups"] for r in g["rules"]]
    assert len(loaded) == len(rules)
    assert all(r["health"] == "ok" and not r.get("lastError") for r in loaded), loaded


def test_the_alerts_go_pending_for_the_loops_in_those_states(live: dict[str, Any]) -> None:
    prom, inst = live["prom"], live["instances"]

    def alerting(name: str) -> set[str]:
        alerts = prom.get("alerts")["alerts"]
        return {a["labels"]["instance"] for a in alerts if a["labels"]["alertname"] == name}

    wait_for(lambda: inst["fallback"] in alerting("LinkwiseFallbackToHeuristic"), 60, "fallback")
    wait_for(lambda: inst["down"] in alerting("LinkwiseLoopDown"), 60, "loop down")
    assert alerting("LinkwiseFallbackToHeuristic") == {inst["fallback"]}
    assert alerting("LinkwiseLoopDown") == {inst["down"]}
    info = prom.query("linkwise_serve_model_info == 1")
    policies = {r["metric"]["instance"]: r["metric"]["policy"] for r in info}
    assert policies == {inst["good"]: "backfill", inst["fallback"]: "backfill"}
    # no lease in shadow mode: the lease alert does not fire
    assert not prom.query(next(r["expr"] for r in _rules() if r["alert"] == "LinkwiseLeaseExpired"))


def test_the_latency_alert_uses_the_promotion_budget() -> None:
    gates = tomllib.loads((ROOT / "evaluation" / "gates.toml").read_text())
    budget_s = next(v for k, v in _walk(gates) if k == "latency_budget_ms") / 1000
    rule = next(r for r in _rules() if r["alert"] == "LinkwiseDecisionLatencyOverBudget")
    assert rule["expr"].rstrip().endswith(f"> {budget_s:g}")


def _walk(d: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _walk(v)
        else:
            yield k, v
