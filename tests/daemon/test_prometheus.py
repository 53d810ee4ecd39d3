#!/usr/bin/python3
"""test_prometheus.py — clocherd's /metrics text read by Prometheus' own parser.

Drives tests/daemon/metrics_dump (argv[1]) with a seeded random sequence of stats calls,
parses its output with prometheus_client.parser (Debian's python3-prometheus-client) and checks
that every family has the right type and every sample the value the calls imply: request
counters by method/status/tenant, token counters, histogram buckets/sum/count, gauges, the
per-worker engine and supervisor series. Label values with quotes and backslashes must survive
the round trip. Exits non-zero with a message on the first mismatch.
"""
import random
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

GRPC = ["OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
        "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
        "UNAUTHENTICATED"]
BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]
LE = ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10",
      "30", "60", "+Inf"]
STATES = ["starting", "ready", "draining", "dead"]
PHASES = ["starting", "serving", "draining", "stopping"]
# "-" is anonymous access; "bad/name" is not a tenant name config.c accepts: it counts as
# "_other", like "_other" itself
TENANTS = {"-": "anonymous", "acme": "acme", "beta.co": "beta.co", "bad/name": "_other",
           "_other": "_other"}
METHODS = ["Generate", "Tokenize", "Health.Check", 'Odd"Name\\x']


def fail(msg):
    print("test_prometheus: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def main():
    if len(sys.argv) != 2:
        fail("usage: test_prometheus.py PATH/TO/metrics_dump")
    rng = random.Random(20240605)
    lines = []
    want = {}  # (sample name, frozenset(labels)) -> value
    types = {}

    def add(name, labels, v):
        k = (name, frozenset(labels.items()))
        want[k] = want.get(k, 0) + v

    def setv(name, labels, v):
        want[(name, frozenset(labels.items()))] = v

    hist = {}  # (family, tenant) -> [bucket counts..., sum_ns]
    for _ in range(3000):
        op = rng.random()
        t = rng.choice(list(TENANTS))
        lab = TENANTS[t]
        if op < 0.4:
            m = rng.choice(METHODS)
            code = rng.choice([0, 0, 0, 1, 3, 8, 14, 16, 99, -5])
            lines.append(f"request {t} {m} {code}")
            status = GRPC[code] if 0 <= code < len(GRPC) else "UNKNOWN"
            add("clocher_requests_total", {"method": m, "status": status, "tenant": lab}, 1)
        elif op < 0.7:
            p, c, ca = rng.randrange(0, 5000), rng.randrange(0, 2000), rng.randrange(0, 100)
            ns = [rng.choice([0, rng.randrange(1, 10**8), rng.randrange(1, 10**11)])
                  for _ in range(3)]
            lines.append(f"generation {t} {p} {c} {ca} {ns[0]} {ns[1]} {ns[2]}")
            add("clocher_prompt_tokens_total", {"tenant": lab}, p)
            add("clocher_completion_tokens_total", {"tenant": lab}, c)
            add("clocher_cached_tokens_total", {"tenant": lab}, ca)
            for fam, v in zip(["clocher_ttft_seconds", "clocher_tpot_seconds",
                               "clocher_e2e_seconds"], ns):
                h = hist.setdefault((fam, lab), [0] * 15)
                if v == 0:
                    continue  # a 0 ns figure is not observed
                b = next((i for i, bound in enumerate(BOUNDS) if v <= bound * 1e9), 13)
                h[b] += 1
                h[14] += v
        elif op < 0.8:
            d = rng.randrange(-3, 5)
            lines.append(f"queue {d}")
            add("clocher_queue_depth", {}, d)
        else:
            d = rng.randrange(-2, 4)
            lines.append(f"streams {t} {d}")
            add("clocher_active_streams", {"tenant": lab}, d)
    # the per-worker series: slot 1 reports its engine twice (the latest wins), slot 0 never
    lines.append("engine 1 9 9 9 9 9 9 9 9 9")
    lines.append("engine 1 3 2 100 30 20 700 300 4 123456789")
    lines.append("slot 0 0 3 2 0 3")
    lines.append("slot 1 1 1 0 65536 1")
    lines.append("phase 1")

    proc = subprocess.run([sys.argv[1]], input="\n".join(lines) + "\n", capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        fail(f"metrics_dump exited {proc.returncode}: {proc.stderr}")
    text = proc.stdout

    got = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            k = (s.name, frozenset(s.labels.items()))
            if k in got:
                fail(f"duplicate sample {s.name}{s.labels}")
            got[k] = s.value

    expect_types = {
        "clocher_requests": "counter", "clocher_prompt_tokens": "counter",
        "clocher_completion_tokens": "counter", "clocher_cached_tokens": "counter",
        "clocher_ttft_seconds": "histogram", "clocher_tpot_seconds": "histogram",
        "clocher_e2e_seconds": "histogram", "clocher_queue_depth": "gauge",
        "clocher_active_streams": "gauge", "clocher_kv_blocks": "gauge",
        "clocher_running_sequences": "gauge", "clocher_waiting_sequences": "gauge",
        "clocher_prefix_hit_tokens": "counter", "clocher_prefix_miss_tokens": "counter",
        "clocher_preemptions": "counter", "clocher_worker_rss_bytes": "gauge",
        "clocher_worker_state": "gauge", "clocher_worker_restarts": "counter",
        "clocher_worker_hot_replicated_bytes": "gauge", "clocher_worker_given_up": "gauge",
        "clocher_worker_hot_replicated_tensors": "gauge",
        "clocher_worker_generation": "gauge", "clocher_workers_ready": "gauge",
        "clocher_daemon_phase": "gauge",
    }
    for name, ty in expect_types.items():
        if types.get(name) != ty:
            fail(f"family {name}: type {types.get(name)}, want {ty}")

    for (fam, lab), h in hist.items():
        cum = 0
        for i, le in enumerate(LE):
            cum += h[i]
            setv(fam + "_bucket", {"tenant": lab, "le": le}, cum)
        setv(fam + "_count", {"tenant": lab}, cum)
        setv(fam + "_sum", {"tenant": lab}, h[14] / 1e9)

    node = {"0": "0", "1": "1"}
    for k, v in {"running_sequences": 3, "waiting_sequences": 2,
                 "prefix_hit_tokens_total": 700, "prefix_miss_tokens_total": 300,
                 "preemptions_total": 4, "worker_rss_bytes": 123456789}.items():
        setv("clocher_" + k, {"worker": "1", "node": node["1"]}, v)
    for st, v in [("used", 30), ("cached", 20), ("free", 50)]:
        setv("clocher_kv_blocks", {"worker": "1", "node": "1", "state": st}, v)
    for slot, state, restarts, hot, gen in [("0", 3, 2, 0, 3), ("1", 1, 0, 65536, 1)]:
        labels = {"worker": slot, "node": node[slot]}
        for i, name in enumerate(STATES):
            setv("clocher_worker_state", dict(labels, state=name), 1 if i == state else 0)
        setv("clocher_worker_restarts_total", labels, restarts)
        setv("clocher_worker_hot_replicated_bytes", labels, hot)
        setv("clocher_worker_hot_replicated_tensors", labels, 0)  # metrics_dump sets none
        setv("clocher_worker_generation", labels, gen)
        setv("clocher_worker_given_up", labels, 0)
    setv("clocher_workers_ready", {}, 1)
    for i, name in enumerate(PHASES):
        setv("clocher_daemon_phase", {"phase": name}, 1 if i == 1 else 0)

    checked = 0
    for k, v in want.items():
        if k not in got:
            if v == 0 and k[0] == "clocher_requests_total":
                continue
            fail(f"missing sample {k[0]}{dict(k[1])} (want {v})")
        g = got[k]
        if abs(g - v) > 1e-6 * max(1.0, abs(v)):
            fail(f"{k[0]}{dict(k[1])} = {g}, want {v}")
        checked += 1
    # nothing unexpected: engine series of the slot that never reported, zero request counters
    for (name, labels), v in got.items():
        d = dict(labels)
        if d.get("worker") == "0" and name in ("clocher_running_sequences", "clocher_kv_blocks"):
            fail(f"slot 0 never reported but has {name}{d}")
        if name == "clocher_requests_total" and (name, labels) not in want:
            fail(f"unexpected {name}{d} = {v}")
    if 'Odd"Name\\x' not in {dict(k[1]).get("method") for k in got}:
        fail("the method label with a quote and a backslash did not survive")
    print(f"test_prometheus: ok, {checked} samples agree with {len(lines)} calls")


if __name__ == "__main__":
    main()
