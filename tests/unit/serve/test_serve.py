"""The real `gpu-exporter serve` process on the simulated backend: paths, formats, modes."""

from __future__ import annotations

import concurrent.futures
import gzip

from tests.harness.exporter import ExporterProcess, parse_samples, raw_request, sample
from tests.harness.poll import wait_until
from tests.harness.prom import check_metrics


def test_simulated_metrics_are_clean_and_labelled() -> None:
    with ExporterProcess(["--backend", "simulated", "--simulated-gpus", "5"]) as ex:
        text = ex.scrape_text()
        assert check_metrics(text) == []
        s = parse_samples(text)
        for i in range(5):
            assert sample(s, "gpu_info", gpu=str(i), backend="simulated", vendor="simulated") == 1.0
            assert sample(s, "gpu_up", gpu=str(i)) == 1.0
            u = sample(s, "gpu_utilization_ratio", gpu=str(i))
            assert u is not None and 0.0 <= u <= 1.0
        # idle GPU 0 and a leaking GPU 4 look the part
        assert sample(s, "gpu_utilization_ratio", gpu="0") <= 0.01  # type: ignore[operator]
        assert sample(s, "gpu_memory_used_bytes", gpu="4") > 8 * 2**30  # type: ignore[operator]
        # a reading the simulated datacentre GPU does not have is absent, not 0
        assert not any(n == "gpu_fan_speed_ratio" for n, _ in s)
        assert sample(s, "gpu_exporter_collector_success", backend="simulated") == 1.0
        assert sample(s, "gpu_exporter_gpus", backend="simulated") == 5.0
        host = [dict(ls) for n, ls in s if n == "gpu_host_info"]
        assert len(host) == 1 and host[0]["cpu_model"] and host[0]["kernel"]
        assert "SIMULATED" in ex.log()


def test_node_name_from_env() -> None:
    with ExporterProcess(["--backend", "simulated"], env={"NODE_NAME": "gpu-node-7"}) as ex:
        s = ex.scrape()
        assert sample(s, "gpu_host_info", node="gpu-node-7") == 1.0


def test_paths_formats_and_encodings() -> None:
    with ExporterProcess(["--backend", "simulated", "--metrics-path", "/gpu-metrics"]) as ex:
        status, body, headers = ex.get("/")
        assert status == 200 and b"/gpu-metrics" in body and "text/html" in headers["Content-Type"]
        assert ex.get("/healthz")[0] == 200
        assert ex.get("/metrics")[0] == 404
        status, body, headers = ex.get("/gpu-metrics", {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert status == 200 and headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith(b"# EOF")
        assert b"gpu_energy_joules_total" in body
        status, body, headers = ex.get("/gpu-metrics", {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert b"gpu_utilization_ratio" in gzip.decompress(body)
        wait_until(lambda: ex.get("/readyz")[0] == 200, 10, what="/readyz 200")


def test_concurrent_scrapes_share_collections() -> None:
    with ExporterProcess(["--backend", "simulated"]) as ex:
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            results = list(pool.map(lambda _: ex.get("/metrics")[0], range(200)))
        assert results.count(200) == 200
        s = ex.scrape()
        collections = sample(s, "gpu_exporter_collections_total", backend="simulated")
        assert collections is not None and collections <= 201


def test_background_mode_serves_cached_collection() -> None:
    with ExporterProcess(["--backend", "simulated", "--collection-interval", "60"]) as ex:
        wait_until(lambda: sample(ex.scrape(), "gpu_exporter_collections_total", backend="simulated"), 10,
                   what="first background collection")
        counts = {sample(ex.scrape(), "gpu_exporter_collections_total", backend="simulated") for _ in range(20)}
        assert counts == {1.0}
        text = ex.scrape_text()
        # no timestamps on samples: every sample line has exactly "name{labels} value"
        for line in text.splitlines():
            if line and not line.startswith("#"):
                assert len(line.rsplit("} ", 1)[-1].split()) == 1 or "{" not in line, line


def test_scrapes_within_cache_ttl_reuse_the_collection() -> None:
    with ExporterProcess(["--backend", "simulated", "--cache-ttl", "60"]) as ex:
        first = sample(ex.scrape(), "gpu_exporter_collections_total", backend="simulated")
        for _ in range(5):
            assert sample(ex.scrape(), "gpu_exporter_collections_total", backend="simulated") == first
    with ExporterProcess(["--backend", "simulated", "--cache-ttl", "0"]) as ex:
        counts = [sample(ex.scrape(), "gpu_exporter_collections_total", backend="simulated") for _ in range(3)]
        assert counts == sorted(set(counts)) and len(counts) == 3  # a fresh collection every scrape


def test_http_protocol_edges() -> None:
    with ExporterProcess(["--backend", "simulated"]) as ex:
        assert raw_request(ex.port, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        post = raw_request(ex.port, b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
        assert post.startswith(b"HTTP/1.1 405 ")
        assert raw_request(ex.port, b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 414 ")
        assert raw_request(ex.port, b"GET / HTTP/1.1\r\nX: " + b"b" * 10000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
        many = b"".join(b"X-%d: 1\r\n" % i for i in range(200))
        assert raw_request(ex.port, b"GET / HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
        head = raw_request(ex.port, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")
        # keep-alive: two requests on one connection, two answers; HTTP/1.0 closes after one
        two = raw_request(ex.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                          b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert two.count(b"HTTP/1.1 200 OK") == 2
        one = raw_request(ex.port, b"GET /healthz HTTP/1.0\r\n\r\nGET /healthz HTTP/1.0\r\n\r\n")
        assert one.count(b"HTTP/1.1 200 OK") == 1 and b"Connection: close" in one
        assert ex.get("/metrics")[0] == 200  # still serving
