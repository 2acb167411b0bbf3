"""jax_rccl.profile(): what the jax_rccl collectives of one's own program did inside a block.

The runtime keeps, per call site (a custom call's ``call_site`` identity, the same in every
executable and process holding the call), the executions (one per device and call), the calls
(counted on one device of this process), the bytes and the wall time of the executions, and the
plan's algorithm and protocol (ffi/core/stats.h: CallSiteStats). A profile reads them when the
block starts and when it ends; its rows are the differences.
"""

from __future__ import annotations

from typing import Any

from jax_rccl import _docs, _ffi, _jax_rccl

#: Bus bandwidth over algorithm bandwidth, as NCCL's tests define it, for a group of n: the
#: share of the message each rank's links carry.
_BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "ragged_all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "ppermute": lambda n: 1.0,
}

_PLOT_EXTRA = "pip install 'jax_rccl[plot]' (or pip install matplotlib)"


def _size(nbytes: float) -> str:
    """A byte count as text ("1.5 MiB"), for the profile's table and for explain()'s."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{int(nbytes)} B"


def _time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.4g} ms"
    return f"{seconds * 1e6:.4g} us"


class Profile:
    """Per call site, what the jax_rccl collectives that ran inside a ``with`` block did.

    Made by :func:`profile`. ``rows`` (also ``to_dict()["rows"]``) holds one dict per call
    site that ran: ``name`` (the collective and its axes), ``call_site``, ``kind``,
    ``group_size``, ``calls`` (in this process), ``executions`` (one per device and call, as
    :func:`jax_rccl.runtime_stats` counts them), ``bytes`` (a device's message per execution,
    summed), ``seconds`` (wall time of the executions, summed over devices), ``mean_us`` (per
    execution), ``algorithm``, ``protocol``, ``algbw_gbs`` (message / mean
    time) and ``busbw_gbs`` (the bus bandwidth of NCCL's tests: algbw times 2(n-1)/n for
    all_reduce, (n-1)/n for all_gather, reduce_scatter and all_to_all, 1 otherwise).
    ``runtime_stats`` holds the differences of :func:`jax_rccl.runtime_stats` over the block.

    The time is each device's wall time in the call, from the handler's entry to its return:
    on CPU the whole collective (waiting for peers included); on GPUs the host's part (the
    launch), not the kernel's run, and calls replayed inside a CUDA graph are not seen (nor
    counted by runtime_stats).
    """

    def __init__(self) -> None:
        self._start: dict[int, dict[str, Any]] | None = None
        self._start_stats: dict[str, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.runtime_stats: dict[str, int] = {}
        self.running = False

    def __enter__(self) -> Profile:
        _ffi.ensure_registered()
        self._start = {s["call_site"]: s for s in _jax_rccl.call_site_stats()}
        self._start_stats = _ffi.runtime_stats()
        self.running = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.running = False
        end = _jax_rccl.call_site_stats()
        stats = _ffi.runtime_stats()
        self.runtime_stats = {k: v - self._start_stats.get(k, 0) for k, v in stats.items()}
        start = self._start or {}
        rows = []
        for s in end:
            before = start.get(s["call_site"], {})
            delta = {k: s[k] - before.get(k, 0) for k in ("executions", "calls", "bytes", "ns")}
            if delta["executions"] <= 0:
                continue
            n = int(s["group_size"])
            execs = delta["executions"]
            mean_s = delta["ns"] / execs / 1e9
            per_exec = delta["bytes"] / execs
            algbw = per_exec / mean_s / 1e9 if mean_s > 0 else 0.0
            factor = _BUS_FACTORS.get(s["kind"], lambda n: 1.0)(n) if n > 1 else 0.0
            rows.append(
                {
                    "name": s["name"],
                    "call_site": s["call_site"],
                    "kind": s["kind"],
                    "group_size": n,
                    "calls": delta["calls"],
                    "executions": execs,
                    "bytes": delta["bytes"],
                    "seconds": delta["ns"] / 1e9,
                    "mean_us": mean_s * 1e6,
                    "algorithm": s["algorithm"],
                    "protocol": s["protocol"],
                    "algbw_gbs": algbw,
                    "busbw_gbs": algbw * factor,
                }
            )
        rows.sort(key=lambda r: -r["seconds"])
        self.rows = rows

    def to_dict(self) -> dict[str, Any]:
        """``{"rows": [...], "runtime_stats": {...}}``: the rows (see the class) and the
        runtime's counters over the block."""
        return {"rows": [dict(r) for r in self.rows], "runtime_stats": dict(self.runtime_stats)}

    def table(self) -> str:
        """The rows as a text table, the longest total time first, with a total line."""
        head = (
            f"{'call site':<32} {'kind':<15} {'calls':>6} {'execs':>6} {'bytes/exec':>11} "
            f"{'time/exec':>10} {'total':>9}  {'algo/proto':<14} {'busbw':>10}"
        )
        lines = [head, "-" * len(head)]
        for r in self.rows:
            choice = f"{r['algorithm']}/{r['protocol']}" if r["algorithm"] else "-"
            name = r["name"] if len(r["name"]) <= 32 else r["name"][:29] + "..."
            lines.append(
                f"{name:<32} {r['kind']:<15} {r['calls']:>6} {r['executions']:>6} "
                f"{_size(r['bytes'] / r['executions']):>11} {_time(r['mean_us'] / 1e6):>10} "
                f"{_time(r['seconds']):>9}  {choice:<14} {r['busbw_gbs']:>6.3g} GB/s"
            )
        total_execs = sum(r["executions"] for r in self.rows)
        total_s = sum(r["seconds"] for r in self.rows)
        lines.append("-" * len(head))
        lines.append(
            f"{'total':<32} {'':<15} {sum(r['calls'] for r in self.rows):>6} {total_execs:>6} "
            f"{'':>11} {'':>10} {_time(total_s):>9}"
        )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return f"Profile({len(self.rows)} call site(s))"

    def plot(self, path: str | None = None) -> Any:
        """A bar chart per call site: its total time, with its bus bandwidth and choice.

        Needs matplotlib (the ``plot`` extra: ``pip install 'jax_rccl[plot]'``); without it an
        ImportError says so.

        Args:
            path: where to save the figure (any format matplotlib writes); None: not saved.

        Returns:
            The ``matplotlib.figure.Figure``.
        """
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError(
                f"jax_rccl.profile().plot() needs matplotlib, the 'plot' extra: {_PLOT_EXTRA}"
            ) from None
        rows = list(reversed(self.rows))
        fig = Figure(figsize=(8, 1.2 + 0.5 * max(len(rows), 1)), layout="constrained")
        ax = fig.add_subplot()
        labels = [r["name"] for r in rows]
        totals = [r["seconds"] * 1e3 for r in rows]
        bars = ax.barh(labels, totals, color="tab:blue")
        for bar, r in zip(bars, rows, strict=True):
            ax.annotate(
                f" {r['calls']} calls, {r['algorithm']}/{r['protocol']}, "
                + f"busbw {r['busbw_gbs']:.3g} GB/s",
                (bar.get_width(), bar.get_y() + bar.get_height() / 2),
                va="center",
                fontsize=8,
            )
        ax.set_xlim(0, 1.7 * max(totals, default=1.0))  # room for the notes right of the bars
        ax.set_xlabel("time in the call, summed over devices (ms)")
        ax.set_title("jax_rccl.profile: time per call site")
        if path is not None:
            fig.savefig(path)
        return fig


@_docs.fill
def profile() -> Profile:
    """A context manager that records what the jax_rccl collectives run inside its block did.

    Use it as ``with jax_rccl.profile() as p:`` around the calls of your program (wait for
    their results, e.g. ``jax.block_until_ready``, inside the block: a call still running when
    the block ends is not counted), then read ``p.table()``, ``p.rows``, ``p.to_dict()`` or
    ``p.plot()``. The runtime keeps the figures per call site all the time (a few atomic
    additions per execution); a profile takes their differences over the block.

    Returns:
        A Profile, filled when the block ends: per call site its calls, executions, bytes,
        time, algorithm/protocol and bus bandwidth.

    Example:
        {example_psum}
        >>> x = np.ones((8, 1024), np.float32)
        >>> with jr.profile() as p:
        ...     for _ in range(10):
        ...         _ = f(x).block_until_ready()
        >>> row = p.rows[0]
        >>> row["name"], row["calls"], row["executions"], row["bytes"] // row["executions"]
        ("psum over ('i',)", 10, 80, 4096)
        >>> p.runtime_stats["executions"]
        80
        >>> print(p.table().splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
        call site  kind  calls  execs  bytes/exec  time/exec  total  algo/proto  busbw
    """
    return Profile()
