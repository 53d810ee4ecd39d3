"""Bad requests get the specified status and a message naming what is wrong (issue 5,
acceptance 5), the tenant stream limit, Tokenize/Detokenize round trip, and a daemon whose
memory stays flat over 1000 streams cancelled by their clients."""
import os
import threading
import time

import grpc
import pytest

import gwtest as T

ALICE = T.key("alice-key-0001")
BOB = T.key("bob-key-000002")


@pytest.fixture(scope="module")
def d():
    model = T.demo_model()
    ads = {"a0": T.adapter(model, "a0", seed=3)}
    tenants = [
        {"name": "alice", "api_keys": ["alice-key-0001"], "allowed_adapters": "*"},
        {"name": "bob", "api_keys": ["bob-key-000002"], "allowed_adapters": [],
         "max_concurrent_streams": 2},
    ]
    dm = T.Daemon(model, workers=1, tenants=tenants, adapters=ads,
                  limits={"max_message_bytes": 65536, "max_prompt_tokens": 64,
                          "max_tokens": 1000})
    yield dm
    assert dm.stop() == 0, dm.read_log()


def code_of(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def gen(d, md=ALICE, **kw):
    return lambda: T.generate(d.stub, md, **kw)


@pytest.mark.parametrize("md,kw,code,words", [
    (None, dict(ids=[1, 5]), "UNAUTHENTICATED", "missing API key"),
    ([("authorization", "Bearer nope-nope-nope")], dict(ids=[1, 5]), "UNAUTHENTICATED",
     "unknown API key"),
    ([("authorization", "Basic abc")], dict(ids=[1, 5]), "UNAUTHENTICATED", "missing API key"),
    (BOB, dict(ids=[1, 5], adapter="a0"), "NOT_FOUND", "adapter: a0: not found"),
    (ALICE, dict(ids=[1, 5], adapter="nope"), "NOT_FOUND", "adapter: nope: not found"),
    (ALICE, dict(ids=[1, 5], adapter="../etc"), "INVALID_ARGUMENT", "adapter:"),
    (ALICE, dict(prompt=""), "INVALID_ARGUMENT", "prompt: empty"),
    (ALICE, dict(ids=[]), "INVALID_ARGUMENT", "prompt_ids: empty"),
    (ALICE, dict(ids=[1] * 65), "INVALID_ARGUMENT", "prompt_ids: 65 tokens, the limit is 64"),
    (ALICE, dict(prompt="word " * 200), "INVALID_ARGUMENT", "prompt:"),
    (ALICE, dict(ids=[1, 99999]), "INVALID_ARGUMENT", "prompt: token 1 is 99999"),
    (ALICE, dict(ids=[1, -3]), "INVALID_ARGUMENT", "prompt_ids: token 1 is -3"),
    (ALICE, dict(ids=[1, 5], max_tokens=1001), "INVALID_ARGUMENT",
     "max_tokens: 1001 exceeds the limit 1000"),
    (ALICE, dict(ids=[1, 5], temperature=-0.5), "INVALID_ARGUMENT", "sampling.temperature"),
    (ALICE, dict(ids=[1, 5], sampling={"top_p": 1.5}), "INVALID_ARGUMENT",
     "sampling.top_p: 1.5 is outside (0, 1]"),
    (ALICE, dict(ids=[1, 5], sampling={"top_p": 0.0}), "INVALID_ARGUMENT", "sampling.top_p"),
    (ALICE, dict(ids=[1, 5], sampling={"min_p": 1.0}), "INVALID_ARGUMENT", "sampling.min_p"),
    (ALICE, dict(ids=[1, 5], sampling={"repetition_penalty": 0.0}), "INVALID_ARGUMENT",
     "sampling.repetition_penalty"),
    (ALICE, dict(ids=[1, 5], stop=[""]), "INVALID_ARGUMENT", "stop[0]: empty"),
    (ALICE, dict(ids=[1, 5], model="other"), "NOT_FOUND", "model:"),
])
def test_bad_generate_requests(d, md, kw, code, words):
    c, details = code_of(lambda: T.generate(d.stub, md, **kw))
    assert c == getattr(grpc.StatusCode, code), (c, details)
    assert words in details, details


def test_oversized_message(d):
    c, details = code_of(gen(d, ids=[1] + [5] * 40000))
    assert c == grpc.StatusCode.RESOURCE_EXHAUSTED, (c, details)


def test_not_a_message(d):
    # raw bytes that are no GenerateRequest, sent with a bytes serializer
    call = d.channel.unary_stream("/clocher.v1.Inference/Generate",
                                  request_serializer=lambda b: b,
                                  response_deserializer=lambda b: b)
    c, details = code_of(lambda: list(call(b"\xff\xff\xff\xff", metadata=ALICE, timeout=10)))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "GenerateRequest" in details


def test_unknown_method(d):
    call = d.channel.unary_unary("/clocher.v1.Inference/Nope",
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    c, details = code_of(lambda: call(b"", metadata=ALICE, timeout=10))
    assert c == grpc.StatusCode.UNIMPLEMENTED and "Nope" in details


def test_deadline_exceeded(d):
    c, _ = code_of(lambda: T.generate(d.stub, ALICE, [1, 5], max_tokens=500, timeout=0.05))
    assert c == grpc.StatusCode.DEADLINE_EXCEEDED


def test_tenant_stream_limit(d):
    holds = []
    for _ in range(2):
        it = d.stub.Generate(T.pb.GenerateRequest(prompt_ids=T.pb.TokenIds(ids=[1, 5]),
                                                  max_tokens=500), metadata=BOB, timeout=60)
        next(it)
        holds.append(it)
    c, details = code_of(gen(d, BOB, ids=[1, 5], max_tokens=2))
    assert c == grpc.StatusCode.RESOURCE_EXHAUSTED and "bob" in details, details
    for it in holds:
        it.cancel()
    end = time.time() + 5
    while True:  # the slots come back once the server has seen the cancels
        try:
            T.generate(d.stub, BOB, [1, 5], max_tokens=2)
            break
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.time() < end


def test_tokenize_round_trip(d):
    text = "Once upon a time, a small robot found a red ball."
    ids = d.stub.Tokenize(T.pb.TokenizeRequest(text=text), metadata=ALICE).ids
    assert ids[0] == 1 and len(ids) > 5
    back = d.stub.Detokenize(T.pb.DetokenizeRequest(ids=ids[1:]), metadata=ALICE).text
    assert back.strip() == text
    ids2 = d.stub.Tokenize(T.pb.TokenizeRequest(text=text, add_bos=False), metadata=ALICE).ids
    assert list(ids2) == list(ids[1:])
    # text prompts: the stream's text is the detokenized ids
    out, last = T.generate(d.stub, ALICE, prompt=text, max_tokens=12)
    assert last.usage.prompt_tokens == len(ids)
    c, details = code_of(lambda: d.stub.Detokenize(T.pb.DetokenizeRequest(ids=[1, -2]),
                                                   metadata=ALICE))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "ids: token 1" in details


def test_client_cancel_mid_stream_and_memory_stays_flat(d):
    def cancelled_streams(n):
        cancelled = 0
        for i in range(n):
            it = d.stub.Generate(T.pb.GenerateRequest(prompt_ids=T.pb.TokenIds(ids=[1, 7 + i % 50]),
                                                      max_tokens=1000), metadata=ALICE, timeout=60)
            next(it)
            it.cancel()
            try:
                list(it)  # a stream already complete in the client's buffers ends OK
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.CANCELLED
                cancelled += 1
        assert cancelled >= 0.9 * n, "%d of %d streams were cancelled" % (cancelled, n)
    cancelled_streams(100)  # warm-up: allocator arenas, KV pages, gRPC buffers
    time.sleep(0.5)
    pids = [d.proc.pid] + list(d.worker_pids().values())
    before = [d.rss_kb(p) for p in pids]
    cancelled_streams(1000)
    time.sleep(0.5)
    after = [d.rss_kb(p) for p in pids]
    # TSan's shadow memory and race history grow with the work done: a looser bound there
    limit = 16384 if os.environ.get("TSAN_OPTIONS") else 4096
    if any(a - b >= limit for b, a in zip(before, after)):
        # On a loaded machine more cancelled streams overlap than in the warm-up, touching
        # KV pages and buffers for the first time: a new high-water mark, paid once. A leak
        # grows again over the next 1000; a high-water mark does not.
        before = after
        cancelled_streams(1000)
        time.sleep(0.5)
        after = [d.rss_kb(p) for p in pids]
    for b, a in zip(before, after):
        assert a - b < limit, "RSS grew from %d to %d KiB over 1000 cancelled streams" % (b, a)
    # the worker has nothing left running
    ids, last = T.generate(d.stub, ALICE, [1, 5], max_tokens=3)
    assert len(ids) == 3
