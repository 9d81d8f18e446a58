"""promql.py's plan at fleet scale, without a server: every query within the byte limit at 10,000
nodes with 63-character names, and each shard's name pattern selecting exactly its own nodes."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from exporter.profiler import sources
from exporter.profiler.prom import PromClient
from exporter.profiler.promql import QueryBuilder, QueryConfig, pack, plan_shards, query_bytes, shard_pattern
from exporter.profiler.queries import PARTS_PER_QUERY, Reader

FLEET = 10_000


def _names(shape: str) -> list[str]:
    rng = random.Random(7)
    if shape == "indexed":  # one long prefix, then the index: the longest common prefixes
        return [f"{'gpu-pool-a' * 5}-node-{i:07d}"[-63:] for i in range(FLEET)]
    if shape == "random":  # no structure at all
        return ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(63)) for _ in range(FLEET)]
    # cloud names: dots (escaped in a regex), several zones, a name that is the prefix of others
    zones = ["eu-west-1", "us-east-2", "ap-south-1"]
    out = [f"ip-10-{i // 250}-{i % 250}.{zones[i % 3]}.compute.internal.example-cluster-x-0000"[:63]
           for i in range(FLEET - 1)]
    return [*out, out[0][:20]]


def _python(pattern: str) -> re.Pattern[str]:
    """An RE2 raw-string pattern of ours as a Python regex (only \\x{..} differs)."""
    return re.compile(re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: f"\\U{int(m.group(1), 16):08x}", pattern[1:-1]))


@pytest.mark.slow  # 10,000 names matched against every shard's pattern: seconds; make test runs it
@pytest.mark.parametrize("shape", ["indexed", "random", "cloud"])
def test_shards_select_exactly_their_nodes(shape: str) -> None:
    names = _names(shape)
    assert all(len(n) <= 63 for n in names) and max(len(n) for n in names) == 63
    shards = plan_shards(dict.fromkeys(names, 8), 2000)
    fleet = sorted(names)
    assert [n for s in shards for n in s] == fleet  # runs of the sorted names
    assert all(sum(8 for _ in s) <= 2000 for s in shards)
    # a shard's pattern is a union of the trie's subtrees: filled to 2,000 GPUs, as a list would
    # be (whole subtrees only made 50, 70 and 41 shards of these; docs/profiler.md)
    assert len(shards) == FLEET * 8 // 2000
    for s in shards:
        pat = shard_pattern(s, fleet)
        assert {n for n in names if _python(pat).fullmatch(n)} == set(s)
        assert len(pat) <= 2 * 63 + 20 + 2  # docs/profiler.md: 2L + 20 bytes, and its quotes
    # half of a shard (a refused query is asked again in halves) is selected exactly too
    for s in shards[:5]:
        for half in (s[:len(s) // 2], s[len(s) // 2:]):
            assert {n for n in names if _python(shard_pattern(half, fleet)).fullmatch(n)} == set(half)


@pytest.mark.parametrize("seed", range(40))
def test_any_run_of_any_fleet_is_selected_exactly(seed: int) -> None:
    """Names that are prefixes of others, shared prefixes of every length, characters a regex
    must escape: every run of the sorted names (as plan_shards cuts them, or any other) gets a
    pattern that matches it and nothing else of the fleet."""
    rng = random.Random(seed)
    alphabet = rng.choice(["ab", "abc.", "a-b.c", "0123456789", "xy-9.z"])
    names = sorted({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7)))
                    for _ in range(rng.randint(2, 300))})
    for _ in range(30):
        i = rng.randrange(len(names))
        j = rng.randrange(i, len(names))
        pat = _python(shard_pattern(names[i:j + 1], names))
        assert [n for n in names if pat.fullmatch(n)] == names[i:j + 1]
        # nor the empty string: node=~".*" selects the series with no node label, whose node only
        # the scraped target names (the trust boundary: test_source_trust.py)
        assert not pat.fullmatch("")
    assert not _python(shard_pattern(names, names)).fullmatch("")
    gpus = {n: rng.randint(1, 16) for n in names}
    cap = rng.choice([1, 8, 40, 100])
    shards = plan_shards(gpus, cap)
    assert [n for s in shards for n in s] == names
    for s in shards:
        assert len(s) == 1 or sum(gpus[n] for n in s) <= cap
        pat = shard_pattern(s, names)
        assert [n for n in names if _python(pat).fullmatch(n)] == s
        assert len(s) == 1 or len(pat) <= 2 * max(map(len, s)) + 22


@pytest.mark.parametrize("source", [s for s in sources.CHOICES if s != sources.AUTO])
@pytest.mark.parametrize("limit", [8192, 16384])
def test_every_query_fits_the_limit_at_ten_thousand_nodes(source: str, limit: int) -> None:
    names = _names("cloud")
    for health in (False, True):
        cfg = QueryConfig(source=source, health=health, pci=health, max_query_bytes=limit)  # pci: --device-taints
        b = QueryBuilder(cfg, sources.make(cfg.source, "node"))
        for join in (True, False):
            b.join = join
            sizes = []
            for shard in plan_shards(dict.fromkeys(names, 8), cfg.shard_gpus):
                sel = shard_pattern(shard, sorted(names))
                sizes += [query_bytes(q) for _, _, q in b.shard_queries(sel, limit, PARTS_PER_QUERY)]
            assert max(sizes) <= limit
        assert query_bytes(b.unlabelled()) <= limit and query_bytes(b.nodes(None)) <= limit


@pytest.mark.parametrize("source", ["gpu-exporter", "dcgm"])
def test_range_batches_fit_the_limit_and_are_full(source: str) -> None:
    # the UUID regex appears once per branch of a query (the trusted-series rule, the join, each statistic)
    cfg = QueryConfig(source=source, max_query_bytes=16384)
    reader = Reader(PromClient("http://127.0.0.1:9"), cfg)
    b = reader.builder
    uuids = [f"GPU-{i:08x}-1234-5678-9abc-def012345678" for i in range(5000)]
    for join in (True, False):
        b.join = join
        for query in (b.util_range, b.mem_range, b.mem_counts):
            batches = reader._batches(uuids, query, "uuid")
            assert [u for bt in batches for u in bt] == uuids
            assert all(query_bytes(query(bt, "uuid")) <= 16384 for bt in batches)
            assert all(len(bt) <= cfg.range_gpus for bt in batches)
            # full: one more UUID would pass the limit
            assert all(query_bytes(query([*bt, nxt[0]], "uuid")) > 16384 for bt, nxt in itertools.pairwise(batches))


def test_pack_keeps_every_part_and_joins_as_few_as_fit() -> None:
    parts = [f'label_replace(x{{n="{i}"}}, "stat", "s{i}", "gpu", ".*")' for i in range(40)]
    packed = pack(parts, 300)
    assert all(query_bytes(q) <= 300 for q in packed)
    assert sorted(re.findall(r'"s\d+"', " ".join(packed))) == sorted(f'"s{i}"' for i in range(40))
    assert len(packed) == len(pack(parts, 300))  # deterministic
    assert len(pack(parts, 10**6)) == 1
    # at most ``most`` parts a query, the byte limit still kept
    assert [q.count('"stat"') for q in pack(parts, 10**6, 4)] == [4] * 10
    assert all(query_bytes(q) <= 300 and q.count('"stat"') <= 4 for q in pack(parts, 300, 4))


def test_memory_counts_are_asked_for_the_memory_ranges_gpus_only_and_trust_the_scrapes_node() -> None:
    # the growth test's minimums: not two series reads of every GPU in the memory aggregates
    for name in (sources.OURS, sources.DCGM, sources.AMD):
        b = QueryBuilder(QueryConfig(health=True), sources.make(name, "node", sources.Trust()))
        stats = {p.stat for p in b.mem_parts("`n1`")}
        assert "count" not in stats and "early" not in stats and "fresh" in stats
        counts = b.mem_counts(["GPU-a", "GPU-b"], nodes="`n1`")
        # within the shard's pattern, as the aggregates: a bare node!="" costs the store a scan of every node
        assert counts.count("=~`n1`") == counts.count("`GPU-a|GPU-b`")
        assert '"stat", "count"' in counts and '"stat", "early"' in counts and "offset 900s" in counts
        # once per statistic and branch: the join's branch (ours, while series lack the node label) or a node label
        branches = (2 if b.join else 1) if name == sources.OURS else len(b.node_labels)
        assert counts.count("`GPU-a|GPU-b`") == 2 * branches
        if name != sources.OURS:
            # a target's node label only from the trusted jobs and namespaces, as in the aggregates
            assert counts.count(sources.Trust().matchers()) == 2 * (len(b.node_labels) - 1)


def test_statistics_of_metrics_the_store_does_not_hold_are_not_asked_for() -> None:
    """QueryBuilder.has: with the store's metric names known, an optional statistic of an absent metric
    (GPM's SM activity, the health fields, the score's counters, pod attribution) is left out; the
    statistics every GPU needs are asked for whatever the names say; unknown names: everything."""
    cfg = QueryConfig(source="gpu-exporter", health=True, pci=True)
    every = QueryBuilder(cfg)
    b = QueryBuilder(cfg)
    b.present = frozenset({"gpu_utilization_ratio", "gpu_up"})
    stats = re.compile(r'"stat", "([a-z_0-9]+)')  # xid_$1, state_$1, pci_$1: xid, state, pci

    def asked(builder: QueryBuilder) -> set[str]:
        return {m.rstrip("_") for p in builder.util_parts("`n`") + builder.mem_parts("`n`")
                for m in stats.findall(p.tagged)}

    assert asked(b) == {"mean", "std", "p95", "count", "early", "fresh", "used", "deriv", "up"}
    assert b.allocation_parts("`n`") == [] and len(every.allocation_parts("`n`")) == 2
    assert {"sm_mean", "free", "total", "score_xid", "remap", "width", "state", "pci"} <= asked(every)
    b.present = frozenset({"gpu_utilization_ratio", "gpu_xid_errors_total", "gpu_pcie_link_width",
                           "gpu_allocation_info"})
    assert asked(b) - asked(QueryBuilder(cfg)) == set()
    assert {"score_xid", "xid", "width"} <= asked(b) and not {"width_max", "score_ecc", "remap"} & asked(b)
    assert len(b.allocation_parts("`n`")) == 2
    # AMD's exporter may prefix every name: a present name that ends in the metric counts
    amd = QueryBuilder(QueryConfig(source="amd", health=True), sources.make("amd", "node", sources.Trust()))
    amd_all = asked(amd)
    amd.present = frozenset({f"amd_{amd.source.util}", f"amd_{amd.source.mem_used}", f"amd_{amd.source.mem_total}"})
    assert "total" in asked(amd) and asked(amd) < amd_all
