#!/usr/bin/python3
"""test_metrics_live.py — /metrics of a real clocherd (tests/http/httptest.py's daemon: the
synthesized demo model, adapter ad1 in its configuration) after real requests over HTTP and
gRPC:
  - vllm:inter_token_latency_seconds counts one observation per generated token after each
    request's first (not one per request), vllm:request_queue_time_seconds one per generation;
  - per-adapter counters, and clocher_adapter_info's source: "config" for ad1, "runtime" for an
    adapter LoadAdapter put on this host only (whose reply, like ListAdapters, says so);
  - vllm:lora_requests_info names ad1 as running while its stream is generating;
  - the config key access_log: one JSON line per finished generation in that file;
  - `promtool check metrics` accepts the scrape;
  - every panel of deploy/grafana/clocher.json reads only metric names the scrape has, and
    promtool parses every expression.
Without promtool the checks that need it are left out and the test exits 77 (a counted skip).
"""
import http.client
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "http"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleetlib  # noqa: E402
import httptest  # noqa: E402
from httptest import gwtest  # noqa: E402


def completion(d, model, n_tokens, stream=False):
    st, body, _ = httptest.post(d, "/v1/completions",
                                {"model": model, "prompt": "Once upon a time",
                                 "max_tokens": n_tokens, "temperature": 0})
    assert st == 200, (st, body)
    return body["usage"]["completion_tokens"]


def lora_info(text):
    fams = fleetlib.families(text)
    (_, samples) = fams["vllm:lora_requests_info"]
    assert len(samples) == 1, samples
    return samples[0][1]


def main():
    logdir = tempfile.mkdtemp(prefix="clocher-accesslog-")
    access_log = os.path.join(logdir, "access.log")
    d = httptest.start_daemon(access_log=access_log)
    try:
        base = d.model_name
        gens = []  # completion tokens of each generation
        for model, n in ((base, 6), ("ad1", 5), ("ad1", 1), (base, 9)):
            gens.append(completion(d, model, n))
        md = gwtest.key(httptest.ALICE)
        ids, _ = gwtest.generate(d.stub, md, prompt="Hello there", max_tokens=7, adapter="ad1")
        gens.append(len(ids))
        assert all(g >= 1 for g in gens), gens

        # the access log (config key access_log): one line per generation, in finishing order
        with open(access_log) as f:
            lines = [json.loads(line) for line in f]
        assert [e["completion_tokens"] for e in lines] == gens, (lines, gens)
        assert all(e["tenant"] == "alice" and e["status"] == "ok" for e in lines), lines

        # a run-time load: host-local, and said so
        ad2 = gwtest.adapter(gwtest.demo_model(), "ad2", seed=5)
        r = d.stub.LoadAdapter(gwtest.pb.LoadAdapterRequest(name="ad2", path=ad2), metadata=md,
                               timeout=60)
        assert r.adapter.source == "runtime", r
        try:  # a declared adapter is not loaded again at run time
            d.stub.LoadAdapter(gwtest.pb.LoadAdapterRequest(name="ad1", path=d.cfg["adapters"]["ad1"]),
                               metadata=md, timeout=60)
            raise AssertionError("LoadAdapter of the declared ad1 succeeded")
        except gwtest.grpc.RpcError as e:
            assert e.code() == gwtest.grpc.StatusCode.ALREADY_EXISTS, e
        listed = {a.name: a.source for a in
                  d.stub.ListAdapters(gwtest.pb.ListAdaptersRequest(), metadata=md).adapters}
        assert listed == {"ad1": "config", "ad2": "runtime"}, listed

        text = httptest.metrics(d)
        fams = fleetlib.families(text)
        itl = fleetlib.sample_sum(fams, "vllm:inter_token_latency_seconds_count")
        want = sum(g - 1 for g in gens)
        assert itl == want, "inter-token observations %s, want %s (one per token after the " \
            "first of %s)" % (itl, want, gens)
        assert fleetlib.sample_sum(fams, "clocher_itl_seconds_count") == want
        q = fleetlib.sample_sum(fams, "vllm:request_queue_time_seconds_count")
        assert q == len(gens), (q, gens)
        assert fleetlib.sample_sum(fams, "clocher_adapter_generations_total", adapter="ad1") == 3
        assert fleetlib.sample_sum(fams, "clocher_adapter_generations_total", adapter="_base") == 2
        assert fleetlib.sample_sum(fams, "clocher_adapter_completion_tokens_total",
                                   adapter="ad1") == gens[1] + gens[2] + gens[4]
        assert fleetlib.sample_sum(fams, "clocher_adapter_info", adapter="ad1",
                                   source="config") == 1
        assert fleetlib.sample_sum(fams, "clocher_adapter_info", adapter="ad2",
                                   source="runtime") == 1
        info = lora_info(text)
        assert info["running_lora_adapters"] == "" and info["waiting_lora_adapters"] == "", info
        assert info["max_lora"] == "2", info

        # while ad1 streams, it is running
        c = httptest.conn(d)
        c.request("POST", "/v1/completions",
                  body=json.dumps({"model": "ad1", "prompt": "Once", "max_tokens": 200,
                                   "stream": True, "temperature": 0, "ignore_eos": True}),
                  headers={"Authorization": "Bearer " + httptest.ALICE,
                           "Content-Type": "application/json"})
        resp = c.getresponse()
        assert resp.status == 200
        line = resp.fp.readline()
        while not line.startswith(b"data: "):
            line = resp.fp.readline()
        info = lora_info(httptest.metrics(d))
        assert info["running_lora_adapters"] == "ad1", info
        assert info["waiting_lora_adapters"] == "", info
        c.close()  # hanging up cancels it

        # the dashboard's metric names exist in this scrape
        exprs = fleetlib.dashboard_exprs()
        assert len(exprs) >= 15, exprs
        have = set()
        for name, (_, samples) in fams.items():
            have.add(name)
            have.update(s[0] for s in samples)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                have.add(line.split()[2])
        for title, e in exprs:
            names = fleetlib.metric_names(e)
            assert names, "panel %r: no metric in %s" % (title, e)
            missing = {n for n in names if n not in have and
                       not (n.endswith("_bucket") and n[:-7] in have)}
            assert not missing, "panel %r reads %s, not in clocherd's /metrics" % (title, missing)

        if not fleetlib.promtool():
            print("test_metrics_live: promtool is not installed: its checks skipped")
            return fleetlib.SKIP
        fleetlib.promtool_check_metrics(text)
        fleetlib.promtool_check_exprs(exprs)
        print("test_metrics_live: ok (%d panels' PromQL checked)" % len(exprs))
        return 0
    finally:
        rc = d.stop()
        for n in os.listdir(logdir):
            os.unlink(os.path.join(logdir, n))
        os.rmdir(logdir)
        assert rc == 0, "clocherd exited with %s (its log is above)" % rc


if __name__ == "__main__":
    sys.exit(main())
