"""``make mutation``: mutmut over the safety-critical modules, each with its own tests.

    python -m tests.harness.mutation [--jobs N] [MODULE ...]    (default: every module below)
    python -m tests.harness.mutation --rerun PATTERN MODULE      (after new tests: only those mutants again)

mutmut (3.x) reads its settings from ``[tool.mutmut]`` in the pyproject.toml of the directory
it runs in, and mutates and tests a copy of the tree under ``mutants/``. Each module here gets
its own throw-away tree, ``.mutation/<module>/`` (ignored by git): a copy of the files git
tracks or would track, whose pyproject.toml gains that module's ``[tool.mutmut]`` table (the files
to mutate, the test files that judge it). A module may span files (``also``): code that its main
file delegates to is judged by the same tests, in the same score. So a clean clone needs nothing but the ``mutation``
extra, and one module's run never reuses another's stale results.

Only tests that call the module in the pytest process count: mutmut learns which tests reach
which function by recording calls in that process, so a test that drives the code through a
subprocess (``python -m exporter``) kills nothing here. Each module's tests are chosen for that.

Scores: detected (killed, or timed out) / all mutants but those mutmut skipped. mutmut's "no tests"
(no selected test reaches the function) counts against the score, as a survivor. The run is
niced and uses ``--jobs`` children (default 1): it is a background job, not part of
``make test``. Results: ``.mutation/<module>/results.txt`` and ``.mutation/summary.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / ".mutation"
TARGET = 0.90


@dataclass(frozen=True)
class Module:
    path: str  # the file mutmut mutates
    tests: tuple[str, ...]  # the test files that judge it
    functions: tuple[str, ...] = ()  # fnmatch patterns of mutant names; empty: every function of the file
    isolation: str = "fork"  # mutmut's process_isolation: forkserver where the tests start gRPC threads
    extra_args: tuple[str, ...] = field(default=())  # more pytest arguments
    also: tuple[str, ...] = ()  # more files mutated with ``path`` (code it delegates to); ``functions`` covers them

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path, *self.also)


def _dotted(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


# the web config's auth moves with the HTTP layer to exporter/platform/ (issue 26): mutate it where it is
_WEBCONFIG = next((p for p in ("exporter/platform/webconfig.py", "exporter/serve/webconfig.py")
                   if (REPO / p).is_file()), "exporter/serve/webconfig.py")

MODULES: dict[str, Module] = {
    "funnel": Module("exporter/backends/base.py", ("tests/unit/backends/test_funnel.py",)),
    "fields": Module("exporter/core/options.py", ("tests/unit/core/test_fields.py",),
                     functions=("exporter.core.options.xǁFieldFilterǁ*",)),
    "escaping": Module("exporter/serve/render.py", ("tests/unit/serve/test_escaping_roundtrip.py",),
                       functions=("exporter.serve.render.x_esc__*", "exporter.serve.render.x__esc_help__*",
                                  "exporter.serve.render.x_labelstr__*")),
    "webconfig-auth": Module(_WEBCONFIG, ("tests/unit/serve/test_webconfig_auth.py",),
                             functions=tuple(f"{_dotted(_WEBCONFIG)}.{f}__*" for f in (
                                 "xǁWebConfigǁcached", "xǁWebConfigǁcheck", "xǁWebConfigǁ_key", "x_parse_basic",
                                 "x__users"))),
    "classify": Module("exporter/profiler/classify.py", ("tests/unit/profiler/test_classify.py",)),
    "plan": Module("exporter/profiler/plan.py", ("tests/unit/profiler/test_plan.py",)),
    "leader": Module("exporter/profiler/leader.py", ("tests/unit/profiler/test_leader_deadline.py",
                                                     "tests/unit/profiler/test_leader_election.py")),
    # the mapping from kubelet answers to GPU/MIG keys and holder labels; the gRPC connection loop
    # (start/stop/_loop/_poll/_connect/_failed and its logging) is the transport, not the mapping
    # test_dra.py: MIG instances and DRA devices (mig_labels_for, _index_dra), through the same fake kubelet;
    # the transport's own tests (a hung or restarted kubelet, the DRA watch) reach the mapping too but only
    # slowly, so they are left out: the mapping's tests judge the mapping
    "podresources": Module("exporter/k8s/podresources.py", ("tests/unit/k8s/test_podresources.py",
                                                            "tests/unit/k8s/test_dra.py"),
                           extra_args=("-k", "not hang and not larger_than_grpc and not stale_socket and not hung_call "
                                             "and not grpc_is_imported and not generated_code and not bad_arguments "
                                             "and not watched and not watch_recovers and not newest_generation "
                                             "and not gives_up"),
                           functions=tuple(f"exporter.k8s.podresources.{f}__*" for f in (
                               "x_classify_resource", "x_parse_device_id", "x_reading_keys", "x__mig_profile_keys",
                               "x_mig_keys", "xǁAllocationǁholder", "x__lookup", "x__match", "x__holder_labels",
                               "xǁPodAttributionǁlabels_for", "xǁPodAttributionǁmig_labels_for",
                               "xǁPodAttributionǁ_index", "xǁPodAttributionǁ_index_dra"))
                           # which resource names are whose GPUs, and whether slices (classify_resource delegates),
                           # and the vendors' index prefixes (GKE's nvidiaN): GpuResources, the mapping's own table
                           + tuple(f"exporter.core.k8s_names.xǁGpuResourcesǁ{f}__*" for f in (
                               "__post_init__", "classify", "prefixed_index")),
                           also=("exporter/core/k8s_names.py",), isolation="forkserver"),
    # issue 36: the surfaces a tenant or a flaky API server reaches. The cgroup path parser whole; the
    # per-pod mapping (not the background thread, driven through the real exporter elsewhere); the watch
    # whole (its decoding, backoff and loop, on a fake clock and a scripted API; the tests against the fake
    # API server that run in real time are left out: minutes per mutant); the ResourceSlice mapping; the
    # profiler's source label rules.
    "cgroup": Module("exporter/k8s/cgroup.py", ("tests/unit/k8s/test_cgroup.py",)),
    "processes": Module("exporter/k8s/processes.py", ("tests/unit/k8s/test_shared_gpus.py",),
                        extra_args=("-k", "build_rules or static_pod or another_pod or summary or edge_cases"),
                        functions=tuple(f"exporter.k8s.processes.{f}__*" for f in (
                            "x__mapping", "x__text", "x_pod_summary", "x_index_pods", "xǁPodIndexǁholder",
                            "x_build", "x_render"))),
    "watch": Module("exporter/k8s/watch.py", ("tests/unit/k8s/test_watch_decoding.py",
                                              "tests/unit/k8s/test_watch.py"),
                    extra_args=("-k", "not resumes_after_the_watch_times_out and not lists_then_follows and not "
                                      "410_expired_lists_again and not forbidden_is_retried and not relist_after")),
    "resourceslices": Module("exporter/k8s/resourceslices.py", ("tests/unit/k8s/test_dra.py",),
                             extra_args=("-k", "identified or not_guessed or slice_summary or every_shape "
                                               "or vendor_declares"),
                             functions=tuple(f"exporter.k8s.resourceslices.{f}__*" for f in (
                                 "x__attr_value", "x_device_attributes", "x__first", "x__first_bus_id", "x_identify",
                                 "x_index_slice",
                                 "x_slice_summary", "x__pool", "xǁResourceSliceWatchǁ_changed",
                                 "xǁResourceSliceWatchǁresolve"))),
    "sources": Module("exporter/profiler/sources.py", ("tests/unit/profiler/test_source_labels.py",
                                                       "tests/unit/profiler/test_sources.py"),
                      extra_args=("-k", "not prom and not three_forms and not one_source and not both_exporters "
                                        "and not own_pod and not empty_prometheus")),
    # the shared HTTP server (issue 39 split it along its seams): the pure protocol functions by their own
    # table of requests; the I/O loop and its limits by a real server in this process (real sockets and TLS)
    "http-protocol": Module("exporter/platform/http/protocol.py", ("tests/unit/platform/test_http_protocol.py",)),
    # server.py, the I/O loop, whole: a real server in this process, real sockets and TLS, short deadlines
    # (test_http_server_fast.py: a few seconds for all of it). Not test_http_server.py and
    # test_http_survivors.py: seconds per test (RSA keys, 10 s waits), hours per run; what they check of the
    # loop the fast tests check too. Its limits, which nothing there but the loop calls, are judged below.
    "http-server": Module("exporter/platform/http/server.py", ("tests/unit/platform/test_http_server_fast.py",)),
    # the failed-login limiter, the rate_limit bucket, the lanes and the connection cap: in process, on a
    # fake clock, no socket
    "http-limits": Module("exporter/platform/http/limits.py", ("tests/unit/platform/test_http_limits.py",)),
    # the web config's loader: every refusal's exact line and what a good file sets (TLS context, client
    # certificate check, allowed SANs, headers, rate limit, the files watched); in process, one openssl key
    "webconfig-load": Module(_WEBCONFIG, ("tests/unit/platform/test_webconfig_load.py",),
                             functions=tuple(f"{_dotted(_WEBCONFIG)}.{f}__*" for f in (
                                 "xǁWebConfigǁclient_allowed", "x__cost", "x__canonical_san", "x__fail", "x_load",
                                 "x__http_config", "x__rate_limit", "x__no_password", "x__tls_context", "x__version",
                                 "x__names", "x__ciphers", "x__curves", "x__allowed_sans"))),
    # the web config's reload (never fail open, never lose an edit) and its TLS settings in force
    # (in process, cost-4 hashes and no TLS; not the real-time test with its cost-12 hash)
    "webconfig-reload": Module("exporter/platform/webconfig.py", ("tests/unit/platform/test_webconfig_reload.py",
                                                                  "tests/unit/platform/test_webconfig_live.py"),
                               extra_args=("-k", "not 30ms"),
                               functions=tuple(f"exporter.platform.webconfig.{f}__*" for f in (
                                   "x__stamp", "x__weakens", "xǁLiveWebConfigǁ*"))),
    # issue 35/36: the GPUHealthy rules (pure: the tests that need no Prometheus) and the Event budget
    # (the fake API server in process; the 10,000-node test and the flag test are left out: slow, or
    # not about the recorder)
    # (test_health_docs.py reads docs/, which mutmut's copy of the tree does not hold)
    "health": Module("exporter/profiler/health.py", ("tests/unit/profiler/test_health.py",),
                     extra_args=("-k", "causes_from_fields or parseable or xid_severity_overrides or "
                                       "health_state_fields or every_entry or xid_codes_count or reach_every_path "
                                       "or index_order or cleans_its_labels or message_bound or shares_one")),
    # the profiler's Node reads and patches (NodeStore): its own in-process tests against the fake API
    # server, no Prometheus and no cycle (the cycles' tests take seconds each)
    "annotate": Module("exporter/profiler/annotate.py", ("tests/unit/profiler/test_annotate.py",)),
    "events": Module("exporter/profiler/events.py", ("tests/unit/profiler/test_events.py",
                                                     "tests/unit/profiler/test_allocated.py"),
                     extra_args=("-k", "not 10000 and not flags and not hostile and not allocated_idle")),
    "prom-caps": Module("exporter/profiler/prom.py", ("tests/unit/profiler/test_prom.py",),
                        functions=("exporter.profiler.prom.xǁPromClientǁ_post__*",
                                   "exporter.profiler.prom.xǁPromClientǁ_exchange__*",
                                   "exporter.profiler.prom.xǁPromClientǁ_too_large__*",
                                   "exporter.profiler.prom.xǁPromClientǁ__init____*")),
}

STATUSES = ("killed", "survived", "no tests", "timeout", "suspicious", "skipped", "not checked",
            "segfault", "caught by type check")


def _toml_list(items: tuple[str, ...] | list[str]) -> str:
    return "[" + ", ".join('"' + i.replace("\\", "\\\\").replace('"', '\\"') + '"' for i in items) + "]"


def prepare(name: str, mod: Module, keep: bool = False) -> Path:
    """A fresh copy of the tree for ``name``, with its ``[tool.mutmut]`` table; ``keep``: refresh the
    files of the last run's copy instead, so mutmut keeps the verdicts of mutants it is not asked to rerun."""
    tree = WORK / name
    if keep and (tree / "mutants").is_dir():
        for f in _tracked():
            if (REPO / f).is_file():
                (tree / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / f, tree / f)
        # the module's table again: a rerun after new tests selects them too (its -k may have grown)
        _mutmut_table(tree, mod)
        return tree
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for f in _tracked():
        src = REPO / f
        if src.is_file():
            (tree / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, tree / f)
    _mutmut_table(tree, mod)
    return tree


def _mutmut_table(tree: Path, mod: Module) -> None:
    """The tree's pyproject.toml: the repository's, with ``mod``'s ``[tool.mutmut]`` table."""
    pyproject = (tree / "pyproject.toml").read_text()
    if "[tool.mutmut]" in pyproject:
        raise SystemExit("pyproject.toml already has a [tool.mutmut] table: the runner writes it per module")
    pytest_args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-q", *mod.extra_args]
    (tree / "pyproject.toml").write_text(pyproject + f"""
[tool.mutmut]
source_paths = ["exporter"]
only_mutate = {_toml_list(list(mod.paths))}
pytest_add_cli_args_test_selection = {_toml_list(list(mod.tests))}
pytest_add_cli_args = {_toml_list(pytest_args)}
process_isolation = "{mod.isolation}"
use_setproctitle = false
""")


def _tracked() -> list[str]:
    """The files git tracks or would track (the tree a clean clone has), but the runner's own copies."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.split(b"\0")
    return [f for f in (os.fsdecode(x) for x in files if x) if not f.startswith(".mutation/")]


def results(tree: Path, mod: Module) -> dict[str, str]:
    """mutant name -> status, for the mutants of ``mod`` that its patterns select."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=tree,
                         capture_output=True, text=True, check=True).stdout
    import fnmatch

    found: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+): (.+)$", line)
        if m and (not mod.functions or any(fnmatch.fnmatch(m.group(1), p) for p in mod.functions)):
            found[m.group(1)] = m.group(2).strip()
    return found


DETECTED = ("killed", "timeout")  # a mutant that makes its tests hang is caught too (pytest-timeout fails them)


def score(found: dict[str, str]) -> tuple[int, int]:
    """(detected, judged): skipped and caught-by-type-check mutants are left out of both."""
    judged = [s for s in found.values() if s not in ("skipped", "caught by type check")]
    return sum(s in DETECTED for s in judged), len(judged)


def run(name: str, mod: Module, jobs: int, rerun: tuple[str, ...] = ()) -> tuple[int, int, list[str]]:
    tree = prepare(name, mod, keep=bool(rerun))
    argv = ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs),
            *(rerun or mod.functions)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "MUTANT_UNDER_TEST")}
    with open(tree / "mutmut.log", "wb") as log:
        proc = subprocess.run(argv, cwd=tree, stdout=log, stderr=subprocess.STDOUT, env=env, check=False)
    if proc.returncode != 0:
        tail = (tree / "mutmut.log").read_text(errors="replace")[-3000:]
        raise SystemExit(f"mutation: mutmut failed for {name} (exit {proc.returncode}); log {tree / 'mutmut.log'}:\n"
                         f"{tail}")
    found = results(tree, mod)
    killed, judged = score(found)
    left = sorted(f"{k}: {s}" for k, s in found.items() if s not in (*DETECTED, "skipped", "caught by type check"))
    lines = [f"{k}: {s}" for k, s in sorted(found.items())]
    (tree / "results.txt").write_text("\n".join(lines) + "\n")
    return killed, judged, left


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.harness.mutation", description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", metavar="MODULE", help=f"some of: {', '.join(MODULES)} (default: all)")
    p.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "1")),
                   help="mutmut children per module (default 1, or $MUTATION_JOBS)")
    p.add_argument("--rerun", action="append", default=[], metavar="PATTERN",
                   help="keep the last run's verdicts and test again only the mutants matching PATTERN (a mutmut "
                        "name glob; repeatable), after new tests: the score is over every mutant of the module")
    args = p.parse_args(argv)
    names = args.modules or list(MODULES)
    unknown = [n for n in names if n not in MODULES]
    if unknown:
        p.error(f"unknown module {unknown[0]!r}; known: {', '.join(MODULES)}")
    if args.rerun and len(names) != 1:
        p.error("--rerun needs exactly one module")
    WORK.mkdir(exist_ok=True)
    rows = []
    below = []
    for name in names:
        mod = MODULES[name]
        print(f"mutation: {name} ({', '.join(mod.paths)}; tests: {', '.join(mod.tests)})", flush=True)
        killed, judged, left = run(name, mod, args.jobs, tuple(args.rerun))
        pct = 100.0 * killed / judged if judged else 0.0
        print(f"mutation: {name}: {killed}/{judged} killed ({pct:.1f}%)", flush=True)
        for s in left:
            print(f"    {s}")
        files = ", ".join(f"`{p}`" for p in mod.paths)
        rows.append(f"| {name} | {files} | {killed} | {judged} | {pct:.1f}% |")
        if judged == 0 or killed < TARGET * judged:
            below.append(name)
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    summary = [f"Mutation scores, {today} (mutmut, `make mutation`)", "",
               "| module | file | killed | mutants | score |", "|---|---|---|---|---|", *rows]
    (WORK / "summary.md").write_text("\n".join(summary) + "\n")
    print("\n".join(summary))
    if below:
        print(f"mutation: under {TARGET:.0%} killed: {', '.join(below)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
