"""``gpu-exporter record -- CMD ...``: run a command and record GPU use while it runs.

A thin layer over :mod:`exporter.python_api`: the samples and their aggregates are the Python
API's :class:`~exporter.python_api.Recording` (the JSON is its ``to_dict()``); this module adds
the command, its signals and the outputs.

CMD runs in the recorder's process group, as it would from the shell, so it keeps the
terminal. A Ctrl-C typed in the terminal reaches CMD directly (the terminal signals the whole
group); a SIGINT, SIGTERM, SIGHUP or SIGQUIT sent to the recorder alone (``kill``, a CI
runner) is forwarded to CMD exactly once. The recorder keeps sampling until CMD exits and then
exits with CMD's status (128 + N when CMD died of signal N, as the shell reports it), whatever
happens to the outputs. ``-o`` and ``--plot`` are checked for writability before CMD starts.

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
from typing import Any

from exporter.core.engine import Engine
from exporter.core.views import GIB
from exporter.platform.errors import ConfigError, fail
from exporter.platform.settings import OneLineParser
from exporter.python_api import checks
from exporter.python_api.recording import Recorder, Recording
from exporter.python_api.recording import sample as take_sample
from exporter.tools.audit import (
    add_backend_arguments,
    check_writable,
    checked,
    open_session,
    settings_from,
    setup_logging,
    write_file,
)

log = logging.getLogger(__name__)

PROG = "gpu-exporter record"
SI_KERNEL = 0x80  # Linux si_code of a signal the kernel (here: the terminal driver) sent
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
WATCHED = {*FORWARDED, signal.SIGCHLD}
PLOT_HINT = "--plot needs matplotlib: pip install matplotlib"


def status_line(rec: Recorder, elapsed: float, width: int) -> str:
    """One line: elapsed time, utilisation per GPU, total power."""
    latest = rec.latest()
    util = " ".join("-" if u is None else f"{u * 100:.0f}%" for _, u, _ in latest)
    power = sum(p for _, _, p in latest if p is not None)
    line = f"record {elapsed:6.1f}s | power {power:.0f} W | util {util}"
    return line[: max(10, width - 1)]


def plot_data(recording: Recording) -> dict[str, Any]:
    """What :func:`plot_figure` draws: the record JSON plus each GPU's samples in SI units."""
    result = recording.to_dict()
    for n, g in recording.gpus.items():
        result["gpu_stats"][str(n)]["_series"] = {
            "memory_used_bytes": list(g.memory_used_bytes.samples), "power_draw_w": list(g.power_watts.samples),
            "temperature_c": list(g.temperature_celsius.samples)}
    return result


def plot_title(result: dict[str, Any], host: str, simulated: bool) -> str:
    """The plot's heading: the command, then the host, the GPU model(s) and SIMULATED where it applies."""
    models = sorted({g["name"] or "unknown GPU" for g in result["gpu_stats"].values()})
    where = f"{host} · {', '.join(models) or 'no GPU'}" + (" · SIMULATED GPUs (not real data)" if simulated else "")
    return f"{' '.join(result['command'])[:90]}\n{where}"


def plot_figure(result: dict[str, Any], host: str, simulated: bool) -> Any:
    """One panel per reading, one line per GPU, against seconds since the start; the legend sits
    outside the panels (to their right), so it never hides a line."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    panels = (("utilization", "utilisation (%)", 1.0), ("memory_used_bytes", "memory used (GiB)", 1 / GIB),
              ("power_draw_w", "power (W)", 1.0), ("temperature_c", "temperature (°C)", 1.0))
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(11, 2.2 * len(panels)), layout="constrained")
    t = result["timestamps"]
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        for number, g in result["gpu_stats"].items():
            ys = g["utilization"]["samples"] if key == "utilization" else g["_series"][key]
            ax.plot(t, [float("nan") if y is None else y * scale for y in ys], label=f"gpu {number}", linewidth=1.2)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    fig.suptitle(plot_title(result, host, simulated), fontsize="medium")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", title="GPU")
    axes[-1].set_xlabel("seconds since start")
    return fig


def plot(result: dict[str, Any], path: str, host: str, simulated: bool) -> None:
    """Draw :func:`plot_figure` into the PNG ``path``; its Title text chunk repeats the heading."""
    import matplotlib.pyplot as plt

    fig = plot_figure(result, host, simulated)
    try:
        fig.savefig(path, format="png", dpi=100, metadata={"Title": plot_title(result, host, simulated)})
    finally:
        plt.close(fig)


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG, usage=f"{PROG} [--interval 1] [-o run.json] [--plot run.png] [backend flags] -- CMD ...",
        description="Run CMD, sample the GPUs every interval while it runs, write the aggregate; "
        "exit with CMD's status.")
    p.add_argument("--interval", type=float, default=1.0, metavar="SECONDS", help="seconds between samples "
                   f"(default 1; {checks.MIN_INTERVAL:g} to {checks.MAX_INTERVAL:g})")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="write the aggregate JSON here (default: a summary on stderr only)")
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
        lost = f"; LOST at {g['lost_at_seconds']:.1f} s ({g['lost_reason']})" if g["lost"] else ""
        lines.append(f"  gpu {number}: util mean {f(u['mean'], '{:.0f}')}% max {f(u['max'], '{:.0f}')}%, "
                     f"memory max {f(m['max'], '{:.0f}')} MiB, power mean {f(p['mean'], '{:.0f}')} W, "
                     f"energy {f(g['energy_joules'], '{:.0f}')} J{lost}")
    return "\n".join(lines) + "\n"


class _Run:
    def __init__(self, engine: Engine, command: list[str], interval: float, status: bool) -> None:
        self.engine = engine
        self.command = command
        self.interval = interval
        self.status = status
        self.rec = Recorder()
        self.t0 = 0.0

    def sample(self) -> None:
        """Take one sample; a failure is logged, never fatal (CMD must not be orphaned by it)."""
        try:
            take_sample(self.engine, self.rec, self.t0)
        except Exception as exc:  # the recorder keeps supervising CMD whatever happens
            log.warning("sample failed: %s: %s", type(exc).__name__, exc)
            log.debug("sample failed", exc_info=True)
            return
        if self.status:
            try:
                width = os.get_terminal_size(sys.stderr.fileno()).columns or 100  # 0 on a fresh pty
            except OSError:
                width = 100
            sys.stderr.write("\r\x1b[K" + status_line(self.rec, time.monotonic() - self.t0, width))
            sys.stderr.flush()

    def run(self, child_mask: set[signal.Signals]) -> tuple[int, float]:
        """Spawn CMD, sample until it exits; return (its exit code, duration in seconds)."""
        self.t0 = time.monotonic()
        self.sample()  # the baseline (first energy reading) before CMD starts
        try:
            pid = os.posix_spawnp(self.command[0], self.command, os.environ, setsigmask=child_mask)
        except FileNotFoundError:
            raise ConfigError(f"command not found: {self.command[0]}", code=127) from None
        except PermissionError:
            raise ConfigError(f"command not executable: {self.command[0]}", code=126) from None
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
    try:
        args = parser().parse_args(own)
        if not command:
            raise ConfigError("no command to run: put it after --, e.g. gpu-exporter record -- python train.py",
                            code=2)
        interval = checked(lambda: checks.check_interval(args.interval), "--interval")
        if args.plot:
            try:
                import matplotlib  # noqa: F401 - checked before CMD runs, not after an hour of benchmark
            except ImportError:
                raise ConfigError(PLOT_HINT, code=2) from None
        for path in (args.output, args.plot):
            if path:
                check_writable(path)  # before CMD runs: its samples must have somewhere to go
    except ConfigError as exc:
        return fail(PROG, exc)
    setup_logging()
    # Block the watched signals before any thread exists (engine, backends): threads inherit the
    # mask, so every signal stays pending for sigtimedwait in this thread.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    started = time.time()
    try:
        with open_session(args) as engine:
            pending = signal.sigpending() & set(FORWARDED)
            if pending:
                raise ConfigError(f"interrupted ({min(pending).name}) before {command[0]} started", code=130)
            run = _Run(engine, command, interval, sys.stderr.isatty() and not args.no_status)
            code, duration = run.run({signal.Signals(s) for s in old_mask})
    except ConfigError as exc:
        return fail(PROG, exc)
    finally:
        _drain()
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    recording = run.rec.result(started, duration, interval, command, code)
    _write(recording, args)
    return code  # CMD's status, always: a failed output is reported on stderr


def _write(recording: Recording, args: argparse.Namespace) -> None:
    """Write the outputs and say where; a failure is reported on stderr."""
    result = recording.to_dict()
    sys.stderr.write(_summary(result))
    if args.output:
        try:
            write_file(args.output, json.dumps(result, indent=2) + "\n")
            sys.stderr.write(f"{PROG}: wrote {args.output}\n")
        except ConfigError as exc:
            fail(PROG, exc)
    if args.plot:
        from exporter.core.host import host_info

        # auto never falls back to simulated GPUs in the tools: simulated means asked for by name
        simulated = "simulated" in settings_from(args).backend.split(",")
        try:
            plot(plot_data(recording), args.plot, host_info().node, simulated)
            sys.stderr.write(f"{PROG}: drew {args.plot}\n")
        except (OSError, ValueError) as exc:
            fail(PROG, ConfigError(f"cannot draw {args.plot}: {exc}", code=1))
