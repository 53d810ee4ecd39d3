"""The OpenAI-compatible HTTP API end to end (daemon/http.c): replies, SSE framing (raw, with
curl), every error status, bad bodies, a client that hangs up, idle connections, a taken port.
One clocherd for the module; the draining test stops it, so it runs last."""
import json
import os
import re
import socket
import subprocess
import threading
import time

import pytest

import httptest as ht
from httptest import ALICE, BOB


@pytest.fixture(scope="module")
def d():
    daemon = ht.start_daemon()
    yield daemon
    daemon.stop()


# ---- models ----

def test_models_per_tenant(d):
    st, body, _ = ht.get(d, "/v1/models")
    assert st == 200 and body["object"] == "list"
    ids = [m["id"] for m in body["data"]]
    assert ids[0] == d.model_name and "ad1" in ids
    assert all(m["object"] == "model" for m in body["data"])
    st, body, _ = ht.get(d, "/v1/models", key=BOB)
    assert st == 200 and [m["id"] for m in body["data"]] == [d.model_name]


# ---- replies ----

def test_completion(d):
    st, b, _ = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "Once upon a time",
                                              "max_tokens": 7, "temperature": 0})
    assert st == 200, b
    assert b["object"] == "text_completion" and b["id"].startswith("cmpl-")
    assert len(b["choices"]) == 1 and isinstance(b["choices"][0]["text"], str)
    u = b["usage"]
    assert u["completion_tokens"] <= 7 and u["prompt_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert "cached_tokens" in u["prompt_tokens_details"]
    if u["completion_tokens"] == 7:
        assert b["choices"][0]["finish_reason"] == "length"


def test_completion_token_ids_and_prefix_cache(d):
    body = {"model": d.model_name, "prompt": list(range(5, 45)), "max_tokens": 3,
            "temperature": 0}
    st, a, _ = ht.post(d, "/v1/completions", body)
    assert st == 200, a
    st, b, _ = ht.post(d, "/v1/completions", body)
    assert st == 200 and b["choices"][0]["text"] == a["choices"][0]["text"]
    assert b["usage"]["prompt_tokens"] == 40
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_chat_seed_and_n(d):
    req = {"model": d.model_name, "messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Hello"}],
           "max_completion_tokens": 6, "temperature": 1.0, "top_p": 0.9, "seed": 42, "n": 3}
    st, a, _ = ht.post(d, "/v1/chat/completions", req)
    assert st == 200, a
    assert a["object"] == "chat.completion" and len(a["choices"]) == 3
    assert [c["index"] for c in a["choices"]] == [0, 1, 2]
    for c in a["choices"]:
        assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    st, b, _ = ht.post(d, "/v1/chat/completions", req)
    assert [c["message"]["content"] for c in b["choices"]] == \
        [c["message"]["content"] for c in a["choices"]]
    assert b["usage"]["completion_tokens"] <= 18


def test_stop_string(d):
    body = {"model": d.model_name, "prompt": "Hello there", "max_tokens": 20, "temperature": 0}
    st, full, _ = ht.post(d, "/v1/completions", body)
    text = full["choices"][0]["text"]
    assert st == 200 and len(text) > 14, text
    stop = text[10:13]
    st, b, _ = ht.post(d, "/v1/completions", dict(body, stop=[stop, "\u2603"]))
    assert st == 200
    assert b["choices"][0]["text"] == text[:text.index(stop)]
    assert b["choices"][0]["finish_reason"] == "stop"


def test_adapter_by_name(d):
    req = {"model": "ad1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
           "temperature": 0}
    st, a, _ = ht.post(d, "/v1/chat/completions", req)
    assert st == 200 and a["model"] == "ad1"
    st, base, _ = ht.post(d, "/v1/chat/completions", dict(req, model=d.model_name))
    assert st == 200
    assert a["choices"][0]["message"]["content"] != base["choices"][0]["message"]["content"]
    # a tenant not allowed the adapter: as if it did not exist (gRPC answers NOT_FOUND too)
    st, *_ = r = ht.post(d, "/v1/chat/completions", req, key=BOB)
    assert st == 404 and ht.error_of(r)["code"] == "model_not_found"


def sse_events(raw):
    """The data payloads of an SSE body, checking its framing: 'data: X' lines, each event
    ended by a blank line, nothing else."""
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = raw.split("\n\n")
    assert events[-1] == ""
    out = []
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e, repr(e)
        out.append(e[6:])
    assert out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return [json.loads(x) for x in out[:-1]]


def curl_stream(d, path, body, key=ALICE):
    p = subprocess.run(["curl", "-sS", "-N", "-D", "-", "-H", "Authorization: Bearer " + key,
                        "-H", "Content-Type: application/json", "-d", json.dumps(body),
                        "http://127.0.0.1:%d%s" % (d.http_port, path)],
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    head, _, raw = p.stdout.decode().partition("\r\n\r\n")
    return head, raw


def test_chat_stream_raw_framing(d):
    head, raw = curl_stream(d, "/v1/chat/completions",
                            {"model": d.model_name, "stream": True, "max_tokens": 5,
                             "messages": [{"role": "user", "content": "Hi"}],
                             "stream_options": {"include_usage": True}})
    assert head.startswith("HTTP/1.1 200")
    assert "content-type: text/event-stream" in head.lower()
    ev = sse_events(raw)
    assert all(e["object"] == "chat.completion.chunk" for e in ev)
    assert len({e["id"] for e in ev}) == 1
    assert ev[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] in ("stop", "length")
    usage = ev[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] <= 5
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in ev if e["choices"])
    assert isinstance(text, str)


def test_completion_stream_n_no_usage(d):
    _, raw = curl_stream(d, "/v1/completions", {"model": d.model_name, "prompt": "Hi",
                                                "stream": True, "max_tokens": 4, "n": 2,
                                                "temperature": 0})
    ev = sse_events(raw)
    assert all("usage" not in e for e in ev)
    assert all(e["object"] == "text_completion" for e in ev)
    assert {e["choices"][0]["index"] for e in ev} == {0, 1}
    # greedy: both choices say the same
    texts = ["".join(e["choices"][0]["text"] for e in ev if e["choices"][0]["index"] == i)
             for i in (0, 1)]
    assert texts[0] == texts[1]


def test_stream_matches_unstreamed(d):
    body = {"model": d.model_name, "prompt": "The cat", "max_tokens": 12, "temperature": 0}
    st, b, _ = ht.post(d, "/v1/completions", body)
    _, raw = curl_stream(d, "/v1/completions", dict(body, stream=True))
    text = "".join(e["choices"][0]["text"] for e in sse_events(raw))
    assert text == b["choices"][0]["text"]


# ---- errors ----

def test_401(d):
    for key in (None, "not-a-key-at-all"):
        r = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "x"}, key=key)
        assert r[0] == 401 and ht.error_of(r)["type"] == "authentication_error"
        assert r[2].getheader("WWW-Authenticate") == "Bearer"
    assert ht.get(d, "/v1/models", key=None)[0] == 401


def test_404_model_and_path(d):
    r = ht.post(d, "/v1/chat/completions", {"model": "no-such-model",
                                            "messages": [{"role": "user", "content": "x"}]})
    e = ht.error_of(r)
    assert r[0] == 404 and e["param"] == "model" and "no-such-model" in e["message"]
    r = ht.get(d, "/v1/nothing")
    assert r[0] == 404 and ht.error_of(r)
    r = ht.get(d, "/v1/completions")
    assert r[0] == 405 and ht.error_of(r)


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x"}, "model"),
    ({"model": 5, "prompt": "x"}, "model"),
    ({"model": "M"}, "prompt"),
    ({"model": "M", "prompt": {"a": 1}}, "prompt"),
    ({"model": "M", "prompt": [1, "a"]}, "prompt"),
    ({"model": "M", "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": "M", "prompt": "x", "temperature": -1}, "temperature"),
    ({"model": "M", "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": "M", "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": "M", "prompt": "x", "max_tokens": 100000}, "max_tokens"),
    ({"model": "M", "prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"model": "M", "prompt": "x", "n": 0}, "n"),
    ({"model": "M", "prompt": "x", "n": 1000}, "n"),
    ({"model": "M", "prompt": "x", "n": 1.5}, "n"),
    ({"model": "M", "prompt": "x", "seed": "s"}, "seed"),
    ({"model": "M", "prompt": "x", "stop": 3}, "stop"),
    ({"model": "M", "prompt": "x", "stop": [""]}, "stop"),
    ({"model": "M", "prompt": "x", "stop": ["a"] * 17}, "stop"),
    ({"model": "M", "prompt": "x", "stream": "yes"}, "stream"),
    ({"model": "M", "prompt": "x", "stream_options": 1}, "stream_options"),
    ({"model": "M", "prompt": "x", "logprobs": 21}, "logprobs"),
    ({"model": "M", "prompt": "x", "logprobs": -1}, "logprobs"),
    ({"model": "M", "prompt": "x", "logprobs": "x"}, "logprobs"),
    ({"model": "M", "prompt": "x", "logprobs": True}, "logprobs"),
    ({"model": "M", "prompt": "x", "top_logprobs": 2}, "top_logprobs"),
    ({"model": "M", "prompt": "x", "echo": True}, "echo"),
    ({"model": "M", "prompt": "x", "best_of": 3}, "best_of"),
])
def test_400_completions(d, body, param):
    body = dict(body)
    if body.get("model") == "M":
        body["model"] = d.model_name
    r = ht.post(d, "/v1/completions", body)
    e = ht.error_of(r)
    assert r[0] == 400 and e["param"] == param, (r[0], e)
    assert e["type"] == "invalid_request_error"


@pytest.mark.parametrize("body,param", [
    ({"model": "M"}, "messages"),
    ({"model": "M", "messages": []}, "messages"),
    ({"model": "M", "messages": "hi"}, "messages"),
    ({"model": "M", "messages": [{"content": "x"}]}, "messages"),
    ({"model": "M", "messages": [{"role": "wizard", "content": "x"}]}, "messages"),
    ({"model": "M", "messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"model": "M", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "logprobs": 1},
     "logprobs"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
     "top_logprobs"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
      "top_logprobs": 21}, "top_logprobs"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
      "top_logprobs": -2}, "top_logprobs"),
    ({"model": "M", "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "function"}]}, "tools"),
])
def test_400_chat(d, body, param):
    body = dict(body, model=d.model_name)
    r = ht.post(d, "/v1/chat/completions", body)
    e = ht.error_of(r)
    assert r[0] == 400 and e["param"] == param, (r[0], e)


@pytest.mark.parametrize("raw", [b"", b"{", b"[1, 2]", b"null", b"\xff\xfe", b'{"model": "a\\u0000"}',
                                 b"[" * 60000, b'{"model": "x", "model": 1e999}'])
def test_400_malformed_bodies(d, raw):
    r = ht.request(d, "POST", "/v1/completions", raw=raw)
    e = ht.error_of(r)
    assert r[0] == 400 and e["type"] == "invalid_request_error", (r[0], e)


def test_413_body_too_large(d):
    big = json.dumps({"model": d.model_name, "prompt": "x" * 70000}).encode()
    r = ht.request(d, "POST", "/v1/completions", raw=big)
    assert r[0] == 413 and "max_body_bytes" in ht.error_of(r)["message"]
    # chunked (no Content-Length): refused as it comes
    p = subprocess.run(["curl", "-sS", "-H", "Authorization: Bearer " + ALICE,
                        "-H", "Transfer-Encoding: chunked", "--data-binary", "@-",
                        "-w", "%{http_code}", "-o", "/dev/null",
                        "http://127.0.0.1:%d/v1/completions" % d.http_port],
                       input=big, capture_output=True, timeout=30)
    assert p.stdout == b"413", p


def test_413_prompt_too_long(d):
    r = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "hello " * 200})
    e = ht.error_of(r)
    assert r[0] == 413 and e["code"] == "context_length_exceeded" and e["param"] == "prompt"
    r = ht.post(d, "/v1/chat/completions", {"model": d.model_name, "stream": True,
                                            "messages": [{"role": "user",
                                                          "content": "hello " * 200}]})
    assert r[0] == 413 and ht.error_of(r)["param"] == "messages"


def raw_post(d, key, body):
    """POST /v1/completions on a socket of its own, nothing read yet."""
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", d.http_port), timeout=30)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
              key.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def long_stream(d, key, n=8, model=None, stream=True):
    """A request that runs for seconds (n x 1000 tokens); returns (socket, first bytes) once
    a streamed one has begun."""
    s = raw_post(d, key, {"model": model or d.model_name, "prompt": "Once", "max_tokens": 1000,
                          "n": n, "stream": stream, "temperature": 1.0})
    if not stream:
        return s, b""
    first = s.recv(4096)
    assert first.startswith(b"HTTP/1.1 200"), first
    return s, first


def test_429_tenant_stream_limit(d):
    s, _ = long_stream(d, BOB, n=1)
    try:
        r = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "x"}, key=BOB)
        assert r[0] == 429 and ht.error_of(r)["type"] == "rate_limit_error"
        assert r[2].getheader("Retry-After") == "1"
    finally:
        s.close()
    # the slot comes back once the first is cancelled
    ht.wait_for(lambda: ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "x",
                                                       "max_tokens": 1}, key=BOB)[0] == 200,
                what="bob's stream slot back")


def test_429_tenant_quota(d):
    """The tenant quotas (issue 15) hold on the HTTP door too: carol may start 1 request per
    second; a burst gets 429 naming the limit, with Retry-After."""
    body = {"model": d.model_name, "prompt": "x", "max_tokens": 1}
    codes = [ht.post(d, "/v1/completions", body, key=ht.CAROL) for _ in range(4)]
    refused = [r for r in codes if r[0] == 429]
    assert refused, [r[0] for r in codes]
    assert "requests_per_s" in ht.error_of(refused[0])["message"], ht.error_of(refused[0])
    assert refused[0][2].getheader("Retry-After")
    assert codes[0][0] == 200, codes[0]


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_cancels(d, stream):
    cancelled = ht.metric(d, "clocher_requests_total", status="CANCELLED", tenant="alice")
    s, _ = long_stream(d, ALICE, n=16, stream=stream)
    ht.wait_for(lambda: ht.metric(d, "clocher_running_sequences") > 0, what="sequences running")
    t0 = time.time()
    s.close()
    ht.wait_for(lambda: ht.metric(d, "clocher_requests_total", status="CANCELLED",
                                  tenant="alice") == cancelled + 1, timeout=3,
                what="the request counted CANCELLED")
    # the worker stops them and frees their KV blocks (its STATS record is periodic)
    ht.wait_for(lambda: ht.metric(d, "clocher_running_sequences") == 0 and
                ht.metric(d, "clocher_kv_blocks", state="used") == 0, timeout=5,
                what="the worker idle again")
    # 16 x 1000 tokens take far longer than this on one thread
    assert time.time() - t0 < 5
    # the log line about it carries the request's id (issue 14)
    assert re.search(r"HTTP API: request cmpl-[0-9a-f]{16}: the client went away",
                     d.read_log()), d.read_log()[-2000:]


def test_idle_connections_leave_health_answerable(d):
    idle = [socket.create_connection(("127.0.0.1", p), timeout=5)
            for p in (d.http_port,) for _ in range(64)]
    try:
        for path in ("/healthz", "/health"):
            t0 = time.time()
            st, body, _ = ht.get(d, path, key=None)
            assert st == 200 and body.strip() == "serving" and time.time() - t0 < 2
    finally:
        for s in idle:
            s.close()


def test_port_taken_refused(d):
    cfg = dict(d.cfg, listen={"tcp": None, "unix": d.sock + "2"}, metrics={"listen": None})
    path = os.path.join(d.dir, "second.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([ht.gwtest.CLOCHERD, "--config", path], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "127.0.0.1:%d" % d.http_port in p.stderr, p.stderr
    # --http names it too
    p = subprocess.run([ht.gwtest.CLOCHERD, "--config", path, "--http", "nonsense"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "nonsense" in p.stderr, p.stderr


@pytest.mark.parametrize("http,extra,why", [
    ({"listen": "nohost"}, {}, "http.listen"),
    ({"listen": "127.0.0.1:99999"}, {}, "http.listen"),
    ({"listen": "127.0.0.1:8000", "colour": 1}, {}, "colour"),
    ({"listen": "127.0.0.1:8000", "max_body_bytes": 10}, {}, "http.max_body_bytes"),
    ({"listen": "127.0.0.1:8000", "max_connections": 0}, {}, "http.max_connections"),
    ({"listen": "127.0.0.1:8000", "timeout_s": "long"}, {}, "http.timeout_s"),
    ({"listen": "0.0.0.0:8000"}, {"tenants": []}, "anonymous access"),
])
def test_http_config_refused(d, http, extra, why):
    cfg = dict(d.cfg, http=http, **extra)
    path = os.path.join(d.dir, "bad.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([ht.gwtest.CLOCHERD, "--config", path, "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and why in p.stderr, p.stderr


def test_http_flag_anonymous_refused(d):
    cfg = dict(d.cfg, tenants=[], listen={"tcp": None, "unix": d.sock + "3"},
               metrics={"listen": None}, http={"listen": None})
    path = os.path.join(d.dir, "anon.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([ht.gwtest.CLOCHERD, "--config", path, "--http",
                        "0.0.0.0:%d" % ht.gwtest.free_port()],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "anonymous access" in p.stderr, p.stderr


def test_vllm_metrics(d):
    """The vLLM names beside clocher_*, read by Prometheus' own parser, while an adapter's
    request runs and after."""
    from prometheus_client.parser import text_string_to_metric_families
    assert ht.post(d, "/v1/completions", {"model": "ad1", "prompt": "x", "max_tokens": 2})[0] == 200
    s, _ = long_stream(d, ALICE, n=4, model="ad1")
    try:
        ht.wait_for(lambda: ht.metric(d, "vllm:num_requests_running") > 0, what="running > 0")
        fams = {f.name: f for f in text_string_to_metric_families(ht.metrics(d))}
        info = fams["vllm:lora_requests_info"].samples[0]
        assert info.labels["running_lora_adapters"] == "ad1"
        assert info.labels["max_lora"] == "1" and "waiting_lora_adapters" in info.labels
        kv = fams["vllm:kv_cache_usage_perc"].samples[0]
        assert kv.labels["model_name"] == d.model_name and 0 < kv.value <= 1
    finally:
        s.close()
    ht.wait_for(lambda: ht.metric(d, "vllm:num_requests_running") == 0, what="running == 0")
    fams = {f.name: f for f in text_string_to_metric_families(ht.metrics(d))}
    for name in ("vllm:num_requests_waiting", "vllm:time_to_first_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_time_per_output_token_seconds",
                 "vllm:prompt_tokens", "vllm:generation_tokens", "process_cpu_seconds",
                 "process_resident_memory_bytes", "process_start_time_seconds", "clocher_build_info"):
        assert name in fams, name
    gen = fams["vllm:generation_tokens"].samples[0].value
    assert gen == ht.metric(d, "clocher_completion_tokens_total") and gen > 0
    ttft = fams["vllm:time_to_first_token_seconds"]
    count = [x for x in ttft.samples if x.name.endswith("_count")][0].value
    inf = [x for x in ttft.samples if x.labels.get("le") == "+Inf"][0].value
    assert count == inf == ht.metric(d, "clocher_ttft_seconds_count") and count > 0


# ---- logprobs (issue 14) ----

def _sse(d, path, body):
    """The parsed data events of a streamed request (up to [DONE])."""
    c = ht.conn(d)
    c.request("POST", path, body=json.dumps(dict(body, stream=True)).encode(),
              headers={"Authorization": "Bearer " + ALICE, "Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200
    text = r.read().decode()
    c.close()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    return [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")]


def _check_completion_lp(lp, n_tokens, top):
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, lp
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) \
        == len(lp["text_offset"]) == n_tokens
    assert all(isinstance(t, str) for t in lp["tokens"])
    assert all(-9999 <= x <= 0 for x in lp["token_logprobs"])
    assert lp["text_offset"] == sorted(lp["text_offset"])
    for x, alts in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert 1 <= len(alts) <= top and all(v <= 0 for v in alts.values())
        # greedy: the drawn token is the most likely one
        assert abs(max(alts.values()) - x) < 1e-5


def test_completion_logprobs(d):
    body = {"model": d.model_name, "prompt": "Once upon a time", "max_tokens": 6,
            "temperature": 0, "logprobs": 3}
    st, b, _ = ht.post(d, "/v1/completions", body)
    assert st == 200, b
    _check_completion_lp(b["choices"][0]["logprobs"], b["usage"]["completion_tokens"], 3)
    # the same, streamed: the chunks' entries add up to the same tokens and values
    ev = _sse(d, "/v1/completions", dict(body, stream_options={"include_usage": True}))
    parts = [c["choices"][0]["logprobs"] for c in ev if c["choices"] and
             c["choices"][0]["logprobs"]]
    joined = {k: sum((p[k] for p in parts), []) for k in ("tokens", "token_logprobs")}
    assert joined["tokens"] == b["choices"][0]["logprobs"]["tokens"]
    assert joined["token_logprobs"] == pytest.approx(
        b["choices"][0]["logprobs"]["token_logprobs"], abs=1e-6)
    # logprobs 0: the drawn token's only; none asked: null
    st, b0, _ = ht.post(d, "/v1/completions", dict(body, logprobs=0))
    assert st == 200 and all(a == {} for a in b0["choices"][0]["logprobs"]["top_logprobs"])
    st, bn, _ = ht.post(d, "/v1/completions", {k: v for k, v in body.items() if k != "logprobs"})
    assert st == 200 and bn["choices"][0]["logprobs"] is None


def test_chat_logprobs(d):
    body = {"model": d.model_name, "messages": [{"role": "user", "content": "Hello"}],
            "max_tokens": 5, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    st, b, _ = ht.post(d, "/v1/chat/completions", body)
    assert st == 200, b
    content = b["choices"][0]["logprobs"]["content"]
    assert len(content) == b["usage"]["completion_tokens"]
    for e in content:
        assert set(e) == {"token", "logprob", "bytes", "top_logprobs"}, e
        assert -9999 <= e["logprob"] <= 0 and all(0 <= x < 256 for x in e["bytes"])
        assert len(e["top_logprobs"]) == 2
        assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
        assert abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-5
        if not e["token"].startswith("bytes:"):
            assert bytes(e["bytes"]) == e["token"].encode()
    ev = _sse(d, "/v1/chat/completions", body)
    streamed = sum((c["choices"][0]["logprobs"]["content"] for c in ev
                    if c["choices"] and c["choices"][0]["logprobs"]), [])
    assert [e["token"] for e in streamed] == [e["token"] for e in content]
    # logprobs false (or absent): null
    st, bn, _ = ht.post(d, "/v1/chat/completions", dict(body, logprobs=False, top_logprobs=None))
    assert st == 200 and bn["choices"][0]["logprobs"] is None


# ---- vLLM's runtime adapter endpoints (issue 14: 403 for a tenant that may not manage) ----

def lora_adapter_dir(d, name, seed):
    import gwtest
    return gwtest.adapter(d.cfg["model_dir"], name, seed=seed)


def test_lora_adapter_load_use_unload(d):
    path = lora_adapter_dir(d, "rt1", 11)
    st, body, resp = ht.post(d, "/v1/load_lora_adapter", {"lora_name": "rt1", "lora_path": path})
    assert st == 200, body
    assert body == "Success: LoRA adapter 'rt1' added successfully."
    assert resp.getheader("Content-Type").startswith("text/plain")
    assert "rt1" in [m["id"] for m in ht.get(d, "/v1/models")[1]["data"]]
    chat = {"model": "rt1", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
            "temperature": 0}
    st, b, _ = ht.post(d, "/v1/chat/completions", chat)
    assert st == 200 and b["model"] == "rt1", b
    # loaded already: 409, as gRPC's ALREADY_EXISTS
    r = ht.post(d, "/v1/load_lora_adapter", {"lora_name": "rt1", "lora_path": path})
    e = ht.error_of(r)
    assert r[0] == 409 and e["param"] == "lora_name" and "already loaded" in e["message"]
    st, body, _ = ht.post(d, "/v1/unload_lora_adapter", {"lora_name": "rt1"})
    assert st == 200 and body == "Success: LoRA adapter 'rt1' removed successfully."
    assert "rt1" not in [m["id"] for m in ht.get(d, "/v1/models")[1]["data"]]
    r = ht.post(d, "/v1/chat/completions", chat)
    assert r[0] == 404 and ht.error_of(r)["code"] == "model_not_found"
    # unloaded already: 404, as gRPC's NOT_FOUND
    r = ht.post(d, "/v1/unload_lora_adapter", {"lora_name": "rt1"})
    e = ht.error_of(r)
    assert r[0] == 404 and e["type"] == "not_found_error" and e["param"] == "lora_name"


def test_lora_adapter_403_for_a_tenant_that_may_not_manage(d):
    path = lora_adapter_dir(d, "rt2", 12)
    for route, body in (("/v1/load_lora_adapter", {"lora_name": "rt2", "lora_path": path}),
                        ("/v1/unload_lora_adapter", {"lora_name": "ad1"})):
        r = ht.post(d, route, body, key=BOB)
        e = ht.error_of(r)
        assert r[0] == 403 and e["type"] == "permission_error", r
        assert "bob" in e["message"] and "allowed_adapters" in e["message"], e
        r = ht.post(d, route, body, key=None)
        assert r[0] == 401 and ht.error_of(r)["type"] == "authentication_error"
    # nothing changed: bob's refusal loaded and unloaded nothing
    ids = [m["id"] for m in ht.get(d, "/v1/models")[1]["data"]]
    assert "ad1" in ids and "rt2" not in ids


@pytest.mark.parametrize("route,body,status,param", [
    ("/v1/load_lora_adapter", {}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": 5, "lora_path": "/tmp"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "", "lora_path": "/tmp"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x1"}, 400, "lora_path"),
    ("/v1/load_lora_adapter", {"lora_name": "bad name!", "lora_path": "/tmp"}, 400, "lora_name"),
    ("/v1/load_lora_adapter", {"lora_name": "x1", "lora_path": "relative/dir"}, 400, "lora_path"),
    ("/v1/load_lora_adapter", {"lora_name": "x1", "lora_path": "/no/such/dir"}, 404, "lora_path"),
    ("/v1/load_lora_adapter", {"lora_name": "x1", "lora_path": "/etc/hostname"}, 400,
     "lora_path"),
    ("/v1/unload_lora_adapter", {"lora_name": "never-loaded"}, 404, "lora_name"),
    ("/v1/unload_lora_adapter", {"lora_name": ["ad1"]}, 400, "lora_name"),
])
def test_lora_adapter_errors(d, route, body, status, param):
    r = ht.post(d, route, body)
    e = ht.error_of(r)
    assert r[0] == status and e["param"] == param, r[:2]


def test_lora_adapter_malformed_requests(d):
    for raw in (b"", b"{", b"[1]", b'{"lora_name": "a", "lora_name": "b"}'):
        r = ht.request(d, "POST", "/v1/load_lora_adapter", raw=raw)
        assert r[0] == 400 and "JSON object" in ht.error_of(r)["message"], r[:2]
    r = ht.get(d, "/v1/load_lora_adapter")
    assert r[0] == 405 and ht.error_of(r)


def test_zz_503_while_draining(d):
    s, _ = long_stream(d, ALICE, n=4)
    try:
        d.sigterm()
        seen = []  # the statuses answered meanwhile, for the failure message

        t0 = time.time()

        def draining():
            st = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "x"})[0]
            seen.append((st, round(time.time() - t0, 2)))
            return st == 503

        try:
            ht.wait_for(draining, what="503 while draining")
        except AssertionError as e:
            raise AssertionError("%s; answers seen: %s; the daemon's log ends: %s" % (
                e, seen, d.read_log()[-4000:])) from None
        r = ht.post(d, "/v1/completions", {"model": d.model_name, "prompt": "x"})
        assert "draining" in ht.error_of(r)["message"]
        st, body, _ = ht.get(d, "/healthz", key=None)
        assert st == 503
    finally:
        s.close()
