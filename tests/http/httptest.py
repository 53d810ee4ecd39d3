"""httptest — what the HTTP API's tests share: a real clocherd (tests/gateway/gwtest.py's Daemon:
a Unix gRPC socket, real workers) on the synthesized demo model (a real tokenizer) with its
OpenAI-compatible listener on a free loopback port, two tenants (alice: every adapter, bob: none
and one stream at a time) and one adapter, plus small HTTP helpers on http.client.
"""
import http.client
import json
import os
import re
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "gateway"))
import gwtest  # noqa: E402

ALICE = "alice-key-0001"
BOB = "bob-key-0000002"
CAROL = "carol-key-00003"


def start_daemon(**extra_cfg):
    model = gwtest.demo_model()
    ad = gwtest.adapter(model, "ad1", seed=3)
    port, mport = gwtest.free_port(), gwtest.free_port()
    http_cfg = {"listen": "127.0.0.1:%d" % port, "max_body_bytes": 65536, "timeout_s": 5}
    http_cfg.update(extra_cfg.pop("http", {}))
    d = gwtest.Daemon(model, workers=1,
                      tenants=[{"name": "alice", "api_keys": [ALICE], "allowed_adapters": "*",
                                "max_concurrent_streams": 64},
                               {"name": "bob", "api_keys": [BOB], "allowed_adapters": [],
                                "max_concurrent_streams": 1},
                               {"name": "carol", "api_keys": [CAROL], "allowed_adapters": [],
                                "requests_per_s": 1}],
                      adapters={"ad1": ad},
                      limits={"max_prompt_tokens": 64, "max_tokens": 1000},
                      extra=dict({"http": http_cfg,
                                  "metrics": {"listen": "127.0.0.1:%d" % mport}}, **extra_cfg))
    d.http_port, d.metrics_port = port, mport
    wait_http(port)
    d.model_name = get(d, "/v1/models")[1]["data"][0]["id"]
    return d


def wait_http(port, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("the HTTP listener on port %d never opened" % port)


def conn(d, timeout=60):
    return http.client.HTTPConnection("127.0.0.1", d.http_port, timeout=timeout)


def request(d, method, path, body=None, key=ALICE, headers=None, raw=None):
    """(status, parsed JSON body or text, headers) of one request."""
    c = conn(d)
    h = dict(headers or {})
    if key:
        h["Authorization"] = "Bearer " + key
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    if data is not None:
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=data, headers=h)
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    return r.status, parsed, r


def get(d, path, **kw):
    return request(d, "GET", path, **kw)


def post(d, path, body, **kw):
    return request(d, "POST", path, body, **kw)


def error_of(status_body):
    """The error object of a reply, checked to be OpenAI's shape."""
    body = status_body[1]
    assert isinstance(body, dict) and set(body) == {"error"}, body
    e = body["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"], e
    return e


def metrics(d):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % d.metrics_port, timeout=10) as r:
        return r.read().decode()


def metric(d, name, **labels):
    """Sum of a series' samples whose labels include `labels`."""
    total = 0.0
    for line in metrics(d).splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def wait_for(pred, timeout=10, what="condition"):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)
