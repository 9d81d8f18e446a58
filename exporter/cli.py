"""``gpu-exporter`` console script. Subcommands import their own code lazily, so that
``serve`` never loads the Kubernetes client or the profiler (tens of MiB)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

USAGE = """usage: gpu-exporter <command> [options]

commands:
  serve      serve GPU metrics on :9400/metrics (Prometheus exporter)
  profile    classify GPU usage from Prometheus and annotate Nodes
  snapshot   one-shot audit of the GPUs and the host (table or JSON)
  diff       compare two snapshots; non-zero exit when the system changed
  record     run a command and record GPU use while it runs
  pick       print the N least-loaded GPU indices for CUDA_VISIBLE_DEVICES
  version    print the version (also: gpu-exporter --version)

Run 'gpu-exporter <command> --help' for a command's options.
"""


def _serve(argv: Sequence[str]) -> int:
    from exporter.serve.main import main

    return main(argv)


def _profile(argv: Sequence[str]) -> int:
    from exporter.profiler.main import run

    return run(list(argv))


def _snapshot(argv: Sequence[str]) -> int:
    from exporter.tools.snapshot import main

    return main(list(argv))


def _diff(argv: Sequence[str]) -> int:
    from exporter.tools.diff import main

    return main(list(argv))


def _record(argv: Sequence[str]) -> int:
    from exporter.tools.record import main

    return main(list(argv))


def _pick(argv: Sequence[str]) -> int:
    from exporter.tools.pick import main

    return main(list(argv))


def _version(argv: Sequence[str]) -> int:
    from exporter import __version__

    print(f"gpu-exporter {__version__}")
    return 0


COMMANDS: dict[str, Callable[[Sequence[str]], int]] = {
    "serve": _serve,
    "profile": _profile,
    "snapshot": _snapshot,
    "diff": _diff,
    "record": _record,
    "pick": _pick,
    "version": _version,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] in ("--version", "-V"):
        args[0] = "version"
    cmd = COMMANDS.get(args[0])
    if cmd is None:
        sys.stderr.write(f"gpu-exporter: unknown command {args[0]!r}; expected one of: {', '.join(COMMANDS)}\n")
        return 2
    return cmd(args[1:])


if __name__ == "__main__":
    sys.exit(main())
