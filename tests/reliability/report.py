"""Render docs/reliability.md from the records the reliability tests leave in tests/reliability/.results/.

    python -m tests.reliability.report [--out docs/reliability.md] [--check]

Every row of the table is one test run: the scenario, what was done, what happened and the
figures measured, with the test's node id so anyone can rerun it. ``make reliability``
runs the whole suite and then this script. ``--check`` exits 1 when a recorded test failed
or an expected failure passed (an expected failure is listed under "Open findings", not hidden).
The last section, "Mutation testing" (scores from ``make mutation``, written by hand), is kept as it is.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RESULTS = HERE / ".results"

SECTIONS = [
    ("test_load", "Load"),
    ("test_soak", "Memory over time"),
    ("test_faults_exporter", "Faults: exporter"),
    ("test_faults_profiler", "Faults: profiler"),
    ("test_disk", "Faults: files we write"),
    ("test_fuzz", "Hostile input (hypothesis)"),
    ("test_fuzz_inputs", "Hostile input: every surface of serve (hypothesis)"),
    ("test_escaping", "Hostile input: exposition escaping"),
    ("test_secrets", "Access control and secrets"),
]

# Rows proven by tests outside this package (run by `make test`); no figures are measured for them here.
EXTERNAL = [
    ("Faults: exporter", {
        "scenario": 'rocm-smi CLI hang, reported as a stall (issue 35)',
        "done": 'the fake rocm-smi sleeps 60 s (`--command-timeout 0.5`) after a good collection of its 4 GPUs',
        "happened": 'killed at the command timeout, as before; reported the way a hung in-process '
                        'call about no GPU is: kind stalled, the 4 GPUs gpu_up 0, health state hung, '
                        'cause "stalled: rocm-smi did not answer within 0.5 s and was killed", /readyz '
                        '"backend rocm-smi: stalled: ..."',
        "test": 'tests/unit/backends/test_rocm_smi.py::test_a_killed_rocm_smi_is_reported_like_a_stal'
                    'led_in_process_call',
        "figures": {'gpus hung': 4},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'hung per-GPU reading (issue 35)',
        "done": '8 fake GPUs, NVML and amdsmi; the power reading (`nvmlDeviceGetPowerUsage`, '
                    '`amdsmi_get_power_info`) of GPU 3, then of GPUs 2 and 5, blocks until released (what'
                    " NVML does while a GPU falls off the bus); `--call-deadline 1`; the other GPUs' "
                    'utilisation changed before each of 4 collections',
        "happened": 'each hung GPU: gpu_up 0, health state hung, cause "hung: <call> did not return '
                        'within 1 s" (the same at every collection), none of its readings, its identity '
                        'kept; every other GPU showed the new utilisation at the very next collection; '
                        'the collection succeeded; exactly one call outstanding per hung GPU and no '
                        "further call sent to it (the fake library's per-GPU call counter stopped); "
                        'threads flat; the first collection after the call returned read the GPU again',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_call_costs_its_gpu_only[*-reading-*]',
        "figures": {'hung gpus': '1 and 2 of 8', 'calls sent to a hung gpu': 0},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'several GPUs starting to hang in one collection (issue 35)',
        "done": 'the power reading of GPUs 0-4 of 8, of all 8, or the process list of GPUs 1, 3, 4, 6 and 7 '
                '(late in each read: the hangs start mid-collection) blocks in the same collection (fake '
                'libnvidia-ml and libamd_smi through the real bindings); `--call-deadline 1`, '
                '`--collection-timeout 5`',
        "happened": 'a backend reads its GPUs each on its lane, starting the next beside any not done within '
                    '50 ms, and waits for them together, so the '
                    'hangs overlap and cost one deadline, not one each (before: read one after another, 5 s '
                    'for five, the collection timed out and missed GPUs 5-7). The collection succeeded within '
                    'the timeout, every healthy GPU showed its new utilisation, every hung GPU hung naming its '
                    'call; the next collection refused the hung GPUs at once; all back after the release. No '
                    'out value, GPM request or sample is shared between GPUs (seen failing without: GPU 2 '
                    "published another GPU's utilisation)",
        "test": 'tests/unit/backends/test_hang.py::test_gpus_starting_to_hang_at_once_cost_one_deadline, '
                'tests/unit/backends/test_concurrent_reads.py',
        "figures": {'hung gpus': '5 and 8 of 8', 'healthy gpus missed': 0,
                    'collection ms, 8 healthy gpus (before / after, bench.render mean)': '2.52 / 2.87-3.07'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'hung GPM sample (issue 35)',
        "done": '`nvmlGpmSampleGet` of GPU 3 of 8 blocks for 3 collections (GPM rates already flowing), then '
                'is released',
        "happened": "GPU 3 hung naming the call; the others kept fresh utilisation and their GPM rates (before: "
                    "the GPM reader's lock was held over the call, the other GPUs waited on it and the whole "
                    'backend stalled); GPU 3 back, with rates from its second collection after the release',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_gpm_sample_costs_its_gpu_only',
        "figures": {'hung gpus': '1 of 8'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'slow driver, every call answering (issue 35)',
        "done": 'every NVML call of 8 fake GPUs sleeps 20 ms (`--call-deadline 1`): one GPU\'s 72 NVLink '
                'error counters, read as one funnel reading, take about 1.4 s together',
        "happened": 'every GPU up with all its readings at every collection: the deadline is per vendor call, '
                    'restarted before each call of a batch (Backend.each_call); before, every GPU was published '
                    'hung ("_per_link did not return within 1 s") and test_load\'s held scrapes were not held',
        "test": 'tests/unit/backends/test_hang.py::test_a_slow_driver_that_answers_every_call_is_not_hung',
        "figures": {'gpus hung': '0 of 8'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'hung processes call (issue 35)',
        "done": "as above, the hung call being the GPU's process list "
                    '(`nvmlDeviceGetComputeRunningProcesses_v3`, `amdsmi_get_gpu_process_list`)',
        "happened": 'as above: the hung GPUs down as hung naming the call, the others fresh at every '
                        'collection, nothing sent to a hung GPU, back at the first collection after the '
                        'return',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_call_costs_its_gpu_only[*-processes-*]',
        "figures": {'hung gpus': '1 and 2 of 8'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'hung call about no GPU: the device count (issue 35)',
        "done": '`nvmlDeviceGetCount_v2` blocks for 3 collections, then is released',
        "happened": 'the backend is stalled: collector_success 0 (kind stalled), the 8 GPUs it knew '
                        'gpu_up 0 and hung with the cause naming the call, /readyz "backend nvml: '
                        'stalled: nvmlDeviceGetCount_v2 has not returned after ... s"; no second '
                        'collection started behind the hung call; threads flat; the first collection '
                        'after it returned succeeded and readiness came back',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_device_count_stalls_the_backend_and_re'
                    'adiness_says_so',
        "figures": {'outstanding calls': 1},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'hung init (issue 35)',
        "done": '`nvmlInitWithFlags` / `amdsmi_init` blocks at start (`--collection-timeout 3`), then is released',
        "happened": 'stalled after the collection timeout less one call deadline (a real driver may '
                        'take seconds to load); readiness "stalled: init has not returned"; init not '
                        'called again while it hangs; the first collection after it returned served all 8'
                        ' GPUs',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_init_stalls_the_backend_until_it_returns',
        "figures": {'outstanding calls': 1},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": "hung init at --backend auto's start-up probe (issue 35)",
        "done": '`nvmlInitWithFlags` blocks while `serve --backend auto` starts (`--collection-timeout 3`, '
                '`--call-deadline 1`), then is released; the same for a Python API session (auto and nvml)',
        "happened": 'the probe gives up on init after its deadline (the collection timeout less one call '
                    'deadline: 2 s) and start-up goes on with that backend stalled, its init still running on '
                    'the lane the engine takes over: readiness "backend nvml: stalled: init has not returned '
                    'after ... s" at once and after a collection, no second init behind the hung one; the '
                    'first collection after init returned served all 8 GPUs and readiness came back (before: '
                    'start-up blocked in the probe for as long as init did). A Python API caller hears '
                    '"backend nvml: init did not return within 2 s (a wedged driver)" instead of waiting',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_init_in_the_auto_probe_stalls_the_backend_not_the_'
                'start, ::test_a_hung_init_reaches_a_python_api_caller_at_once',
        "figures": {'outstanding calls': 1, 'start-up blocked s': '2 (the init deadline)'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": "the XID watcher's wait hanging (issue 35)",
        "done": '8 fake GPUs, XID 79 counted on GPU 2; then `nvmlEventSetWait_v2` blocks until released; '
                'meanwhile the GPUs\' utilisation changes, the driver fails once (UNINITIALIZED: the backend '
                'is initialised again) and XID 48 is queued on GPU 5',
        "happened": 'from the wait\'s deadline on (its 0.5 s plus `--call-deadline`) gpu_xid_errors_total and '
                    'gpu_xid_last_timestamp_seconds are absent (the counts could be missing events; before: '
                    'served as if watched), counted as reading_error, one warning; every GPU fresh and up; '
                    'the re-initialisation neither waited for the hung watcher (before: joined it for 2 s) '
                    'nor started a second watcher (threads flat); after the release both XIDs are counted, '
                    'the one queued during the hang included',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_xid_wait_costs_only_the_xid_reading',
        "figures": {'watcher threads': 1, 'warnings': 1},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": "the XID watcher's wait failing every time (issue 35)",
        "done": '`nvmlEventSetWait_v2` answers UNKNOWN (999) at once, every time, after XID 13 was counted; '
                'then answers again',
        "happened": 'the watcher rebuilds its event set with a one-second back-off; the XID families are '
                    'absent while it fails (one warning), every GPU untouched; XID 13 counted again once '
                    'the wait answers',
        "test": 'tests/unit/backends/test_hang.py::test_an_xid_wait_failing_every_time_costs_only_the_xid_reading',
        "figures": {'warnings': 1},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": "AMD RAS and ECC events rated as XIDs are (issue 35)",
        "done": "the fake libamd_smi reports a block's RAS state (amdsmi_get_gpu_ecc_status: MULT_UC, POISON, "
                'PARITY, SING_C on UMC, GFX, XGMI_WAFL), blocks with RAS off, a GPU without RAS, and deferred '
                'errors in the total ECC count; with and without `--xid-severity` overrides by event name',
        "happened": 'gpu_health_state: MULT_UC failed ("ras_mult_uc umc (fatal)", every block showing it named), '
                    'POISON and PARITY degraded (warn), SING_C ok (ignore), deferred errors degraded '
                    '("ecc_deferred (warn)"; before: declared, never read); each overridable by name; a block '
                    'with RAS off is not asked, a GPU without RAS asked once per initialisation; defaults and '
                    "sources in exporter/core/ras_events.tsv (AMD SMI's ECC and error-query references, the "
                    "kernel's AMDGPU RAS page, NVIDIA's XID catalogue)",
        "test": 'tests/unit/backends/test_amdsmi_ras.py',
        "figures": {'cases': 13},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'a wedged driver and liveness (issue 35)',
        "done": 'a call about no GPU never returns (init, the device count): what do the probes do',
        "happened": '/readyz fails naming the call; /healthz (liveness) keeps answering 200 on '
                        'purpose: a restart cannot unwedge a driver (the new process blocks in the same '
                        'call, often in an uninterruptible sleep that SIGKILL must wait for) and a '
                        "restart loop would only add CrashLoopBackOff noise and lose the exporter's "
                        'metrics about the stall. Instead it keeps serving: the GPUs it knew gpu_up 0 and'
                        ' hung with the cause, kind stalled counted, no second call behind the hung one, '
                        'and the first collection after the call returns reads everything again with no '
                        'restart; a not-ready pod leaves its Service endpoints, so alerts show the node '
                        "and draining it stays the operator's decision. A hung call about one GPU costs "
                        'that GPU only and leaves readiness alone',
        "test": 'tests/unit/backends/test_hang.py::test_a_hung_device_count_stalls_the_backend_and_re'
                    'adiness_says_so',
        "figures": {},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'one health state per GPU (issue 35)',
        "done": '4 fake GPUs: XID 79 queued on GPU 1, XID 13 on GPU 2, GPU 3 lost; then, with '
                    '`--xid-severity 79=ignore,13=fatal`, the same XIDs; AMD ECC through the fake amdsmi',
        "happened": 'gpu_health_state: exactly one of ok/degraded/failed/hung/lost is 1 per GPU, one '
                        'cause on all its series: GPU 1 failed "xid 79 '
                        'ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS (fatal)" (NVIDIA\'s catalogue: '
                        'RESTART_BM), GPU 2 degraded (RESTART_APP), GPU 3 lost, GPU 0 ok; /stats, '
                        'snapshot and query_gpus the same; the overrides turned 79 to ok and 13 to '
                        'failed; AMD uncorrectable ECC failed',
        "test": 'tests/unit/serve/test_health_state.py, tests/unit/core/test_gpu_health.py, '
                    'tests/unit/backends/test_amdsmi_health.py',
        "figures": {'states': 'ok, degraded, failed, lost'},
        "outcome": 'make test'}),
    ("Faults: exporter", {
        "scenario": 'a GPU hung for minutes (issue 35)',
        "done": "GPU 3's power reading blocks while collections run back to back: 5 s in make test, "
                    '10 minutes in make reliability (NVML and amdsmi)',
        "happened": 'thread count equal at every collection, RSS growth under 4 MiB over the last two thirds '
                    '(the lane threads\' malloc arenas fill to a plateau first: 8.7 MiB from the start in a 10-minute '
                    'NVML run after the concurrent reads, flat from about 75 s, Python objects flat under '
                    'tracemalloc), one call '
                        'outstanding; never a stale up reading of GPU 3; GPU 4 read at every complete '
                        'collection; GPU 3 back after the release (10 minutes: NVML passed in 602 s after the '
                        'concurrent reads and the per-call batch deadline, 2026-11-28, quiet; earlier NVML 610 s, '
                        'amdsmi in 603 s, on the loaded machine)',
        "test": 'tests/unit/backends/test_hang.py::test_threads_and_memory_stay_flat_while_a_gpu_hang'
                    's, tests/reliability/test_hang_long.py::test_threads_and_memory_stay_flat_over_ten_m'
                    'inutes_of_hang',
        "figures": {'rss growth mib': '< 4'},
        "outcome": 'make test'}),
    ("Access control and secrets", {
        "scenario": "TLS and basic auth on every endpoint",
        "done": "exporter with an exporter-toolkit web config: real TLS handshakes with the right CA and a wrong "
                "one, the right password, a wrong one (401), no credentials (401), plain http to the TLS port",
        "happened": "only the right CA and password get 200; /healthz stays open by documented choice; the "
                    "password and its hash are not in the debug log",
        "figures": {}, "test": "tests/unit/serve/test_webconfig.py::test_tls_and_basic_auth", "outcome": "make test"}),
    ("Access control and secrets", {
        "scenario": "every web-config key enforced or refused",
        "done": "each exporter-toolkit key with real TLS handshakes and requests: client_allowed_sans, cipher_suites "
                "and the server's preference, curve_preferences, min/max_version, headers, rate_limit; certificates "
                "rotated and users edited while serving; SIGHUP; 40 settings that cannot be kept",
        "happened": "each key changes what a client sees; the rotated certificate and edited users take effect "
                    "without a restart; every unkeepable setting exits 2 with one line",
        "figures": {}, "test": "tests/unit/serve/test_webconfig.py", "outcome": "make test"}),
    ("Access control and secrets", {
        "scenario": "basic auth: user enumeration and guessing",
        "done": "wrong passwords for known users whose hashes have mixed costs (4 and 6, 4, 5 and 7), for an "
                "unknown user, a right one and one over 72 bytes, the bcrypt work of each counted (issue 36 "
                "item 8); then 14 quick guesses through a real server",
        "happened": "every check makes one comparison at each configured cost, whoever the user (before: a "
                    "known user with a cost-5 hash was refused 87-100 times faster than an unknown one, checked "
                    "at the highest cost); the work is counted, not timed, so load cannot break the test (issue "
                    "38 item 9: the timed test failed at load 18-24); after 10 failures the address gets 429 "
                    "without a bcrypt check; credentials that passed are never limited",
        "figures": {"cases": 4, "failures": 0},
        "test": "tests/unit/serve/test_webconfig_auth.py::test_every_check_costs_the_same_bcrypt_work_whoever_the_"
                "user, tests/unit/serve/test_webconfig.py::test_failed_logins_are_rate_limited_per_address",
        "outcome": "make test"}),
    ("Load", {
        "scenario": "256 hostile connections against 50 scrapers (http and https)",
        "done": "256 connections held open against the default `--max-connections 64`: a third idle, a third sending "
                "a ClientHello (https) or request line (http) a byte per 0.2 s, a third trickling a request after "
                "the handshake; 50 keep-alive scrapers for 4 s",
        "happened": "0 errors and p99 under 250 ms: waiting connections hold no slot and no thread",
        "figures": {},
        "test": "tests/unit/serve/test_http_hostile.py::test_hostile_connections_do_not_starve_honest_scrapers",
        "outcome": "make test"}),
    ("Access control and secrets", {
        "scenario": "profiler RBAC",
        "done": "every kustomization is rendered with kubectl and its ClusterRole and Role read",
        "happened": "ClusterRole: apiGroups [''], resources [nodes], verbs [get, list, patch]; Role in its "
                    "namespace: get/update on its one Lease, create leases, create/patch events; each bound "
                    "to the profiler's service account only",
        "figures": {},
        "test": "tests/e2e/test_deploy.py::test_profiler_rbac_is_nodes_get_list_patch_its_lease_and_events",
        "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "Prometheus answers with NaN or infinite timestamps (profiler)",
        "done": "range and instant answers whose timestamps are bare JSON NaN/Infinity/-Infinity, 1e999, or"
            " the strings \"NaN\", \"+Inf\", \"-inf\", \"Inf\"; a bare NaN as a value",
        "happened": "each is prometheus_bad_response with one line (before issue 26: handed on, then an "
            "`internal` error with a traceback); NaN and ±Inf values sent as strings, as Prometheus "
            "does, are kept",
        "test": "tests/unit/profiler/test_prom.py::test_non_finite_timestamps_are_bad_responses, "
            "::test_non_finite_instant_timestamps_are_bad_responses",
        "figures": {"cases": 11, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "Prometheus answer trickling past the deadline (profiler)",
        "done": "a valid JSON start, then a byte every 0.2 s without end, framed as HTTP/1.0 without a "
            "length and as chunked; client timeout 1 s",
        "happened": "prometheus_timeout at the deadline (before issue 26: the HTTP/1.0 answer escaped the "
            "deadline's cut, since http.client drops the connection's socket for an answer read to its "
            "close, and an answer cut short was parsed and counted as bad_response)",
        "test": "tests/unit/profiler/test_prom.py::test_trickling_answer_at_the_deadline_is_a_timeout",
        "figures": {"cases": 2, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "NVML UNKNOWN (999) from one function",
        "done": "999 from each of the 20 direct-call NVML functions and the processes call on one GPU in "
            "turn, then with its UUID or PCI-info call failing too (fake libnvidia-ml through real "
            "pynvml); the core functions of every driver generation R470-R615",
        "happened": "one 999 loses only that reading (`reading_error`), the GPU stays `gpu_up 1` with its other"
            " readings (before issue 26: the whole GPU was down); with the identity call failing too "
            "the GPU is `gpu_up 0` (`gpu_error`), the other GPU untouched",
        "test": "tests/unit/backends/test_nvml.py::test_unknown_error_from_one_call_loses_that_reading_only"
            ", tests/unit/backends/test_nvml_generations.py::test_unknown_error_loses_one_reading_on_ev"
            "ery_branch",
        "figures": {"cases": 78, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "vendor strings that are not valid Unicode in the exposition",
        "done": "a rocm-smi card name holding a lone surrogate escape (`\\udcff`, `\\ud800`, `\\udfff`, a "
            "reversed pair), NUL and terminal escapes, and all of them with quotes, newlines and a "
            "forged `# HELP` line; the real exporter scraped in both formats",
        "happened": "every answer 200 and valid UTF-8, `promtool check metrics` clean, each surrogate shown as "
            "U+FFFD and every other character kept (before issue 26: every /metrics answer was 500 "
            "while /readyz said ready)",
        "test": "tests/unit/backends/test_rocm_smi.py::test_a_bad_vendor_string_never_fails_a_scrape",
        "figures": {"cases": 6, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "label text from Prometheus on Node annotations (profiler)",
        "done": "uuid labels with newlines, terminal escapes, NUL, spaces, commas, U+2028, non-ASCII, 64 "
            "KiB and 204 characters; holder entries with a bell, an escape, upper case, a 254-character"
            " pod, a 64-character namespace, extra or missing parts; 3,000 GPU ids on one node; 200 "
            "allocated-idle GPUs with full holder lists and MIG uuids under a 253-character prefix; a "
            "real cycle through a real Prometheus",
        "happened": "values outside their grammar are not written and are counted "
            "(`gpu_profiler_label_values_rejected_total`); the node keeps 64 GPUs and one "
            "`omitted-gpus` count; every node stays within `--max-annotation-bytes` (16 KiB) and every "
            "value is printable (before issue 26: written verbatim; one 321 KB patch of 6,005 keys)",
        "test": "tests/unit/profiler/test_plan.py::test_a_uuid_outside_its_grammar_is_not_written, "
            "::test_holders_outside_their_grammar_are_not_written, "
            "::test_gpus_per_node_are_capped_with_one_count_annotation, "
            "::test_worst_case_node_stays_under_the_documented_bound, "
            "tests/unit/profiler/test_allocated.py::test_hostile_uuid_and_holders_never_reach_the_node",
        "figures": {"cases": 28, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "an exporter serving its own node, job and instance labels",
        "done": "each shipped scrape configuration (deploy/prometheus/scrape-config.yaml, the kustomize "
            "ServiceMonitor, the Helm chart's, run as prometheus-operator generates it) in a real "
            "Prometheus against a target whose series say node=\"victim-node\", job, instance, and carry "
            "a workload's pod/namespace/container",
        "happened": "the scrape's node, job and instance win (the exporter's arrive as exported_*); pod, "
            "namespace and container keep their names (before issue 26: with honor_labels the "
            "exporter's node won, so the profiler would annotate another Node)",
        "test": "tests/e2e/test_scrape_labels.py::test_the_scrape_sets_node_whatever_the_exporter_says",
        "figures": {"cases": 3, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "Prometheus answers that parse into gigabytes (profiler)",
        "done": "the real profiler process (with a fake API server) against a Prometheus answering the "
            "discovery queries with 600 nodes and every other query with 15 MiB (under the 16 MiB cap) "
            "of empty objects, one-key objects, a valid vector or whitespace padding, six answers in "
            "flight; answers of empty objects, nested arrays and non-ASCII strings to the client alone",
        "happened": "peak RSS 80-190 MiB, under the Deployment's 256 MiB limit (before issue 26: over it, 2.3 "
            "GiB for empty objects); an answer whose objects would pass --prometheus-max-parse-bytes is"
            " refused while read (prometheus_response_too_large, its shard asked in halves); no "
            "traceback",
        "test": "tests/unit/profiler/test_memory_bound.py::test_profiler_memory_stays_under_its_limit_with_"
            "hostile_answers, tests/unit/profiler/test_prom.py::test_answers_that_would_parse_into_too_"
            "much_memory_are_refused",
        "figures": {"cases": 7, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "pipelined requests (issue 26)",
        "done": "32 connections each pipeline 2,000 GET /healthz and read the answers; meanwhile 40 probes, "
            "each on a new connection",
        "happened": "every probe 200 with p99 under 100 ms, the pipeliners answered in order meanwhile (before: "
            "one thread per pipelined request, the I/O loop never got back to select(), every probe timed out)",
        "test": "tests/unit/platform/test_fair_serving.py::test_pipelined_probes_do_not_starve_new_connections",
        "figures": {"cases": 40, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "clients that never read (issue 26)",
        "done": "70 connections each pipeline 250 GET /metrics (8 fake GPUs) and never read; meanwhile 20 "
            "scrapes and 20 probes",
        "happened": "every scrape and probe 200: a connection whose answer is not taken holds a file descriptor "
            "and one answer's bytes, no slot (before: all 64 slots blocked in writes, 503 for everybody)",
        "test": "tests/unit/platform/test_fair_serving.py::test_clients_that_never_read_hold_no_slot",
        "figures": {"cases": 40, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "idle connections on the profiler's server (issue 26)",
        "done": "64 idle connections to the profiler's /metrics port, then 8 probes and a scrape",
        "happened": "all answered: the profiler runs the exporter's server (before: 32 idle sockets made "
            "/healthz unanswerable, 8 of 8 failed)",
        "test": "tests/unit/platform/test_fair_serving.py::test_the_profilers_server_survives_idle_connections",
        "figures": {"cases": 9, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "bcrypt flooding (issue 26)",
        "done": "64 concurrent wrong passwords from one address (cost 10); web configs with cost 15 and 16",
        "happened": "at most 10 bcrypt checks, the rest 429 at once, the logged-in scraper still 200 (before: "
            "all 64 checked, the limit was charged after bcrypt); costs above 14 exit 2 with one line",
        "test": "tests/unit/platform/test_fair_serving.py::test_concurrent_wrong_passwords_are_charged_before_"
            "the_check, ::test_bcrypt_costs_above_14_are_rejected_at_start",
        "figures": {"cases": 3, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "half-written web config (issue 26)",
        "done": "a running exporter with basic auth gets its web.yml replaced by an empty file, one cut after "
            "http_server_config, one without basic_auth_users, one cut inside a hash",
        "happened": "each refused with one error line; /metrics, /stats and the API stay 401 to anonymous "
            "clients (before: 200 and \"reloaded\")",
        "test": "tests/unit/platform/test_fair_serving.py::test_a_half_written_web_config_keeps_auth_on",
        "figures": {"cases": 4, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "basic-auth user name that is not UTF-8 (issue 26)",
        "done": "Authorization with the user name bytes ff fe: /healthz, /readyz, then 12 scrapes",
        "happened": "probes 200 ok, scrapes 401 then 429: a counted failure (before: 500 and a traceback on "
            "every request, probes included, never limited)",
        "test": "tests/unit/platform/test_fair_serving.py::test_a_non_utf8_user_name_is_a_counted_failure",
        "figures": {"cases": 14, "failures": 0}, "outcome": "make test"}),
    ('Hostile input (hypothesis)', {
        "scenario": "256 hostile connections of every kind, exporter and profiler (issue 26)",
        "done": "256 connections at once from another process (pipelining, never reading, idle, trickling, "
            "bcrypt flooding), from the scrapers' address or from 256 others; 50 keep-alive scrapers with "
            "basic auth for 5 s; probes every 20 ms on new connections",
        "happened": "no scrape or probe error; scrape p99 under 250 ms and probe p99 under 100 ms asserted "
            "(on a 2-CPU machine shared with other work they came out at 0.1 to 0.35 s; before: no scrape "
            "answered at all, every probe timed out)",
        "test": "tests/unit/platform/test_fair_serving.py::test_256_hostile_connections_of_every_kind",
        "figures": {"cases": 4}, "outcome": "make test"}),
    ("Hostile input (hypothesis)", {
        "scenario": "a process naming its cgroup after another pod (issue 36)",
        "done": "child cgroups pod<victim uid>/<victim container id> below an attacker's container, in "
            "the cgroupfs, systemd (escaped) and relative cgroup-namespace forms, nested kubepods; a "
            "victim's container ID as a direct child of the attacker's pod",
        "happened": "the process stays in its own pod: the kubelet's first pod<uid> component wins, a "
            "container ID counts only as the pod's direct child and only when the API lists it in "
            "that pod (before: the last pod<uid> won, and the victim showed 5 GiB and 0.7 "
            "utilisation, truly 1 GiB and 0.1)",
        "test": "tests/unit/k8s/test_cgroup.py::test_the_kubelets_first_pod_component_wins, "
            "tests/unit/k8s/test_shared_gpus.py::test_a_container_id_of_another_pod_is_not_taken",
        "figures": {"cases": 7, "failures": 0}, "outcome": "make test"}),
    ("Faults: profiler", {
        "scenario": "500 of 10,000 nodes failing at once: Events (issue 35)",
        "done": "10,000 nodes with GPUHealthy True; 500 lose a GPU in the same cycle; --hysteresis 2, the "
            "default per-node Event budget",
        "happened": "the second cycle writes the 500 transitions and each of the 500 nodes gets its Event; "
            "none suppressed, no Event for any other node (before: a fleet-wide 30 a minute let 30 through)",
        "test": "tests/unit/profiler/test_events.py::test_500_of_10000_nodes_failing_at_once_each_get_their_"
            "event_within_two_cycles",
        "figures": {"nodes": 10000, "failing": 500, "events": 500, "dropped": 0}, "outcome": "make test"}),
    ("Faults: profiler", {
        "scenario": "a flapping node's Events (issue 35, issue 36)",
        "done": "one node's GPUHealthy flips five times in a cycle (burst 2), another node records one; then "
            "the fake clock moves by exact fractions of the refill interval",
        "happened": "the flapping node spends its own budget only (3 suppressed), the other node's Event is "
            "recorded; one summary Event names how many were suppressed and where; tokens come back at "
            "exactly the stated rate, never above the burst",
        "test": "tests/unit/profiler/test_events.py::test_one_summary_event_per_cycle_names_the_suppressed, "
            "test_budget_refills_at_its_stated_rate_on_a_fake_clock",
        "figures": {"suppressed": 4, "summary events": 1}, "outcome": "make test"}),
    ("Faults: profiler", {
        "scenario": "DeviceTaintRule API absent or forbidden (issue 35)",
        "done": "--device-taints on against a server without devicetaintrules in discovery (the "
            "DRADeviceTaintRules gate off), for 30 cycles, then with it; and a server answering 403 to "
            "the rule's creation three times",
        "happened": "one warning for the absent API, discovery asked again every 30 cycles, the rules "
            "written once it is served; one warning for 403, the rule written when it clears; the cycle "
            "never fails for either",
        "test": "tests/unit/profiler/test_device_taints.py::test_api_absent_says_so_once_and_carries_on, "
            "test_forbidden_is_one_warning",
        "figures": {"warnings": 1, "discovery calls": 3}, "outcome": "make test"}),
    ("Faults: profiler", {
        "scenario": "a GPU the exporter reports hung (issue 35)",
        "done": "gpu_health_state says hung for GPU 1 of a node, failed for another's GPU 0, degraded for a "
            "third's, in a real Prometheus; then every state returns to ok",
        "happened": "GPUHealthy False with reason GPUHung ([GPU_HUNG] entry, RESTART_BM) and GPUFailed; "
            "degraded listed on a True node; all True again after recovery (a hung or failed GPU's device "
            "is tainted with --device-taints: test_device_taints.py)",
        "test": "tests/unit/profiler/test_health.py::test_the_exporters_health_state",
        "figures": {"nodes": 3}, "outcome": "make test"}),
    ("Faults: profiler", {
        "scenario": "API server 409 on nodes/status (issue 36)",
        "done": "the GPUHealthy patch of one node answers 409 twice, then once with the node's "
            "annotations already in place; another node is written in the same cycle",
        "happened": "each 409 reads the node again and retries once; a second 409 is that node's "
            "kube_conflict, counted, the other node's condition written and tallied; never internal "
            "(before: a traceback, every cycle internal, the other nodes untallied)",
        "test": "tests/unit/profiler/test_health.py::test_a_conflict_on_nodes_status_reads_again_and_retr"
            "ies_once",
        "figures": {"cases": 2, "failures": 0}, "outcome": "make test"}),
    ("Faults: exporter", {
        "scenario": "two quick edits of the web config (issue 36)",
        "done": "a second atomic write of web.yml at each point of a reload (before the file is read, while "
            "the new cost's dummy hash is made, after the load returned), and in real time 30 ms after a "
            "first edit whose load takes a cost-12 hash",
        "happened": "the second edit is in force after the next check (before: the reload recorded the "
            "files' stamp after loading, so the second edit matched it and was never applied: a "
            "rotated-out password kept answering, a renewed certificate was not served)",
        "test": "tests/unit/platform/test_webconfig_reload.py",
        "figures": {"cases": 5, "failures": 0}, "outcome": "make test"}),
    ("Hostile input (hypothesis)", {
        "scenario": "pods of a megabyte with --per-process (issue 36)",
        "done": "100 pods of about 1.1 MiB of JSON each (a 400 KiB last-applied annotation, 7,000 "
            "environment variables, 200 labels) on the exporter's node, listed; 10 more through the "
            "watch; then a relist after 410",
        "happened": "peak RSS (VmHWM) 90.6 MiB, under the DaemonSet's 128 MiB (before: 572.7 MiB): each pod "
            "is reduced to name, namespace, UID and container IDs as it is decoded, a list item by "
            "item from the stream, an object over 4 MiB fails the request, at most 10,000 objects "
            "kept; the per-pod readings still right",
        "test": "tests/unit/k8s/test_shared_gpus.py::test_a_hundred_pods_of_a_megabyte_stay_under_the_dae"
            "monsets_limit",
        "figures": {"cases": 1, "failures": 0}, "outcome": "make test"}),
    ("Faults: exporter", {
        "scenario": "Kubernetes watch failing every time (issue 36)",
        "done": "the pod watch answered, every time, with 410 Expired, 429 with Retry-After 7, 500, a "
            "stream closed at once, a garbage line, a line that is not an object, a 70 KB line "
            "without end (limit 64 KiB); injected clock and jitter; a relist after 410 with a pod "
            "deleted in the gap",
        "happened": "each failure waits client-go's backoff (0.8 s doubling, jitter up to as much again, "
            "capped at 30 s, Retry-After honoured up to the cap), counted in "
            "gpu_exporter_watch_relists_total and gpu_exporter_watch_errors_total, one WARNING line "
            "per outage, the last known pods kept; the relist drops the deleted pod (before: 317-375 "
            "lists a second per watch, nothing counted or logged)",
        "test": "tests/unit/k8s/test_watch.py::test_every_watch_failure_backs_off_exponentially_with_jitt"
            "er_and_a_cap, ::test_a_relist_after_410_drops_what_was_deleted_in_the_gap",
        "figures": {"cases": 8, "failures": 0}, "outcome": "make test"}),
    ("Hostile input (hypothesis)", {
        "scenario": "protocol nits (issue 36)",
        "done": "an HTTP/1.1 request without Host (bare, with other headers, with an empty Host); HTTP/1.0 "
            "with and without Connection: keep-alive, two requests on one connection; Expect: 100-continue "
            "with a body still to come, with the body already sent, without a body",
        "happened": "1.1 without Host is 400 (before: 200); 1.0 keep-alive is kept and says Connection: "
            "keep-alive (before: kept open without saying so), 1.0 without it closes; 100 Continue "
            "comes before the body is awaited, and only then (before: none)",
        "test": "tests/unit/platform/test_http_server.py::test_http11_without_host_is_400, "
            "::test_http10_keep_alive_is_said_and_kept, ::test_expect_100_continue_gets_an_interim_answer_"
            "before_the_body, ::test_no_interim_answer_without_a_body_or_expect",
        "figures": {"cases": 8, "failures": 0}, "outcome": "make test"}),
    ("Hostile input (hypothesis)", {
        "scenario": "a tenant's series naming another node (issue 36)",
        "done": "in a real Prometheus beside the victim's own dcgm-exporter: a tenant's DCGM_FI_* and XID"
            " 79 with Hostname=victim under the scrape's node=tenant-node; the same with no scrape "
            "node label in a shared job; from the exporter's job name in the tenant's namespace; "
            "AMD's hostname both ways; our series joined to a gpu_host_info{node=victim} the tenant "
            "serves; then one profiler cycle with the GPUHealthy condition",
        "happened": "the victim's Node keeps GPUHealthy True and only its own GPU 0's annotations: the "
            "scrape's node label wins wherever it is set (the tenant's GPU is its own node's), a "
            "target's Hostname/hostname/kubernetes_node/gpu_host_info node is read only without it "
            "and from --source-job/--source-namespace (before: GPUHealthy False CriticalXID GPU 7 and"
            " phantom GPUs 5, 6, 7 on the victim); bad settings exit 2 with one line",
        "test": "tests/unit/profiler/test_source_trust.py",
        "figures": {"cases": 6, "failures": 0}, "outcome": "make test"}),
    ("Load", {
        "scenario": "file descriptors: one cap over every connection (issue 36)",
        "done": "a server with a cap of 24 connections: 72 connections, half idle, half sending a malformed "
            "request and never closing (answered 400, then drained); 20 probes meanwhile; a route that never "
            "answers and a pipelined request waiting for its slot (read timeout 0.5 s); accept() failing "
            "with EMFILE in two episodes",
        "happened": "at most 24 server sockets open (from /proc), every probe 200 (before: 73 with the same "
            "load, as closing, writing and deferred connections were outside the waiting cap); both held "
            "connections closed at the busy deadline (before: held for ever); one WARNING per accept "
            "episode (before: one per failure, 87-95 lines in 8 s); the cap derived from RLIMIT_NOFILE",
        "test": "tests/unit/platform/test_http_server.py::test_every_open_connection_counts_against_one_cap, "
            "::test_an_answer_that_never_comes_and_a_request_that_waits_for_a_slot_have_a_deadline, "
            "::test_accept_failures_are_logged_once_per_episode, ::test_the_connection_cap_is_derived_from_"
            "the_file_limit",
        "figures": {"cases": 7, "failures": 0}, "outcome": "make test"}),
    ("Load", {
        "scenario": "no class of greedy client starves the probes (issue 36)",
        "done": "against the real exporter with basic auth and --probe-port, one class at a time: about 780 "
            "recorded ClientHellos replayed a second (TLS), 256 idle, trickling, pipelining, not-reading or "
            "password-guessing connections (plain), and idle, trickling and pipelining ones on the probe port "
            "itself; a kubelet probing /healthz and /readyz on the probe port every 50 ms, the chart's 5 s timeout",
        "happened": "every probe 200 within the timeout in every class (before: HTTPS probes on the main port "
            "failed 55 of 60 under the replayed ClientHellos, 3-6 of 8-9 in the issue); the design and the "
            "argument per class in docs/security.md",
        "test": "tests/unit/platform/test_probe_starvation.py::test_no_class_of_greedy_client_starves_the_probes",
        "figures": {"cases": 9, "failures": 0}, "outcome": "make test"}),
    ("Load", {
        "scenario": "the shipped installs probe the probe listener, TLS or not (issue 36)",
        "done": "Helm (both vendors, TLS on and off, moved ports) and kustomize (base and overlays) rendered with "
            "the real helm and kubectl; the rendered probes run as the kubelet runs them against a real exporter "
            "and profiler with basic auth and TLS",
        "happened": "both daemons' probes name the plain-HTTP probe listener the daemon is told to open (9404, "
            "not the metrics port; before: the exporter's probes on HTTPS behind every handshake unless "
            "exporter.probePort was set, the profiler's always); 200 there, /metrics 404 there and 401 on the "
            "metrics port; no Service, ServiceMonitor or NetworkPolicy names it; probePort 0 or the metrics port "
            "refused at helm template",
        "test": "tests/e2e/test_helm.py::test_probes_are_on_the_probe_listener_whatever_the_tls, "
            "::test_only_the_kubelet_reaches_the_probe_ports, ::test_a_probe_port_that_cannot_serve_is_refused, "
            "::test_shipped_profiler_probes_pass_under_auth; tests/e2e/test_probes.py::"
            "test_shipped_probes_pass_under_auth",
        "figures": {"cases": 16, "failures": 0}, "outcome": "make test"}),
    ("Access control and secrets", {
        "scenario": "HTTP and web-config survivors (issue 36)",
        "done": "four one-line bugs the whole suite missed, each planted by hand: silent sockets evicted after "
            "an idle keep-alive at the cap; a fifth request queued at --max-connections 4; a reload dropping "
            "client_allowed_sans taken; RequireAndVerifyClientCert and VerifyClientCertIfGiven swapped",
        "happened": "each fails its new test: the keep-alive connection that completed a request survives 48 "
            "silent sockets; four requests held and the fifth 503 with Retry-After at once; the reload "
            "refused and the other client's certificate still refused; without client_allowed_sans a client "
            "with no certificate is refused by RequireAndVerifyClientCert and admitted by "
            "VerifyClientCertIfGiven (real TLS handshakes)",
        "test": "tests/unit/platform/test_http_survivors.py",
        "figures": {"cases": 6, "failures": 0}, "outcome": "make test"}),
]

FIXED = [
    ("exporter/serve/http.py", "(issue 16) 64 idle sockets refused every scrape with 503, and TLS handshakes of "
     "connections over the limit ran on the serving thread (a scrape waited 12 s): waiting connections now live in "
     "a non-blocking I/O thread under a deadline and hold no slot", "test_load.py::test_idle_connections_at_the_"
     "default_limit, tests/unit/serve/test_http_hostile.py"),
    ("exporter/serve/webconfig.py", "(issue 16) client_allowed_sans, cipher_suites, curve_preferences and "
     "http_server_config.headers were accepted and ignored, `tls_server_config: []` served plain HTTP, a truncated "
     "hash gave 401 to everyone, certificates were read once: all enforced or refused now",
     "tests/unit/serve/test_webconfig.py"),
    ("exporter/serve/config.py, webconfig.py", "(issue 16) a YAML file with a bad date, a 5,000-digit integer or "
     "deep nesting, and a non-string min_version (found by the fuzzer), gave a traceback; a 3,000-digit hex "
     "integer made a huge error line", "test_fuzz_inputs.py"),
    ("exporter/serve/http.py", "a client sending its request one byte per read timeout (slowloris) held a "
     "connection, and one of --max-connections, forever: the read timeout now bounds the whole request",
     "test_load.py::test_trickling_client_is_cut_at_the_read_timeout"),
    ("exporter/serve/engine.py", "an outage whose cause changed (a failed collection, then the re-init failing "
     "differently: NVML 999, rocm-smi hanging) logged a warning per cause: now one per outage, later causes at "
     "debug", "test_faults_exporter.py::test_nvml_unknown_error_on_every_call, ::test_rocm_smi_hanging"),
    ("exporter/backends/nvml.py", "a lost GPU was logged once per distinct NVML message for the life of the "
     "process (two lines for one outage, none for a second outage): now one warning per outage and one line "
     "when it is readable again", "test_faults_exporter.py::test_gpu_lost_mid_scrape"),
    ("exporter/serve/config.py", "a setting holding a newline (flag, path) produced a two-line error: control "
     "characters are now shown escaped", "test_fuzz.py::test_settings_from_flags_env_and_file"),
    ("exporter/backends/rocm_smi.py", "\"card1\" next to \"card01\" raised TypeError (dicts compared while "
     "sorting) and deeply nested JSON raised RecursionError: both are RocmSmiParseError now",
     "test_fuzz.py::test_rocm_smi_duplicate_card_numbers_and_deep_nesting"),
    ("exporter/profiler/plan.py, classify.py", "a value under our prefix the profiler could not have written "
     "('STEADY', '', a bad number) made dominant_pattern() raise StopIteration and failed every cycle: such "
     "values now count as absent and are replaced in the same cycle",
     "test_fuzz.py::test_annotations_read_back_from_nodes"),
    ("exporter/profiler/prom.py", "a connection cut mid-answer, JSON nested 100,000 deep and label values that "
     "are not strings escaped as internal errors with a traceback ({\"node\": 5} was planned as node 5): all "
     "are prometheus_bad_response now", "test_fuzz.py::test_deeply_nested_prometheus_answer, "
     "::test_prometheus_answers_of_the_wrong_shape, test_faults_profiler.py::test_prometheus_fault[cut]"),
    ("exporter/profiler/loop.py", "one ERROR line per failed cycle: now one per outage and one when it ends",
     "test_faults_profiler.py::test_profiler_logs_one_line_per_outage"),
    ("exporter/tools/snapshot.py, record.py", "on a full disk `-o` left a truncated file: now written to a "
     "temporary file and renamed into place", "test_disk.py::test_output_to_a_full_or_read_only_filesystem"),
    ("exporter/k8s/podresources.py, exporter/serve/engine.py", "a scrape could show a fresh pod label with "
     "the previous List's device counts (the view was published before its figures, and labels were read at "
     "render time): "
     "view and figures now change together and labels are frozen with the snapshot",
     "test_faults_exporter.py::test_pod_resources_answer_over_4mib"),
]


def _load() -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))]


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    return str(v)


def _figures(fig: dict[str, Any]) -> str:
    return "; ".join(f"{k.replace('_', ' ')}: {_fmt(v)}" for k, v in fig.items()) or "-"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


OUTCOME = {"passed": "pass", "xfailed": "**FAILS** (known, see below)", "failed": "**FAILED**",
           "xpassed": "**XPASS** (fixed? remove the xfail)", "make test": "pass (make test)"}


def render(records: list[dict[str, Any]]) -> str:
    by_file: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_file.setdefault(r["test"].split("::")[0].rsplit("/", 1)[-1].removesuffix(".py"), []).append(r)
    newest = max((r["started"] for r in records), default=time.time())
    m = records[0]["machine"] if records else {}
    out = [
        "# Reliability report",
        "",
        "Load, memory over time, faults, hostile input and access control of the exporter and the profiler, "
        "measured. Every row is one test in the repository; rerun them all with `make reliability` (about "
        "10 minutes here) or the CI-sized part (about 90 s) with `make test`; rerun one with "
        "`.venv/bin/python -m pytest '<test>'`. This file is generated by `python -m tests.reliability.report` "
        "from the run's records.",
        "",
        f"Run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(newest))} on `{m.get('host', '?')}`: "
        f"{m.get('cpu', '?')}, {m.get('cpus', '?')} CPUs, Linux {m.get('kernel', '?')}, Python "
        f"{m.get('python', '?')}; no GPU (fake NVML library, fake rocm-smi, fake kubelet, real Prometheus 2.42 "
        "and a fake API server). The machine was shared with other work, so latencies are upper bounds.",
        "",
        "Faults: the process must survive, publish no wrong or stale value, show the failure in a self-metric "
        "and in one log line (not one per scrape), and recover within one cycle after the fault clears "
        "(collect on scrape: a cycle is one scrape).",
        "",
    ]
    for stem, title in SECTIONS:
        rows = sorted(by_file.get(stem, []), key=lambda r: r["test"])
        rows += [dict(x, long=False) for t, x in EXTERNAL if t == title]
        if not rows:
            continue
        out += [f"## {title}", "", "| Scenario | What was done | What happened | Figures | Test | Result |",
                "|---|---|---|---|---|---|"]
        for r in rows:
            test = r["test"] + (" (long)" if r.get("long") else "")
            out.append("| " + " | ".join(_cell(x) for x in (
                r["scenario"], r["done"], r["happened"], _figures(r["figures"]), f"`{test}`",
                OUTCOME.get(r["outcome"], r["outcome"]))) + " |")
        out.append("")
        for r in rows:
            if r.get("curve"):
                label = r.get("curve_label") or "x, y"
                out += [f"Curve of `{r['test']}` ({label}):", "",
                        "| " + " | ".join(_fmt(x) for x, _ in r["curve"]) + " |",
                        "|" + "---|" * len(r["curve"]),
                        "| " + " | ".join(_fmt(y) for _, y in r["curve"]) + " |", ""]
    fuzzed = sorted((r for r in records if "cases" in r["figures"] and r["test"].split("::")[0].rsplit("/", 1)[-1]
                     in ("test_fuzz.py", "test_fuzz_inputs.py")), key=lambda r: (r["scenario"], -r["figures"]["cases"]))
    if fuzzed:
        out += ["## Hostile input: every surface", "",
                "Each surface, the cases hypothesis tried in the largest recorded run, and the crashes (an exception "
                "other than the one-line rejection, a traceback, a hang or a 500).", "",
                "| Surface | Cases | Crashes | Test | Result |", "|---|---|---|---|---|"]
        shown: set[str] = set()
        for r in fuzzed:
            surface = r["figures"].get("surface") or r["scenario"].removeprefix("hostile ")
            if surface in shown:
                continue
            shown.add(surface)
            crashes = 0 if r["outcome"] == "passed" else "see test"
            out.append("| " + " | ".join(_cell(str(x)) for x in (
                surface, r["figures"]["cases"], crashes, f"`{r['test']}`", OUTCOME.get(r["outcome"], r["outcome"])))
                + " |")
        out.append("")
    known = [r for r in records if r["outcome"] in ("xfailed", "failed")]
    out += ["## Open findings", "",
            "Tests that encode a requirement the code does not meet yet (strict expected failures: they turn "
            "red as soon as the code is fixed, so the marker gets removed).", ""]
    out += [f"- `{r['test']}`: {r.get('xfail_reason') or r['happened']}" for r in known] or ["- none"]
    out += ["", "## Fixed while writing this suite", ""]
    out += [f"- `{f}`: {what} (`tests/reliability/{test}`)" for f, what, test in FIXED]
    return "\n".join(out) + "\n"


MUTATION = "## Mutation testing"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.reliability.report", description=__doc__)
    p.add_argument("--out", default=str(REPO / "docs" / "reliability.md"))
    p.add_argument("--check", action="store_true", help="exit 1 if a test failed or nothing was recorded")
    args = p.parse_args(argv)
    records = _load()
    if not records:
        sys.stderr.write(f"no records in {RESULTS}: run `make reliability` first\n")
        return 1
    out = Path(args.out)
    # the mutation scores are written by hand from `make mutation` (tests/harness/mutation.py): kept as they are
    old = out.read_text() if out.is_file() else ""
    kept = old[old.index(MUTATION):] if MUTATION in old else ""
    out.write_text(render(records) + ("\n" + kept if kept else ""))
    failed = [r["test"] for r in records if r["outcome"] in ("failed", "xpassed", "error")]
    if args.check and failed:
        sys.stderr.write("failed: " + ", ".join(failed) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
