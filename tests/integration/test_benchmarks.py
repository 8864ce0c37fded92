"""The benchmark still runs: one harness, scenario modules that import no other scenario
module, and two scenarios end to end on SQLite at tiny sizes (a smoke test, not a timing)."""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "benchmarks" / "scenarios"


def bench(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def test_scenario_modules_import_the_harness_and_no_other_scenario() -> None:
    modules = sorted(SCENARIOS.glob("*.py"))
    assert len(modules) > 3
    for path in modules:
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported |= {f"{node.module}.{alias.name}" for alias in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        assert not {name for name in imported if name.startswith("benchmarks.scenarios")}, path.name


def test_the_harness_imports_nothing_of_the_benchmark_so_no_import_circle() -> None:
    """The scenario modules import the harness and the CLI imports both; the harness
    imports neither (it used to load the scenarios, which import it back)."""
    imported = set()
    for node in ast.walk(ast.parse((ROOT / "benchmarks" / "harness.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("benchmarks."):
            imported.add(node.value)  # a dynamic import by name
    assert not {name for name in imported if name == "benchmarks" or name.startswith("benchmarks.")}


def test_every_scenario_is_listed_with_its_help() -> None:
    listed = bench("--list")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()}
    for scenario in (
        "enqueue",
        "drain",
        "latency",
        "claim",
        "prune",
        "stats",
        "scale",
        "sqlite-load",
        "poolers",
        "limits",
    ):
        assert scenario in names
    assert {
        "in-process", "otel-overhead", "profile-drain", "hot-statements", "index-review", "executors", "dependencies",
        "ceiling", "bytecodes",
    } <= names  # fmt: skip


def test_enqueue_and_a_drain_run_on_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench(
        "enqueue,drain", "--subjects", "watchdog", "--dialects", "sqlite", "--repeat", "1", "--jobs", "20",
        "--concurrencies", "2", "--drain-rows", "p1", "--json", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| enqueue (jobs/s), SQLite" in run.stdout
    assert "| c2 p1" in run.stdout
    assert '"errors": []' in out.read_text()


def test_enqueue_a_drain_and_the_polled_latency_run_on_mariadb(mysql_server: URL, tmp_path: Path) -> None:
    """The MariaDB rows: enqueue, an AsyncRunner (aiomysql) drain, and the start latency of a sync
    Runner that polls, which says the poll_interval it used; the run's databases are gone after it."""
    out = tmp_path / "bench.json"
    server = mysql_server.render_as_string(hide_password=False)
    run = bench(
        "enqueue,drain,latency", "--quick", "--subjects", "watchdog", "--dialects", "mariadb", "--jobs", "20",
        "--concurrencies", "2", "--drain-rows", "async", "--samples", "3", "--json", str(out),
        env={"WATCHDOG_BENCH_MYSQL": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| enqueue (jobs/s), MariaDB" in run.stdout and "| 1,000 jobs per statement" in run.stdout
    assert "| async c2 p1" in run.stdout  # the sync Runner is the latency row's
    assert "| enqueue-to-start p95 (ms)" in run.stdout
    body = json.loads(out.read_text())
    assert body["errors"] == []
    latency = body["runs"]["enqueue-to-start latency (ms), MariaDB (runner polls)"]
    assert latency["the runner's poll_interval (ms)"]["watchdog"] == [250.0]  # the default where nothing wakes it
    admin = create_engine(mysql_server)
    try:
        with admin.connect() as conn:
            left = conn.execute(text("SHOW DATABASES LIKE 'watchdog\\_bench\\_%'")).scalars().all()
    finally:
        admin.dispose()
    assert not [name for name in left if name.startswith(f"watchdog_bench_{body['machine']['pid']}_")], left


@pytest.mark.slow  # ten seconds of child processes each: CI runs it, a day's run need not
def test_the_executors_scenario_runs_on_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench("executors", "--quick", "--dialects", "sqlite", "--jobs", "6", "--json", str(out), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| CPU-bound handler, ~10 ms (jobs/s), SQLite" in run.stdout
    assert "| process p1" in run.stdout and "| no-op handler (jobs/s), SQLite" in run.stdout
    assert "bare multiprocessing pool" in run.stdout, "the machine's ceiling is measured beside the executor"
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # ten seconds of child processes each: CI runs it, a day's run need not
def test_the_limits_scenario_runs_on_sqlite(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = bench(
        "limits", "--subjects", "watchdog", "--dialects", "sqlite", "--repeat", "1", "--jobs", "20", "--json", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| concurrency 16, 1 per key (100 keys)" in run.stdout
    assert "| limits: one claim of 16 (ms), SQLite" in run.stdout
    assert "| concurrency 16, 1 per key (10,000 keys)" in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # pgbench's runs and a subprocess: CI runs it, a day's run need not
def test_the_raw_sql_ceiling_runs_pgbench_on_postgresql(postgres_server: URL, tmp_path: Path) -> None:
    """The pgbench script drains every job it is given (the scenario checks
    none is left unsettled) beside the library's drain of as many."""
    out = tmp_path / "bench.json"
    server = postgres_server.set(drivername="postgresql").render_as_string(hide_password=False)
    run = bench(
        "ceiling", "--quick", "--jobs", "300", "--clients", "2", "--json", str(out), timeout=300,
        env={"WATCHDOG_BENCH_POSTGRES": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| raw SQL, pgbench 2 clients" in run.stdout and "| sqlalchemy_watchdog, c64 p2" in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # half a minute to a minute of child processes: CI runs it, a day's run need not
def test_the_history_dependency_and_otel_scenarios_run_on_sqlite(tmp_path: Path) -> None:
    """Claims beside settled and delayed rows, the dependency rows and the OpenTelemetry drain
    (a child process given its database as a Target) each produce their rows."""
    out = tmp_path / "bench.json"
    run = bench(
        "claim,delayed,dependencies,otel-overhead", "--quick", "--dialects", "sqlite", "--rows", "500",
        "--parents", "10", "--links", "20", "--jobs", "30", "--json", str(out), timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for row in ("| 500 settled rows", "| 500 delayed jobs", "| ratio", "| chain of 20: claim + settle per link (ms)"):
        assert row in run.stdout
    assert "| fan-in of 10: settle every parent (ms)" in run.stdout and "| sqlite " in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # half a minute to a minute of child processes: CI runs it, a day's run need not
def test_the_in_process_and_producer_scenarios_run_on_postgresql(postgres_server: URL, tmp_path: Path) -> None:
    """A runner draining in the enqueueing process and 16 producer processes, each a child
    process given its database, report their rows."""
    out = tmp_path / "bench.json"
    server = postgres_server.set(drivername="postgresql").render_as_string(hide_password=False)
    run = bench(
        "inprocess,producers", "--quick", "--subjects", "watchdog", "--jobs", "100", "--json", str(out),
        timeout=600, env={"WATCHDOG_BENCH_POSTGRES": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "| Runner, concurrency 4" in run.stdout and "| defaults, in-process" in run.stdout
    assert "| every queue, its defaults" in run.stdout and "| watchdog, NOTIFY trigger disabled" in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # ten seconds of profiled enqueues: CI runs it, a day's run need not
def test_the_enqueue_profile_measures_every_layer_on_postgresql(postgres_server: URL, tmp_path: Path) -> None:
    """The one-job enqueue's profile (README.md) reports each layer and the
    server's execution of the library's INSERT beside a plain row's."""
    out = tmp_path / "bench.json"
    server = postgres_server.set(drivername="postgresql").render_as_string(hide_password=False)
    run = bench(
        "enqueue-profile", "--quick", "--subjects", "watchdog", "--json", str(out), timeout=300,
        env={"WATCHDOG_BENCH_POSTGRES": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for row in ("| raw library INSERT, autocommit", "| enqueue(session, job) + commit", "| Watchdog(engine).enqueue"):
        assert row in run.stdout, run.stdout
    assert "library INSERT: server execution p50 (us)" in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # twenty seconds of child processes: CI runs it, a day's run need not
def test_the_growth_scenario_reports_every_cell_and_the_prune_on_postgresql(
    postgres_server: URL, tmp_path: Path
) -> None:
    """Each cell of backlog x history gets its rates, start latency and reads (the drain checks
    that exactly its jobs completed), and the prune beside a drain gets its windows."""
    out = tmp_path / "bench.json"
    server = postgres_server.set(drivername="postgresql").render_as_string(hide_password=False)
    run = bench(
        "growth", "--quick", "--backlogs", "400", "--histories", "0,500", "--jobs", "100", "--samples", "3",
        "--prune-rows", "500", "--json", str(out), timeout=300, env={"WATCHDOG_BENCH_POSTGRES": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    for row in ("| backlog 400, history 0 ", "| backlog 400, history 500 ", "| drain during the prune (jobs/s)"):
        assert row in run.stdout, run.stdout
    assert "drain (runner defaults) at backlog 400, history 500 >= 0.9x at backlog 400, history 0" in run.stdout
    assert '"errors": []' in out.read_text()


@pytest.mark.slow  # twenty seconds of churn: CI runs it, a day's run need not
def test_the_soak_samples_the_sizes_and_holds_xmin_midway_on_postgresql(postgres_server: URL, tmp_path: Path) -> None:
    """The churn soak samples the table's and each index's size, and a transaction held in the
    middle shows in the samples (the oldest xmin's age) and in the before/during/after rows."""
    out = tmp_path / "bench.json"
    server = postgres_server.set(drivername="postgresql").render_as_string(hide_password=False)
    run = bench(
        "soak", "--quick", "--minutes", "0.4", "--sample-every", "3", "--hold-minutes", "0.2", "--rate", "50",
        "--json", str(out), timeout=300, env={"WATCHDOG_BENCH_POSTGRES": server},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ix_live_queue (MB)" in run.stdout and "| t=24s" in run.stdout
    for row in ("settled/s, before", "settled/s, during", "settled/s, after"):
        assert row in run.stdout, run.stdout
    body = json.loads(out.read_text())
    assert body["errors"] == []
    samples = next(cells for title, cells in body["runs"].items() if title.startswith("soak samples"))
    held = [row["oldest xmin age (xacts)"][0] for row in samples.values() if row["xmin held"][0]]
    # Held from 6 s to 18 s: sampled at 9, 12 and 15 s, its age grows by every enqueue between
    # two samples (50 a second, each a transaction of its own), which no passing snapshot does.
    assert len(held) >= 2 and all(b - a >= 100 for a, b in itertools.pairwise(held)), samples
