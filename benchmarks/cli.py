"""The benchmark's command line: ``python -m benchmarks <scenario>[,<scenario>...] [options]``
(or ``benchmarks/run.py ...``), ``--list`` the scenarios, ``all`` the suite, ``--quick`` every
size small. It loads the scenario modules (``benchmarks/scenarios/*.py``, each importing only
:mod:`benchmarks.harness`), runs them through one :class:`~benchmarks.harness.Bench`, and
prints the tables as median (min-max) over the repeats. PostgreSQL: ``WATCHDOG_BENCH_POSTGRES``
(default ``postgresql://postgres@127.0.0.1:5432/postgres``); MariaDB (``--dialects ...,mariadb``):
``WATCHDOG_BENCH_MYSQL`` (default ``mysql+pymysql://root@127.0.0.1:3306/test``); the run's databases
(``watchdog_bench_<pid>_*``) are dropped at the end. See README.md."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import json
import os
import pkgutil
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from benchmarks import harness as h
from benchmarks import scenarios

#: The MariaDB server's settings in the header: its version and what a commit waits for (durable:
#: innodb_flush_log_at_trx_commit=1; sync_binlog matters only with log_bin on).
MARIADB_FACTS = ("version", "innodb_flush_log_at_trx_commit", "log_bin", "sync_binlog", "innodb_buffer_pool_size")


def machine_facts(workdir: Path, mariadb: bool = False) -> dict[str, Any]:
    """The machine, the servers' durability settings, the versions: the run's header (``mariadb``:
    the MariaDB server's too)."""
    facts: dict[str, Any] = {"nproc": os.cpu_count(), "python": platform.python_version(), "load_at_start": h.load()}
    facts["pid"] = os.getpid()  # the run's databases are watchdog_bench_<pid>_<name>
    with contextlib.suppress(Exception), psycopg.connect(h.ADMIN_DSN, autocommit=True) as conn:
        show = lambda name: conn.execute(pgsql.SQL("SHOW {}").format(pgsql.Identifier(name))).fetchone()[0]  # type: ignore[index]
        facts["postgresql"] = {
            s: show(s) for s in ("server_version", "fsync", "synchronous_commit", "wal_sync_method", "autovacuum")
        }
    if mariadb:
        with contextlib.suppress(Exception), contextlib.closing(h.mysql_connect(database="")) as maria:
            with maria.cursor() as cursor:
                cursor.execute("SELECT " + ", ".join(f"@@{name}" for name in MARIADB_FACTS))
                facts["mariadb"] = dict(zip(MARIADB_FACTS, cursor.fetchone(), strict=True))
    with contextlib.closing(sqlite3.connect(str(workdir / "facts.db"))) as lite:
        facts["sqlite"] = {p: lite.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous")}
        facts["sqlite"]["version"] = sqlite3.sqlite_version
    facts["packages"] = {}
    for package in (
        "sqlalchemy-watchdog",
        "SQLAlchemy",
        "psycopg",
        "procrastinate",
        "pgqueuer",
        "asyncpg",
        "PyMySQL",
        "aiomysql",
    ):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            facts["packages"][package] = importlib.metadata.version(package)
    git = lambda *a: subprocess.run(["git", "-C", str(h.ROOT), *a], capture_output=True, text=True).stdout.strip()
    dirty = "+dirty" if git("status", "--porcelain", "--", "sqlalchemy_watchdog") else ""
    facts["watchdog_commit"] = git("rev-parse", "--short", "HEAD") + dirty
    return facts


def describe(facts: dict[str, Any]) -> str:
    pg, lite = facts.get("postgresql", {"error": "not reachable"}), facts["sqlite"]
    maria = f"MariaDB {', '.join(f'{k}={v}' for k, v in facts['mariadb'].items())}\n" if "mariadb" in facts else ""
    return (
        f"machine: {facts['nproc']} CPUs, load {facts['load_at_start']} at start; Python {facts['python']}\n"
        f"PostgreSQL {', '.join(f'{k}={v}' for k, v in pg.items())}\n{maria}"
        f"SQLite {lite['version']}: journal_mode={lite['journal_mode']}, synchronous={lite['synchronous']} (defaults)\n"
        f"versions: {', '.join(f'{k} {v}' for k, v in facts['packages'].items())}; watchdog at {facts['watchdog_commit']}"
    )


def cell(values: list[float | None]) -> str:
    """median (min-max), in the median's precision."""
    mid, present = h.median(values), [v for v in values if v is not None and v == v]  # v == v: not NaN
    spread = f" ({h.fmt(min(present), mid)}-{h.fmt(max(present), mid)})" if len(present) > 1 else ""
    return "-" if mid is None else h.fmt(mid) + spread


def columns(table: h.Table) -> list[str]:
    return list(dict.fromkeys(c for row in table.cells.values() for c in row))


def render(table: h.Table) -> str:
    base = table.ratios if table.ratios in (names := columns(table)) else None
    others = [c for c in names if c != base] if base else []
    head, body = [table.title, *names, *(f"{base} vs {c}" for c in others)], []
    for row, values in table.cells.items():
        cells = [cell(values.get(c, [])) for c in names]
        for other in others:
            a, b = h.median(values.get(base or "", [])), h.median(values.get(other, []))
            ratio = ((b / a) if "(ms" in row or "(us" in row else (a / b)) if a and b else None
            cells.append("-" if ratio is None else f"{ratio:.2f}x")
        body.append([row, *cells])
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) + " |"  # fmt: skip
    out = [line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *(line(r) for r in body)]
    if others:
        out.append(f"ratios: throughput {base}/other, latency (ms, us) other/{base} -- above 1.00x {base} is better")
    return "\n".join(out)


def plot(tables: dict[str, h.Table], directory: Path) -> list[Path]:
    """A grouped bar chart of the medians of every table that names a chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for table in (t for t in tables.values() if t.chart and t.cells):
        rows, names = list(table.cells), columns(table)
        fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.9), 5))
        width = 0.8 / len(names)
        for i, column in enumerate(names):
            values = [h.median(table.cells[row].get(column, [])) or 0 for row in rows]
            ax.bar([x + i * width for x in range(len(rows))], values, width, label=column)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(rows))])
        ax.set_xticklabels(rows, rotation=35, ha="right", fontsize=8)
        ax.set_title(f"{table.title} (median of the repeats)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path := directory / str(table.chart), dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def parser() -> argparse.ArgumentParser:
    for module in pkgutil.iter_modules(scenarios.__path__):
        importlib.import_module(f"benchmarks.scenarios.{module.name}")
    listing = "\n".join(f"  {s.name:<16} {s.help}{' [suite]' if s.suite else ''}" for s in h.SCENARIOS.values())
    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=f"{__doc__}\nscenarios:\n{listing}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("scenarios", nargs="?", default=None, help="comma-separated scenarios, or 'all' (the suite)")
    p.add_argument("--list", action="store_true", help="list the scenarios and exit")
    p.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke test")
    p.add_argument("--repeat", "--repeats", type=int, default=None, help="runs per figure (default 3, --quick 1)")
    p.add_argument("--subjects", default="watchdog,procrastinate,pgqueuer", help="queues compared (default: all three)")
    p.add_argument("--dialects", default="postgresql,sqlite", help="where a scenario runs on both (default both)")
    p.add_argument("--json", type=Path, default=None, help="also write every run, the medians and the checks here")
    p.add_argument("--plot", type=Path, default=None, help="write the charts (PNG, matplotlib) into this directory")
    p.add_argument("--workdir", type=Path, default=None, help="keep files and logs here, not in a temporary directory")
    for flag, (kind, text) in sorted(h.OPTIONS.items()):
        p.add_argument(flag, default=None, help=text, **({"action": kind} if kind == "store_true" else {"type": kind}))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--role"]:  # a child process: benchmarks --role module:function json
        module, _, name = argv[1].partition(":")
        h.exit_with_parent()
        getattr(importlib.import_module(module), name)(**h.decode(argv[2]))
        return 0
    p = parser()
    args = p.parse_args(argv)
    if args.list or not args.scenarios:
        print("\n".join(f"{s.name:<16} {s.help}" for s in h.SCENARIOS.values()))
        return 0 if args.list else 2
    names = [s for s in args.scenarios.split(",") if s]
    names = [n for n, s in h.SCENARIOS.items() if s.suite] if names == ["all"] else names
    if unknown := [n for n in names if n not in h.SCENARIOS]:
        p.error(f"unknown scenario {unknown[0]!r}; --list shows them")
    chosen = [h.SCENARIOS[n] for n in names]
    # MariaDB only when asked for; an unreachable server skips its rows, listed as a failure (exit 1).
    unreachable = h.mysql_unreachable() if "mariadb" in args.dialects.split(",") else None
    if unreachable:
        print(f"skipping MariaDB: {unreachable}", file=sys.stderr)
        args.dialects = ",".join(d for d in args.dialects.split(",") if d != "mariadb")

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # raises KeyboardInterrupt: report what was measured
    with tempfile.TemporaryDirectory(prefix="watchdog_bench_") as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        facts = machine_facts(workdir, mariadb="mariadb" in args.dialects.split(","))
        print(describe(facts), file=sys.stderr, flush=True)
        if facts.get("postgresql", {}).get("fsync") != "on" or facts["postgresql"].get("synchronous_commit") != "on":
            print("WARNING: the server is not at durable defaults; figures are not comparable", file=sys.stderr)
        if facts.get("postgresql", {}).get("autovacuum") == "off":
            # Dead row versions stay until a VACUUM: a run that churns (soak) measures bloat, not a deployment.
            print(
                "WARNING: autovacuum is off on the PostgreSQL server; the soak measures nothing real", file=sys.stderr
            )
        if str(facts.get("mariadb", {}).get("innodb_flush_log_at_trx_commit", 1)) != "1":
            print("WARNING: MariaDB does not flush its log at each commit; figures are not comparable", file=sys.stderr)
        bench = h.Bench(args, workdir)
        if unreachable:
            bench.errors.append(f"MariaDB rows skipped: {unreachable}")
        # Per-repeat scenarios interleave (repeat 1 of each, then repeat 2, ...); the others repeat inside themselves.
        steps = [(s, (r,)) for r in range(bench.repeat) for s in chosen if s.per_repeat]
        try:
            for scene, rest in steps + [(s, ()) for s in chosen if not s.per_repeat]:
                bench.log(f"=== {scene.name}" + (f": repeat {rest[0] + 1} of {bench.repeat}" if rest else "") + " ===")
                try:
                    scene.run(bench, *rest)
                except Exception as error:
                    bench.fail(scene.name, error)
        except KeyboardInterrupt:
            print("interrupted; reporting what was measured", file=sys.stderr)
        finally:
            bench.close()
    elapsed = time.monotonic() - bench.started
    print(f"\n{describe(facts)}\n{', '.join(names)}: medians (min-max) of {bench.repeat} run(s), {elapsed:.0f}s\n")
    print("\n\n".join(render(t) for t in bench.tables.values() if t.cells))
    print(f"\nload at the end: {h.load()}")
    for path in plot(bench.tables, args.plot) if args.plot else []:
        print(f"wrote {path}")
    if bench.checks:
        print("\ntargets:", *(f"  [{'met' if c['met'] else 'MISSED'}] {c['target']}: {c['measured']}" for c in bench.checks), sep="\n")  # fmt: skip
    if bench.errors:
        print(f"\n{len(bench.errors)} measurement(s) failed:")
        print(*("  - " + failure.replace("\n", "\n    ") for failure in bench.errors), sep="\n")
    if args.json:
        runs = {t.title: t.cells for t in bench.tables.values()}
        body = {"machine": facts, "options": vars(args), "runs": runs, "targets": bench.checks, "errors": bench.errors}
        args.json.write_text(json.dumps(body, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 1 if bench.errors else 0
