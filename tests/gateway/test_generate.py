"""Generation through clocherd end to end (issue 5, acceptance 1, 2 and 6): concurrent streams
over several LoRA adapters equal the in-process engine's output, BatchGenerate with mixed
tenants and adapters, Tokenize/Detokenize, ListModels/ListAdapters, health, and the metrics
text agreeing with the calls made."""
import concurrent.futures as cf
import json
import subprocess
import signal
import time
import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

import gwtest as T

PROMPTS = [[1, 403, 407], [1, 290, 345, 311], [1, 17, 88], [1, 500]]
MAX_NEW = 24


@pytest.fixture(scope="module")
def env():
    model = T.stories_model()
    ads = {"a%d" % i: T.adapter(model, "a%d" % i, seed=10 + i) for i in range(4)}
    refs = {}
    for p in range(len(PROMPTS)):
        for name in [None] + sorted(ads):
            refs[(p, name)] = T.reference(model, PROMPTS[p], MAX_NEW, ads.get(name), name or "a")
    # the adapters do change the output (else the equality below would prove little)
    assert any(refs[(0, a)] != refs[(0, None)] for a in ads)
    tenants = [
        {"name": "alice", "api_keys": ["alice-key-0001"], "allowed_adapters": "*",
         "max_concurrent_streams": 100},
        {"name": "bob", "api_keys": ["bob-key-000002"], "allowed_adapters": ["a0", "a1"]},
    ]
    d = T.Daemon(model, workers=2, tenants=tenants, adapters=ads,
                 extra={"metrics": {"listen": "127.0.0.1:%d" % T.free_port()}})
    yield d, ads, refs
    assert d.stop() == 0, d.read_log()


def test_32_streams_over_4_adapters_equal_the_engine(env):
    d, ads, refs = env
    names = [None] + sorted(ads)
    jobs = [(i % len(PROMPTS), names[i % len(names)]) for i in range(32)]

    def one(job):
        p, name = job
        ids, last = T.generate(d.stub, T.key("alice-key-0001"), PROMPTS[p], max_tokens=MAX_NEW,
                               adapter=name or "")
        return ids, last

    with cf.ThreadPoolExecutor(32) as ex:
        results = list(ex.map(one, jobs))
    for (p, name), (ids, last) in zip(jobs, results):
        assert ids == refs[(p, name)], "prompt %d adapter %s" % (p, name)
        assert last.HasField("finish_reason")
        assert last.usage.prompt_tokens == len(PROMPTS[p])
        assert last.usage.completion_tokens == len(ids)
        assert last.timings.e2e_ms > 0


def test_lora_weights_bf16_reaches_the_workers(env):
    # "lora_weights": "bf16" in the config: the worker packs adapters in bf16 (docs/LORA.md),
    # and a stream equals the in-process engine's with --lora-weights bf16
    _, ads, _ = env
    model = T.stories_model()
    want = T.reference(model, PROMPTS[0], MAX_NEW, ads["a0"], "a0",
                       extra=["--lora-weights", "bf16"])
    d = T.Daemon(model, workers=1, adapters={"a0": ads["a0"]}, extra={"lora_weights": "bf16"})
    try:
        ids, _ = T.generate(d.stub, T.key("alice-key-0001"), PROMPTS[0], max_tokens=MAX_NEW,
                            adapter="a0")
        assert ids == want
        assert "bf16 weights" in d.read_log(), d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


def test_batch_generate_mixed_tenants_and_adapters(env):
    d, ads, refs = env
    reqs = [T.pb.GenerateRequest(prompt_ids=T.pb.TokenIds(ids=PROMPTS[i % 4]), adapter=a,
                                 max_tokens=MAX_NEW, sampling=T.pb.SamplingParams(temperature=0))
            for i, a in enumerate(["", "a0", "a1", "a2", "a3", ""])]
    for k, allowed in (("alice-key-0001", {"", "a0", "a1", "a2", "a3"}),
                       ("bob-key-000002", {"", "a0", "a1"})):
        got, errors = {}, {}
        for r in d.stub.BatchGenerate(T.pb.BatchGenerateRequest(requests=reqs),
                                      metadata=T.key(k), timeout=60):
            if r.HasField("error_code"):
                errors[r.index] = (r.error_code, r.error_message)
            got.setdefault(r.index, []).extend(r.response.token_ids)
        for i, q in enumerate(reqs):
            if q.adapter in allowed:
                assert i not in errors, errors
                assert got[i] == refs[(i % 4, q.adapter or None)]
            else:
                assert errors[i][0] == grpc.StatusCode.NOT_FOUND.value[0]
                assert "adapter: %s: not found" % q.adapter in errors[i][1]


def test_models_adapters_health(env):
    d, ads, _ = env
    m = d.stub.ListModels(T.pb.ListModelsRequest(), metadata=T.key("bob-key-000002")).models
    assert len(m) == 1 and m[0].name == "stories260K" and m[0].vocab_size == 512
    a = d.stub.ListAdapters(T.pb.ListAdaptersRequest(), metadata=T.key("bob-key-000002"))
    assert sorted(x.name for x in a.adapters) == ["a0", "a1"]  # only what bob may use
    assert all(x.rank == 8 and set(x.target_modules) == {"q_proj", "v_proj"} for x in a.adapters)
    a = d.stub.ListAdapters(T.pb.ListAdaptersRequest(), metadata=T.key("alice-key-0001"))
    assert sorted(x.name for x in a.adapters) == sorted(ads)
    assert d.status() == T.SERVING
    with pytest.raises(grpc.RpcError) as e:
        d.health.Check(T.health_pb2.HealthCheckRequest(service="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    # Watch answers at once with the current status
    w = d.health.Watch(T.health_pb2.HealthCheckRequest(), timeout=5)
    assert next(w).status == T.SERVING
    w.cancel()


def test_load_and_unload_adapter_at_run_time(env):
    d, ads, refs = env
    md = T.key("alice-key-0001")
    r = d.stub.LoadAdapter(T.pb.LoadAdapterRequest(name="late", path=ads["a2"]), metadata=md)
    assert r.adapter.name == "late" and r.adapter.rank == 8
    ids, _ = T.generate(d.stub, md, PROMPTS[0], max_tokens=MAX_NEW, adapter="late")
    assert ids == refs[(0, "a2")]
    with pytest.raises(grpc.RpcError) as e:
        d.stub.LoadAdapter(T.pb.LoadAdapterRequest(name="late", path=ads["a2"]), metadata=md)
    assert e.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as e:  # bob may not manage adapters
        d.stub.UnloadAdapter(T.pb.UnloadAdapterRequest(name="late"),
                             metadata=T.key("bob-key-000002"))
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
    d.stub.UnloadAdapter(T.pb.UnloadAdapterRequest(name="late"), metadata=md)
    with pytest.raises(grpc.RpcError) as e:
        T.generate(d.stub, md, PROMPTS[0], adapter="late")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as e:
        d.stub.LoadAdapter(T.pb.LoadAdapterRequest(name="bad", path="/nonexistent/dir"),
                           metadata=md)
    assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT,
                              grpc.StatusCode.FAILED_PRECONDITION), e.value.details()
    assert "bad" in e.value.details()


def metrics(d, md, http=False):
    """The metrics, from GetMetrics or from the HTTP endpoint, parsed as Prometheus text."""
    if http:
        url = "http://%s/metrics" % d.cfg["metrics"]["listen"]
        with urllib.request.urlopen(url, timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    else:
        text = d.stub.GetMetrics(T.pb.GetMetricsRequest(), metadata=md).prometheus_text
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(fams, family, name, **labels):
    for s in fams[family].samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


@pytest.mark.parametrize("http", [False, True], ids=["GetMetrics", "http"])
def test_metrics_agree_with_the_calls(env, http):
    d, _, _ = env
    md = T.key("bob-key-000002")
    before = metrics(d, md, http)
    ok0 = sample(before, "clocher_requests", "clocher_requests_total", method="Generate",
                 status="OK", tenant="bob")
    nf0 = sample(before, "clocher_requests", "clocher_requests_total", method="Generate",
                 status="NOT_FOUND", tenant="bob")
    tok0 = sample(before, "clocher_completion_tokens", "clocher_completion_tokens_total",
                  tenant="bob")
    n_tok = 0
    for i in range(3):
        ids, _ = T.generate(d.stub, md, PROMPTS[i], max_tokens=5 + i)
        n_tok += len(ids)
    for _ in range(2):
        with pytest.raises(grpc.RpcError):
            T.generate(d.stub, md, PROMPTS[0], adapter="a3")
    after = metrics(d, md, http)
    assert sample(after, "clocher_requests", "clocher_requests_total", method="Generate",
                  status="OK", tenant="bob") == ok0 + 3
    assert sample(after, "clocher_requests", "clocher_requests_total", method="Generate",
                  status="NOT_FOUND", tenant="bob") == nf0 + 2
    assert sample(after, "clocher_completion_tokens", "clocher_completion_tokens_total",
                  tenant="bob") == tok0 + n_tok
    assert sample(after, "clocher_workers_ready", "clocher_workers_ready") == 2
    assert sample(after, "clocher_e2e_seconds", "clocher_e2e_seconds_count", tenant="bob") >= 3
    # the workers' own figures arrive with their STATS records (about once a second)
    assert "clocher_kv_blocks" in after and "clocher_worker_rss_bytes" in after


def _wait_for(pred, what, timeout=15):
    end = time.time() + timeout
    while not pred():
        assert time.time() < end, what
        time.sleep(0.05)


def _outputs(d, md, adapter, n=8):
    """n concurrent greedy streams of PROMPTS[0] with the adapter (both workers get some)."""
    with cf.ThreadPoolExecutor(n) as ex:
        futs = [ex.submit(T.generate, d.stub, md, PROMPTS[0], max_tokens=MAX_NEW,
                          adapter=adapter) for _ in range(n)]
        return [f.result()[0] for f in futs]


def test_sighup_loads_changes_and_drops_adapters(env):
    # issue 5: "SIGHUP: reload the config (tenants, adapters, limits) without dropping streams"
    # — an adapter added to the file is served by the running workers, one whose directory
    # changed serves the new weights, one dropped from the file is refused
    d, ads, refs = env
    md = T.key("alice-key-0001")

    def answer(adapter):
        try:
            return T.generate(d.stub, md, PROMPTS[0], max_tokens=MAX_NEW, adapter=adapter)[0]
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND, e.details()
            return None

    with pytest.raises(grpc.RpcError) as e:
        T.generate(d.stub, md, PROMPTS[0], adapter="hup")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    d.cfg["adapters"] = dict(ads, hup=ads["a3"])
    d.write_config()
    d.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: answer("hup") is not None, "the reload did not add adapter hup")
    assert _outputs(d, md, "hup") == [refs[(0, "a3")]] * 8
    names = [a.name for a in d.stub.ListAdapters(T.pb.ListAdaptersRequest(), metadata=md).adapters]
    assert "hup" in names

    d.cfg["adapters"] = dict(ads, hup=ads["a1"])
    d.write_config()
    d.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: answer("hup") == refs[(0, "a1")], "the reload did not change hup's weights")
    assert _outputs(d, md, "hup") == [refs[(0, "a1")]] * 8

    d.cfg["adapters"] = dict(ads)
    d.write_config()
    d.proc.send_signal(signal.SIGHUP)
    _wait_for(lambda: answer("hup") is None, "the reload did not drop adapter hup")
    names = [a.name for a in d.stub.ListAdapters(T.pb.ListAdaptersRequest(), metadata=md).adapters]
    assert "hup" not in names
    # the configured adapters are untouched by all this
    assert _outputs(d, md, "a2", n=4) == [refs[(0, "a2")]] * 4


def test_logprobs(env):
    """Issue 14: GenerateRequest.logprobs/top_logprobs come back as one TokenLogprob per id,
    each with its alternatives, most likely first; greedy draws the most likely token, so its
    own logprob is the first alternative's; bad counts are INVALID_ARGUMENT naming the field."""
    d, _, refs = env
    md = T.key("alice-key-0001")
    req = T.pb.GenerateRequest(max_tokens=MAX_NEW, logprobs=True, top_logprobs=3,
                               sampling=T.pb.SamplingParams(temperature=0.0))
    req.prompt_ids.ids.extend(PROMPTS[0])
    ids, lps = [], []
    for r in d.stub.Generate(req, metadata=md, timeout=60):
        assert len(r.logprobs) == len(r.token_ids)
        ids += list(r.token_ids)
        lps += list(r.logprobs)
    assert ids == refs[(0, None)]  # asking for logprobs changes nothing drawn
    for tid, lp in zip(ids, lps):
        assert lp.id == tid and -9999 <= lp.logprob <= 0
        assert len(lp.top) == 3
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
        assert lp.top[0].id == tid and abs(lp.top[0].logprob - lp.logprob) < 1e-6
    # `clocher generate --logprobs N` shows them (--json: one entry per token)
    p = subprocess.run([T.CLOCHER, "generate", "--addr", "unix:" + d.sock, "--api-key",
                        "alice-key-0001", "--prompt-ids", " ".join(map(str, PROMPTS[0])),
                        "--max-tokens", "4", "--temperature", "0", "--logprobs", "2", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [e["id"] for e in out["logprobs"]] == out["token_ids"] == ids[:4]
    assert all(len(e["top"]) == 2 and e["top"][0][0] == e["id"] for e in out["logprobs"])
    p = subprocess.run([T.CLOCHER, "generate", "--addr", "unix:" + d.sock, "--api-key",
                        "alice-key-0001", "--prompt-ids", "1 2", "--max-tokens", "2",
                        "--logprobs", "21"], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "top_logprobs: 21 exceeds 20" in p.stderr, p.stderr
    # without logprobs: none
    _, last = T.generate(d.stub, md, PROMPTS[0], max_tokens=2)
    assert len(last.logprobs) == 0
    for kw, needle in [(dict(logprobs=True, top_logprobs=21), "top_logprobs: 21 exceeds 20"),
                       (dict(top_logprobs=2), "top_logprobs: 2 needs logprobs")]:
        with pytest.raises(grpc.RpcError) as e:
            T.generate(d.stub, md, PROMPTS[0], max_tokens=2, **kw)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert needle in e.value.details(), e.value.details()
