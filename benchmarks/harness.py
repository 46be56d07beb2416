"""The benchmark harness: every area runs as ``python -m benchmarks.AREA [--quick]``, one result JSON per run.

A driver is a module ``benchmarks/AREA/NAME.py`` with ``main()`` (its own command line, run as
``python -m benchmarks.AREA.NAME``) and ``BENCH``, a :class:`Driver` saying what the driver
measures as its baseline, the arguments of its quick run and of its default run, and how its
own report becomes the result's summary and claims. The area's ``__main__`` calls
:func:`area_main`, which runs each driver in a child process, reads the report it wrote and
writes ``benchmarks/AREA/results/NAME.json`` (quick runs: a temporary folder, never the repo)
with the keys every result carries: ``area``, ``name``, ``command``, ``date``, ``revision``,
``machine``, ``seed``, ``baseline``, ``results``, ``claims``.

``{tmp}`` in a driver's arguments is a fresh temporary folder of the run, ``{report}`` the
path its report is written to, ``{repo}`` the repository's root, ``{supernet}`` the shipped
supernet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
AREAS = ("supernet", "profile", "pareto", "convert_fuse", "precision", "serve", "offload", "adapt",
         "reliability")
EMBEDDED_SUPERNET = "hmt/data/embedded/supernet-cifar-resnet56"
REQUIRED_KEYS = ("area", "name", "command", "date", "revision", "machine", "seed", "baseline",
                 "results", "claims")

Claims = list[dict[str, str]]


@dataclass(frozen=True)
class Driver:
    """How the harness runs one driver and reads what it wrote."""

    baseline: str
    """What the driver measures as its baseline, in the same run (plain words)."""
    quick: Sequence[str] | None = None
    """Arguments of the quick run (well under a minute on a 2-core CPU); None: no quick path."""
    default: Sequence[str] | None = None
    """Arguments of ``python -m benchmarks.AREA`` (no --quick); None: the driver needs inputs
    (a GPU, a trained supernet, a data set) given on its own command line."""
    needs: str = ""
    """Why there is no quick or default run (shown when it is skipped)."""
    seed: int | None = 0
    report: str = "{report}"
    """Where the driver writes its report."""
    out_args: Sequence[str] = ("--out", "{report}")
    """Appended to a run with the user's own arguments, so the report lands where the harness reads it."""
    summarise: Callable[[Any], Any] | None = None
    """The report -> the result's ``results`` (default: the report as written)."""
    claims: Callable[[Any], Claims] | None = None
    """The report -> the result's ``claims`` ({"claim", "figure"} in plain words)."""
    timeout_s: float = 3600.0
    extra: dict[str, Any] = field(default_factory=dict)


def machine() -> dict[str, Any]:
    """CPU model, logical cores, OS and Python of this machine; no hostname, no paths."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": model, "logical_cpus": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "load_avg_1m": load}


def revision() -> str:
    """The code revision (git short sha, ``+dirty`` when the tree has changes), or ``unknown``."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                             text=True, check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def utc_now() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def make_result(*, area: str, name: str, command: str, seed: int | None, baseline: str, results: Any,
                claims: Claims, date: str | None = None, rev: str | None = None,
                machine_info: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A result document with every required key (date, revision and machine default to now/here)."""
    doc: dict[str, Any] = {"area": area, "name": name, "command": command, "date": date or utc_now(),
                           "revision": rev or revision(), "machine": machine_info or machine(),
                           "seed": seed, "baseline": baseline, "results": results, "claims": claims}
    doc.update(extra)
    return doc


def write_result(path: Path, doc: dict[str, Any]) -> Path:
    """Write one result JSON atomically (a temporary file in the same folder, then a rename)."""
    missing = [key for key in REQUIRED_KEYS if key not in doc]
    if missing:
        raise ValueError(f"result {path.name}: missing keys {missing}")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
    return path


def driver_names(area: str) -> list[str]:
    """The drivers of an area: modules of ``benchmarks/AREA/`` that define ``BENCH = Driver(...)``.

    Found by reading the sources, not importing them: drivers import torch and the like, which
    only the child process that runs one should pay for."""
    names = []
    for path in sorted((ROOT / area).glob("*.py")):
        if not path.name.startswith("_") and "\nBENCH = Driver(" in path.read_text():
            names.append(path.stem)
    return names


def declares_run(area: str, name: str, mode: str) -> bool:
    """Whether the driver's ``BENCH = Driver(...)`` gives a ``quick`` or ``default`` run, read
    from its source (a child process that imports the driver only to skip it costs seconds)."""
    import ast

    tree = ast.parse((ROOT / area / f"{name}.py").read_text())
    for node in tree.body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "BENCH" for t in node.targets)
                and isinstance(node.value, ast.Call)):
            for keyword in node.value.keywords:
                if keyword.arg == mode:
                    return not (isinstance(keyword.value, ast.Constant) and keyword.value.value is None)
    return False


def load_driver(area: str, name: str) -> tuple[Any, Driver]:
    import importlib

    module = importlib.import_module(f"benchmarks.{area}.{name}")
    bench = getattr(module, "BENCH", None)
    if not isinstance(bench, Driver):
        raise TypeError(f"benchmarks.{area}.{name}: BENCH is not a benchmarks.harness.Driver")
    return module, bench


def _expand(args: Sequence[str], values: dict[str, str]) -> list[str]:
    """The placeholders ``{name}`` of ``values`` replaced; other braces (a JSON argument) kept as they are."""
    import re

    pattern = re.compile(r"\{(" + "|".join(re.escape(k) for k in values) + r")\}") if values else None
    return [pattern.sub(lambda m: values[m.group(1)], arg) if pattern else arg for arg in args]


def child_env() -> dict[str, str]:
    """The environment of a driver's process: the repository importable (``benchmarks``, ``hmt``)."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def run_here(area: str, name: str, mode: str, args: Sequence[str], out_dir: Path, command: str) -> Path | None:
    """Run one driver in this process (``mode``: quick, default or args), then write its result JSON.

    None (and nothing written) when the driver has no run of that mode."""
    module, bench = load_driver(area, name)
    if mode == "quick":
        chosen = bench.quick
    elif mode == "default":
        chosen = bench.default
    else:
        chosen = [*args, *bench.out_args]
    if chosen is None:
        print(f"[{area}.{name}] skipped: needs {bench.needs or 'its own arguments'}", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory(prefix=f"hmt-bench-{area}-{name}-") as tmp:
        values = {"tmp": tmp, "report": str(Path(tmp) / "report.json"), "repo": str(REPO),
                  "supernet": str(REPO / EMBEDDED_SUPERNET)}
        argv = _expand(chosen, values)
        started = time.monotonic()
        print(f"[{area}.{name}] {shlex.join(argv)}", file=sys.stderr, flush=True)
        saved = sys.argv
        sys.argv = [str(module.__file__), *argv]
        try:
            code = module.main()
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = saved
        if code not in (None, 0):
            raise RuntimeError(f"benchmarks.{area}.{name} exited {code}")
        if _asks_help(argv):  # the driver printed its help: nothing to record
            return None
        report = read_report(Path(bench.report.format(**values)))
        if report is None:
            raise RuntimeError(f"benchmarks.{area}.{name} wrote no report at {bench.report}")
        results = bench.summarise(report) if bench.summarise else report
        claims = bench.claims(report) if bench.claims else []
        doc = make_result(area=area, name=name, command=command, seed=bench.seed, baseline=bench.baseline,
                          results=results, claims=claims, wall_s=round(time.monotonic() - started, 1))
        return write_result(out_dir / f"{name}.json", doc)


def read_report(path: Path) -> Any:
    """A driver's report: a JSON file, a CSV (its rows), or a folder of JSON files (name -> content)."""
    if path.is_dir():
        found = {p.name: json.loads(p.read_text()) for p in sorted(path.glob("*.json"))}
        return found or None
    if not path.is_file():
        return None
    if path.suffix == ".csv":
        import csv

        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    return json.loads(path.read_text())


def run_driver(area: str, name: str, mode: str, args: Sequence[str], out_dir: Path, command: str,
               timeout_s: float = 3600.0) -> Path | None:
    """Run one driver in a child process (its imports, threads and signals stay there); None: skipped."""
    started = time.time() - 1.0
    child = [sys.executable, "-m", "benchmarks._run", area, name, mode, str(out_dir), command, *args]
    proc = subprocess.run(child, cwd=REPO, env=child_env(), timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmarks.{area}.{name} ({mode}) exited {proc.returncode}")
    path = out_dir / f"{name}.json"
    return path if path.is_file() and path.stat().st_mtime >= started else None


def _asks_help(args: Sequence[str]) -> bool:
    return any(arg in ("-h", "--help") for arg in args)


def area_main(area: str, argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.AREA [--quick] [--out-dir DIR] [NAME [ARGS ...]]``."""
    parser = argparse.ArgumentParser(prog=f"python -m benchmarks.{area}",
                                     description=f"Run the {area} benchmarks; one result JSON per driver.")
    parser.add_argument("--quick", action="store_true",
                        help="each driver's quick run, results in a temporary folder (not the repo)")
    parser.add_argument("--out-dir", type=Path, default=None,
                        help=f"where result JSONs go (default benchmarks/{area}/results/)")
    parser.add_argument("--list", action="store_true", help="list the drivers and exit")
    parser.add_argument("name", nargs="?", help="run one driver with ARGS (its own command line)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the driver's arguments")
    ns = parser.parse_args(argv)
    names = driver_names(area)
    if ns.list:
        for name in names:
            bench = load_driver(area, name)[1]
            print(f"{name}: baseline {bench.baseline}" + (f" (needs {bench.needs})" if bench.needs else ""))
        return 0
    typed = shlex.join(["python", "-m", f"benchmarks.{area}", *(argv if argv is not None else sys.argv[1:])])
    if ns.name is not None:
        if ns.name not in names:
            parser.error(f"unknown driver {ns.name!r}; {area} has {', '.join(names) or 'none'}")
        mode = "args" if ns.args else ("quick" if ns.quick else "default")
        selected = [(ns.name, mode)]
    else:
        selected = [(name, "quick" if ns.quick else "default") for name in names]
    if ns.quick and ns.out_dir is None:
        out_ctx: Any = tempfile.TemporaryDirectory(prefix=f"hmt-bench-{area}-quick-")
        out_dir = Path(out_ctx.name)
    else:
        out_ctx = None
        out_dir = ns.out_dir or ROOT / area / "results"
    ran = failed = 0
    try:
        for name, mode in selected:
            if mode in ("quick", "default") and not declares_run(area, name, mode):
                print(f"[{area}.{name}] no {mode} run: python -m benchmarks.{area} --list says what it needs",
                      file=sys.stderr)
                continue
            try:
                path = run_driver(area, name, mode, ns.args, out_dir, typed)
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                print(f"[{area}.{name}] failed: {exc}", file=sys.stderr)
                failed += 1
                continue
            if path is None:
                continue
            ran += 1
            doc = json.loads(path.read_text())
            for claim in doc["claims"]:
                print(f"[{area}.{name}] {claim['claim']}: {claim['figure']}")
            print(f"[{area}.{name}] wrote {path} ({doc['wall_s']} s)", file=sys.stderr)
    finally:
        if out_ctx is not None:
            out_ctx.cleanup()
    if ran == 0 and not failed and _asks_help(ns.args):
        return 0  # the driver printed its help
    if ran == 0:
        print(f"benchmarks.{area}: nothing ran", file=sys.stderr)
    return 1 if failed or ran == 0 else 0
