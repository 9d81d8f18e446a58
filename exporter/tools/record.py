"""``gpu-exporter record -- CMD ...``: run a command and record GPU use while it runs.

CMD runs in the recorder's process group, as it would from the shell, so it keeps the
terminal. A Ctrl-C typed in the terminal reaches CMD directly (the terminal signals the whole
group); a SIGINT, SIGTERM, SIGHUP or SIGQUIT sent to the recorder alone (``kill``, a CI
runner) is forwarded to CMD exactly once. The recorder keeps sampling until CMD exits and then
exits with CMD's status (128 + N when CMD died of signal N, as the shell reports it).

Signals are taken synchronously with ``sigtimedwait``: its ``si_code`` tells a signal from the
terminal (SI_KERNEL, CMD got it too) from one sent with kill() (SI_USER, forward it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from exporter.core.snapshot import Snapshot
from exporter.serve.engine import Engine
from exporter.tools.audit import (
    MIB,
    ToolError,
    add_backend_arguments,
    fail,
    iso_time,
    numbered,
    open_engine,
    setup_logging,
    write_file,
)

log = logging.getLogger(__name__)

PROG = "gpu-exporter record"
SI_KERNEL = 0x80  # Linux si_code of a signal the kernel (here: the terminal driver) sent
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
WATCHED = {*FORWARDED, signal.SIGCHLD}
PLOT_HINT = "--plot needs matplotlib: pip install 'gpu-exporter[plot]' (or pip install matplotlib)"


@dataclass
class Series:
    """Samples of one GPU; ``None`` where the GPU did not report the reading."""

    name: str | None
    uuid: str
    utilization: list[float | None] = field(default_factory=list)  # percent
    memory_used_mb: list[float | None] = field(default_factory=list)  # MiB (nvidia-smi memory.used)
    memory_usage_percent: list[float | None] = field(default_factory=list)
    temperature_c: list[float | None] = field(default_factory=list)
    power_draw_w: list[float | None] = field(default_factory=list)
    energy_first: float | None = None  # J, energy counter at the first sample that had it
    energy_last: float | None = None

    def pad(self, n: int) -> None:
        """A GPU that appeared late (or missed samples) gets None for them."""
        for s in (self.utilization, self.memory_used_mb, self.memory_usage_percent, self.temperature_c,
                  self.power_draw_w):
            s.extend([None] * (n - len(s)))


def _agg(values: list[float | None], digits: int = 3) -> dict[str, float | None]:
    vs = [v for v in values if v is not None]
    if not vs:
        return {"min": None, "max": None, "mean": None}
    return {"min": round(min(vs), digits), "max": round(max(vs), digits),
            "mean": round(sum(vs) / len(vs), digits)}


class Recording:
    def __init__(self) -> None:
        self.times: list[float] = []
        self.gpus: dict[int, Series] = {}

    def add(self, snap: Snapshot, t: float) -> None:
        n = len(self.times)
        for number, _backend, g in numbered(snap):
            s = self.gpus.setdefault(number, Series(g.name, g.uuid))
            s.pad(n)
            up = g.up
            total, used = g.memory_total_bytes, g.memory_used_bytes
            util = g.utilization_ratio
            s.utilization.append(util * 100 if up and util is not None else None)
            s.memory_used_mb.append(used / MIB if up and used is not None else None)
            s.memory_usage_percent.append(100 * used / total if up and used is not None and total else None)
            s.temperature_c.append(g.temperature_celsius.get("gpu") if up else None)
            s.power_draw_w.append(g.power_watts if up else None)
            if up and g.energy_joules is not None:
                if s.energy_first is None:
                    s.energy_first = g.energy_joules
                s.energy_last = g.energy_joules
        self.times.append(t)
        for s in self.gpus.values():
            s.pad(len(self.times))

    def result(self, command: list[str], exit_code: int, started: float, duration: float,
               interval: float) -> dict[str, Any]:
        """The autotuner's aggregate shape (schema: RECORD)."""
        stats: dict[str, Any] = {}
        for number, s in sorted(self.gpus.items()):
            energy = None
            if s.energy_first is not None and s.energy_last is not None and s.energy_last >= s.energy_first:
                energy = round(s.energy_last - s.energy_first, 3)
            stats[str(number)] = {
                "name": s.name,
                "uuid": s.uuid,
                "utilization": {**_agg(s.utilization),
                                "samples": [None if v is None else round(v, 3) for v in s.utilization]},
                "memory_used_mb": _agg(s.memory_used_mb),
                "memory_usage_percent": _agg(s.memory_usage_percent),
                "temperature_c": _agg(s.temperature_c),
                "power_draw_w": _agg(s.power_draw_w),
                "energy_joules": energy,
            }
        return {
            "command": command,
            "exit_code": exit_code,
            "started": iso_time(started),
            "interval_seconds": interval,
            "monitoring_duration_seconds": round(duration, 3),
            "sample_count": len(self.times),
            "gpu_stats": stats,
            "timestamps": [round(t, 3) for t in self.times],
        }

    def status(self, elapsed: float, width: int) -> str:
        """One line: elapsed time, utilisation per GPU, total power."""
        utils = [s.utilization[-1] for _, s in sorted(self.gpus.items()) if s.utilization]
        power = [p for s in self.gpus.values() if s.power_draw_w and (p := s.power_draw_w[-1]) is not None]
        util = " ".join("-" if u is None else f"{u:.0f}%" for u in utils)
        line = f"record {elapsed:6.1f}s | power {sum(power):.0f} W | util {util}"
        return line[: max(10, width - 1)]


def plot(result: dict[str, Any], path: str) -> None:
    """One panel per reading, one line per GPU, against seconds since the start."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    panels = (("utilization", "utilisation (%)"), ("memory_used_mb", "memory used (MiB)"),
              ("power_draw_w", "power (W)"), ("temperature_c", "temperature (C)"))
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(10, 2.2 * len(panels)))
    t = result["timestamps"]
    for ax, (key, title) in zip(axes, panels, strict=True):
        for number, g in result["gpu_stats"].items():
            ys = g["utilization"]["samples"] if key == "utilization" else g["_series"][key]
            ax.plot(t, [float("nan") if y is None else y for y in ys], label=f"gpu {number}", linewidth=1.2)
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    axes[0].set_title(" ".join(result["command"])[:100])
    axes[0].legend(loc="upper right", fontsize="small", ncol=4)
    axes[-1].set_xlabel("seconds since start")
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=100)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} [--interval 1] [-o run.json] [--plot run.png] [backend flags] -- CMD ...",
        description="Run CMD, sample the GPUs every interval while it runs, write the aggregate; "
        "exit with CMD's status.")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between samples "
                   "(default 1)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the aggregate JSON here (default: a summary on stderr)")
    p.add_argument("--plot", metavar="PNG",
                   help="draw one panel per reading into this PNG (needs matplotlib)")
    p.add_argument("--no-status", action="store_true", help="no live status line, even on a terminal")
    add_backend_arguments(p)
    return p


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _drain() -> None:
    """Consume signals still pending on the way out, so unblocking cannot raise KeyboardInterrupt."""
    while signal.sigtimedwait(WATCHED, 0) is not None:
        pass


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def _summary(result: dict[str, Any]) -> str:
    lines = [f"{PROG}: {result['monitoring_duration_seconds']:.1f} s, {result['sample_count']} samples, "
             f"exit {result['exit_code']}"]
    f = _f
    for number, g in result["gpu_stats"].items():
        u, m, p = g["utilization"], g["memory_used_mb"], g["power_draw_w"]
        lines.append(f"  gpu {number}: util mean {f(u['mean'], '{:.0f}')}% max {f(u['max'], '{:.0f}')}%, "
                     f"memory max {f(m['max'], '{:.0f}')} MiB, power mean {f(p['mean'], '{:.0f}')} W, "
                     f"energy {f(g['energy_joules'], '{:.0f}')} J")
    return "\n".join(lines) + "\n"


class _Run:
    def __init__(self, engine: Engine, command: list[str], interval: float, status: bool) -> None:
        self.engine = engine
        self.command = command
        self.interval = interval
        self.status = status
        self.rec = Recording()
        self.t0 = 0.0

    def sample(self) -> None:
        """Take one sample; a failure is logged, never fatal (CMD must not be orphaned by it)."""
        try:
            self._sample()
        except Exception:  # the recorder keeps supervising CMD whatever happens
            log.warning("sample failed", exc_info=True)

    def _sample(self) -> None:
        snap = self.engine.scrape().snap
        failed = [n for n, st in snap.stats.items() if not st.success]
        if failed:
            log.warning("sample skipped: collection failed for backend %s", ", ".join(failed))
            return
        elapsed = time.monotonic() - self.t0
        self.rec.add(snap, elapsed)
        if self.status:
            try:
                width = os.get_terminal_size(sys.stderr.fileno()).columns or 100  # 0 on a fresh pty
            except OSError:
                width = 100
            sys.stderr.write("\r\x1b[K" + self.rec.status(elapsed, width))
            sys.stderr.flush()

    def run(self, child_mask: set[signal.Signals]) -> tuple[int, float]:
        """Spawn CMD, sample until it exits; return (its exit code, duration in seconds)."""
        self.t0 = time.monotonic()
        self.sample()  # the baseline (first energy reading) before CMD starts
        try:
            pid = os.posix_spawnp(self.command[0], self.command, os.environ, setsigmask=child_mask)
        except FileNotFoundError:
            raise ToolError(f"command not found: {self.command[0]}", code=127) from None
        except PermissionError:
            raise ToolError(f"command not executable: {self.command[0]}", code=126) from None
        next_t = self.t0 + self.interval
        while True:
            info = signal.sigtimedwait(WATCHED, max(0.0, next_t - time.monotonic()))
            if info is not None and info.si_signo != signal.SIGCHLD and info.si_code != SI_KERNEL:
                try:
                    os.kill(pid, info.si_signo)
                except ProcessLookupError:
                    pass
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                duration = time.monotonic() - self.t0
                self.sample()  # the state CMD left behind
                if self.status:
                    sys.stderr.write("\r\x1b[K")
                return _exit_code(status), duration
            if time.monotonic() >= next_t:
                self.sample()
                next_t += self.interval
                if next_t <= time.monotonic():  # a slow collection: skip the missed ticks, keep the rhythm
                    next_t = time.monotonic() + self.interval


def main(argv: list[str]) -> int:
    if "--" in argv:
        split = argv.index("--")
        own, command = argv[:split], argv[split + 1:]
    else:
        own, command = argv, []
    args = parser().parse_args(own)
    if not command:
        return fail(PROG, ToolError("no command to run: put it after --, e.g. gpu-exporter record -- python "
                                    "train.py", code=2))
    if not 0.05 <= args.interval <= 3600:
        return fail(PROG, ToolError(f"--interval {args.interval:g}: expected seconds in 0.05..3600", code=2))
    if args.plot:
        try:
            import matplotlib  # noqa: F401 - checked before CMD runs, not after an hour of benchmark
        except ImportError:
            return fail(PROG, ToolError(PLOT_HINT, code=2))
    setup_logging()
    # Block the watched signals before any thread exists (engine, backends): threads inherit the
    # mask, so every signal stays pending for sigtimedwait in this thread.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    engine: Engine | None = None
    started = time.time()
    try:
        engine = open_engine(args)
        pending = signal.sigpending() & set(FORWARDED)
        if pending:
            raise ToolError(f"interrupted ({min(pending).name}) before {command[0]} started", code=130)
        run = _Run(engine, command, args.interval, sys.stderr.isatty() and not args.no_status)
        code, duration = run.run({signal.Signals(s) for s in old_mask})
    except ToolError as exc:
        return fail(PROG, exc)
    finally:
        if engine is not None:
            engine.stop()
        _drain()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    result = run.rec.result(command, code, started, duration, args.interval)
    problems = _write(result, run.rec, args)
    if problems:
        return code or 1
    return code


def _write(result: dict[str, Any], rec: Recording, args: argparse.Namespace) -> bool:
    """Write the outputs; True when one of them failed (reported on stderr)."""
    failed = False
    if args.output:
        try:
            write_file(args.output, json.dumps(result, indent=2) + "\n")
        except ToolError as exc:
            fail(PROG, exc)
            failed = True
    else:
        sys.stderr.write(_summary(result))
    if args.plot:
        series = {str(n): {"memory_used_mb": s.memory_used_mb, "power_draw_w": s.power_draw_w,
                           "temperature_c": s.temperature_c} for n, s in rec.gpus.items()}
        stats = {n: {**g, "_series": series[n]} for n, g in result["gpu_stats"].items()}
        to_plot = {**result, "gpu_stats": stats}
        try:
            plot(to_plot, args.plot)
        except (OSError, ValueError) as exc:
            fail(PROG, ToolError(f"cannot draw {args.plot}: {exc}"))
            failed = True
    return failed
