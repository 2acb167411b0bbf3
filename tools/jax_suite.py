"""Run JAX's own collective tests with and without ``jax_rccl.install()`` and compare them.

The test files come from the JAX release under test, fetched outside this repository (never
committed), e.g. for jax 0.10.2::

    git -C <jax clone> archive jax-v0.10.2 tests conftest.py pyproject.toml | tar -x -C /tmp/jaxsrc

Keeping JAX's ``conftest.py`` and ``pyproject.toml`` next to ``tests/`` makes pytest use JAX's
own settings (its warning filters among them), as JAX's CI does.

Run (each file is one pytest run; per-test outcomes go to a JSON file)::

    python tools/jax_suite.py --jax-tests /tmp/jaxsrc/tests --no-install --out base.json
    python tools/jax_suite.py --jax-tests /tmp/jaxsrc/tests --install --out rccl.json
    python tools/jax_suite.py --compare base.json rccl.json

``--compare`` prints passed/failed/skipped/error counts per file for both runs and lists every
test that passes without ``install()`` and does not pass with it (exit status 1 if any).

What runs: ``shard_map_test.py`` and ``pmap_test.py`` whole; of ``batching_test.py``,
``export_test.py``, ``export_harnesses_multi_platform_test.py`` and ``api_test.py`` only the
collective tests. Those are found by reading the fetched files (with ``ast``) at run time: a test
is taken when its body names a jax.lax collective (psum, all_gather, ppermute, axis_index, ...),
``pmap``, ``shard_map`` or ``axis_env``. ``--list`` prints that selection without running it.

The environment is JAX's CPU one for multi-device tests: ``XLA_FLAGS`` gets
``--xla_force_host_platform_device_count=8`` and ``JAX_SKIP_SLOW_TESTS`` is ``true`` as in
JAX's pytest CI (``--slow`` keeps the slow tests). With ``--install`` every pytest process calls
``jax_rccl.install()`` before collecting (importing) any test module; nothing else changes.
pytest-xdist (``-n``) and pytest-timeout (``--timeout``) are used when the interpreter has them.
``--python`` picks the interpreter that runs the tests (default: this one); it needs jax, the
test dependencies of JAX (pytest, absl-py, hypothesis, ...) and, for ``--install``, jax_rccl.

This same file is the pytest plugin the runs load (``-p jax_suite``): the hooks below select the
tests, call ``install()`` and write the per-test outcomes.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import inspect
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# The test files and, for the ones not run whole, that they are filtered to collective tests.
FILES: dict[str, bool] = {
    "shard_map_test.py": False,
    "pmap_test.py": False,
    "batching_test.py": True,
    "export_test.py": True,
    "export_harnesses_multi_platform_test.py": True,
    "api_test.py": True,
}

# Names whose mention (as a name or an attribute) makes a test a collective test.
COLLECTIVE_NAMES = frozenset(
    {
        "psum",
        "pmax",
        "pmin",
        "pmean",
        "pargmax",
        "pargmin",
        "all_gather",
        "all_gather_invariant",
        "psum_scatter",
        "all_to_all",
        "ragged_all_to_all",
        "ppermute",
        "pshuffle",
        "pswapaxes",
        "pbroadcast",
        "psend",
        "precv",
        "axis_index",
        "pmap",
        "shard_map",
    }
)
# Named only as attributes (``lax.axis_size``), since tests also use them as variable names.
COLLECTIVE_ATTRS = frozenset({"axis_size"})
# Keyword arguments that mark a test (``make_jaxpr(f, axis_env=...)``).
COLLECTIVE_KEYWORDS = frozenset({"axis_env"})

OUTCOMES = ("passed", "failed", "skipped", "error", "xfailed", "xpassed")
DEVICE_FLAG = "--xla_force_host_platform_device_count=8"

# Environment variables through which the runner talks to the plugin in the pytest processes.
ENV_INSTALL = "JAX_SUITE_INSTALL"
ENV_SELECT = "JAX_SUITE_SELECT"
ENV_REPORT = "JAX_SUITE_REPORT"


# --------------------------------------------------------------------------------------------
# Selection: which tests of a file are collective tests.


def _mentions_collective(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in COLLECTIVE_NAMES:
            return True
        if isinstance(n, ast.Attribute) and (
            n.attr in COLLECTIVE_NAMES or n.attr in COLLECTIVE_ATTRS
        ):
            return True
        if isinstance(n, ast.keyword) and n.arg in COLLECTIVE_KEYWORDS:
            return True
    return False


def collective_tests(path: Path) -> list[str]:
    """``Class.test_name`` of every test method of ``path`` whose body is a collective test."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if (
                isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
                and fn.name.startswith("test")
                and _mentions_collective(fn)
            ):
                found.append(f"{cls.name}.{fn.name}")
    return found


def selection(tests_dir: Path, files: list[str]) -> dict[str, list[str] | None]:
    """Per file: the ``Class.test`` names to keep, or None to run the file whole."""
    return {f: collective_tests(tests_dir / f) if FILES.get(f, False) else None for f in files}


# --------------------------------------------------------------------------------------------
# The pytest plugin (loaded in every pytest process with ``-p jax_suite``).

try:  # The runner itself may run where pytest is not installed.
    import pytest as _pytest

    _hookwrapper = _pytest.hookimpl(hookwrapper=True)
except ImportError:

    def _hookwrapper(f: Any) -> Any:
        return f


def pytest_configure(config: Any) -> None:
    """Adds the recorder (in the process that sees every report, not in xdist's workers) and
    calls ``jax_rccl.install()`` when the runner asks, before any test module is imported."""
    if os.environ.get(ENV_REPORT) and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_Recorder(), "jax_suite_recorder")
    if os.environ.get(ENV_INSTALL) != "1":
        return
    import pytest

    try:
        import jax_rccl
    except ImportError as e:
        raise pytest.UsageError(f"--install: jax_rccl does not import here: {e}") from e
    install = getattr(jax_rccl, "install", None)
    if install is None:
        raise pytest.UsageError(
            f"--install: this jax_rccl ({jax_rccl.__file__}) has no install(); "
            "build and install a jax_rccl that has it"
        )
    install()


def _rccl_executions() -> int | None:
    """jax_rccl's count of custom-call executions in this process (None: jax_rccl not imported,
    as in a run without install() unless JAX_RCCL_LAX=1 installed it at JAX's start-up)."""
    if "jax_rccl" not in sys.modules:
        return None
    return int(sys.modules["jax_rccl"].runtime_stats().get("executions", 0))


@_hookwrapper
def pytest_runtest_call(item: Any) -> Any:
    """Where jax_rccl is imported, notes how many jax_rccl custom calls the test ran (its report
    carries it, also from xdist's workers), to show that install() took the collectives over."""
    before = _rccl_executions()
    try:
        yield
    finally:
        after = _rccl_executions()
        if before is not None and after is not None:
            item.user_properties.append(("rccl_executions", after - before))


def _defining_name(item: Any) -> str | None:
    """``Class.test`` where the test item's function is written (parameterized ones included)."""
    fn = getattr(item, "obj", None)
    fn = getattr(fn, "__func__", fn)
    if fn is None:
        return None
    try:
        fn = inspect.unwrap(fn)
    except ValueError:
        pass
    qual = getattr(fn, "__qualname__", "")
    parts = qual.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else None


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Keeps, of the files filtered to collective tests, only those tests."""
    path = os.environ.get(ENV_SELECT)
    if not path:
        return
    wanted: dict[str, list[str] | None] = json.loads(Path(path).read_text())
    keep, drop = [], []
    for item in items:
        names = wanted.get(Path(str(item.fspath)).name)
        if names is None or _defining_name(item) in names:
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class _Recorder:
    """Per-test outcomes of one pytest run (in xdist's controller, reports of all workers)."""

    def __init__(self) -> None:
        self.tests: dict[str, dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = self.tests.setdefault(report.nodeid, {"outcome": None, "duration": 0.0})
        entry["duration"] = round(entry["duration"] + float(report.duration), 3)
        wasxfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if wasxfail:
                entry["outcome"] = "xpassed" if report.passed else "xfailed"
            else:
                entry["outcome"] = report.outcome
        elif report.when == "setup" and not report.passed:
            entry["outcome"] = "skipped" if report.skipped else "error"
        elif report.when == "teardown" and report.failed:
            entry["outcome"] = "error"
        for key, value in getattr(report, "user_properties", ()):
            if key == "rccl_executions":
                entry[key] = value
        if report.failed or (report.skipped and report.when != "teardown"):
            entry["message"] = _short_message(report)

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self.tests[report.nodeid or "<collection>"] = {
                "outcome": "error",
                "duration": 0.0,
                "message": _short_message(report),
            }

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        out = os.environ.get(ENV_REPORT)
        if out:
            data = {"exitstatus": int(exitstatus), "tests": self.tests}
            Path(out).write_text(json.dumps(data, indent=1, sort_keys=True))


def _short_message(report: Any) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:300]
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return str(crash.message)[:300]
    return str(report.longrepr).strip().splitlines()[-1][:300] if report.longrepr else ""


# --------------------------------------------------------------------------------------------
# The runner.


def _probe(python: str, code: str) -> str | None:
    """Runs ``code`` in ``python`` (``-P``: not importing from the current folder); its stdout,
    or None when it fails."""
    r = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else None


def _has_module(python: str, name: str) -> bool:
    return _probe(python, f"import {name}") is not None


def _check_install(python: str) -> str | None:
    """Why ``--install`` cannot run with ``python``, or None when it can."""
    r = subprocess.run(
        [python, "-P", "-c", "import jax_rccl; print(jax_rccl.__file__); jax_rccl.install"],
        capture_output=True,
        text=True,
    )
    if r.returncode == 0:
        return None
    last = (r.stderr.strip().splitlines() or ["?"])[-1]
    if "AttributeError" in last and "install" in last:
        return f"jax_rccl.install does not exist in the jax_rccl {python} imports ({last})"
    return f"jax_rccl does not import in {python}: {last}"


def _env(args: argparse.Namespace, select: Path, report: Path) -> dict[str, str]:
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = f"{flags} {DEVICE_FLAG}".strip()
    if not args.slow:
        env.setdefault("JAX_SKIP_SLOW_TESTS", "true")
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env[ENV_SELECT] = str(select)
    env[ENV_REPORT] = str(report)
    if args.install:
        env[ENV_INSTALL] = "1"
    else:
        env.pop(ENV_INSTALL, None)
    return env


def run(args: argparse.Namespace) -> int:
    tests_dir = Path(args.jax_tests).resolve()
    files = args.files.split(",") if args.files else list(FILES)
    missing = [f for f in files if not (tests_dir / f).is_file()]
    if missing:
        print(f"not in {tests_dir}: {', '.join(missing)}", file=sys.stderr)
        return 2
    chosen = selection(tests_dir, files)
    if args.list:
        for f, names in chosen.items():
            print(f"{f}: " + ("all tests" if names is None else f"{len(names)} tests"))
            for n in names or []:
                print(f"  {n}")
        return 0

    python = args.python or sys.executable
    if args.install:
        why = _check_install(python)
        if why:
            print(f"--install cannot run: {why}", file=sys.stderr)
            return 2
    versions = _probe(
        python,
        "import jax, jaxlib, sys; print(jax.__version__, jaxlib.__version__, "
        "sys.version.split()[0])",
    )
    if versions is None:
        print(f"jax does not import in {python}", file=sys.stderr)
        return 2
    jax_v, jaxlib_v, py_v = versions.split()
    rccl = _probe(python, "import jax_rccl; print(jax_rccl.__file__)")
    env_seen = {
        k: v for k, v in sorted(os.environ.items()) if k.startswith(("JAX_", "XLA_", "PYTHONPATH"))
    }

    base = [python, "-P", "-m", "pytest", "-p", "jax_suite", "-p", "no:cacheprovider", "-q"]
    base += ["--tb=short", "-o", "console_output_style=count"]
    notes = []
    if args.workers == "0":
        args.workers = None
    if args.workers and _has_module(python, "xdist"):
        base += ["-n", str(args.workers)]
    elif args.workers:
        notes.append("pytest-xdist is not installed: one process")
    if args.timeout and _has_module(python, "pytest_timeout"):
        base += ["--timeout", str(args.timeout)]
    elif args.timeout:
        notes.append("pytest-timeout is not installed: no per-test timeout")
    for n in notes:
        print(n, file=sys.stderr)

    out: dict[str, Any] = {
        "meta": {
            "install": bool(args.install),
            "jax": jax_v,
            "jaxlib": jaxlib_v,
            "python": py_v,
            "interpreter": python,
            "jax_rccl": rccl,
            "environment": env_seen,
            "jax_tests": str(tests_dir),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": shlex.join(sys.argv),
            "notes": notes,
            "files": {},
        },
        "tests": {},
    }
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jax_suite_") as tmp:
        select = Path(tmp) / "select.json"
        select.write_text(json.dumps(chosen))
        for f in files:
            report = Path(tmp) / f"{f}.json"
            cmd = base + [str(tests_dir / f)] + list(args.pytest_args)
            print(f"== {f}: {shlex.join(cmd)}", flush=True)
            t0 = time.monotonic()
            env = _env(args, select, report)
            rc = subprocess.run(cmd, cwd=tests_dir.parent, env=env).returncode
            wall = round(time.monotonic() - t0, 1)
            tests = json.loads(report.read_text())["tests"] if report.is_file() else {}
            if not tests:
                tests = {f: {"outcome": "error", "duration": wall, "message": f"pytest rc {rc}"}}
            out["tests"].update(tests)
            counts = Counter(t["outcome"] for t in tests.values())
            out["meta"]["files"][f] = {"rc": rc, "wall_s": wall, "counts": dict(counts)}
            print(f"== {f}: {_fmt_counts(counts)} in {wall} s (pytest rc {rc})", flush=True)
    out["meta"]["wall_s"] = round(time.monotonic() - t_all, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, sort_keys=True))
    print(f"wrote {args.out} ({len(out['tests'])} tests, {out['meta']['wall_s']} s)")
    return 0


# --------------------------------------------------------------------------------------------
# Comparison.


def _file_of(nodeid: str) -> str:
    return Path(nodeid.split("::", 1)[0]).name


def _per_file(tests: dict[str, dict[str, Any]]) -> dict[str, Counter[str]]:
    per: dict[str, Counter[str]] = {}
    for nodeid, t in tests.items():
        c = per.setdefault(_file_of(nodeid), Counter())
        c[t["outcome"]] += 1
        c["ran rccl"] += int(t.get("rccl_executions", 0) > 0)
    return per


def _fmt_counts(c: Counter[str] | dict[str, int]) -> str:
    return ", ".join(f"{c.get(k, 0)} {k}" for k in OUTCOMES if c.get(k, 0)) or "nothing"


def _outcome(tests: dict[str, dict[str, Any]], nodeid: str) -> str | None:
    t = tests.get(nodeid)
    return t["outcome"] if t else None


def compare(path_a: str, path_b: str) -> int:
    a = json.loads(Path(path_a).read_text())
    b = json.loads(Path(path_b).read_text())
    ta, tb = a["tests"], b["tests"]
    pa, pb = _per_file(ta), _per_file(tb)
    for label, path, d in (("A", path_a, a), ("B", path_b, b)):
        m = d["meta"]
        print(
            f"{label}: {path}: install={m['install']} jax {m['jax']} jaxlib {m['jaxlib']} "
            f"python {m['python']}, {m.get('wall_s', '?')} s"
        )
    # "ran rccl": tests (of any outcome) that executed jax_rccl custom calls.
    columns = (*OUTCOMES, "ran rccl")
    print(f"{'file':<42} {'run':<3} " + " ".join(f"{k:>8}" for k in columns))
    total: dict[str, Counter[str]] = {"A": Counter(), "B": Counter()}
    for f in sorted(set(pa) | set(pb)):
        for label, per in (("A", pa), ("B", pb)):
            c = per.get(f, Counter())
            total[label].update(c)
            print(f"{f:<42} {label:<3} " + " ".join(f"{c.get(k, 0):>8}" for k in columns))
    for label in ("A", "B"):
        c = total[label]
        print(f"{'total':<42} {label:<3} " + " ".join(f"{c.get(k, 0):>8}" for k in columns))

    good = {"passed", "xfailed"}
    lost = [n for n, t in ta.items() if t["outcome"] in good and _outcome(tb, n) not in good]
    gained = [n for n, t in tb.items() if t["outcome"] in good and _outcome(ta, n) not in good]
    print(f"\npass in A, not in B: {len(lost)}")
    for n in sorted(lost):
        t = tb.get(n)
        why = f"{t['outcome']}: {t.get('message', '')}" if t else "not run"
        print(f"  {n}\n      {why}")
    print(f"pass in B, not in A: {len(gained)}")
    for n in sorted(gained):
        t = ta.get(n)
        print(f"  {n}\n      A: {t['outcome'] + ': ' + t.get('message', '') if t else 'not run'}")
    return 1 if lost else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Arguments after -- go to every pytest run (e.g. -- -k psum).",
    )
    ap.add_argument("--jax-tests", help="the fetched tests/ folder of the JAX release")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--install", action="store_true", help="call jax_rccl.install() first")
    mode.add_argument("--no-install", dest="install", action="store_false", help="(default)")
    ap.add_argument("--out", default="build/jax_suite/results.json", help="per-test JSON")
    ap.add_argument("--files", help=f"comma-separated subset of {','.join(FILES)}")
    ap.add_argument("--python", help="interpreter that runs the tests (default: this one)")
    ap.add_argument(
        "-n", "--workers", default="2", help="pytest-xdist processes (a number or auto; 0: none)"
    )
    ap.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    ap.add_argument("--slow", action="store_true", help="keep JAX's slow tests")
    ap.add_argument("--list", action="store_true", help="print the selected tests and exit")
    ap.add_argument("--compare", nargs=2, metavar=("A.json", "B.json"), help="compare two runs")
    ap.add_argument("pytest_args", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.compare:
        return compare(*args.compare)
    if not args.jax_tests:
        ap.error("--jax-tests DIR is needed (or --compare A.json B.json)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
