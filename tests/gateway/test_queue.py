"""Queueing through a real clocherd (issue 16 "Also found"): limits.max_queue bounds the
requests waiting beyond those a worker runs, not all it holds; FINISH's queue_ms measures the
wait a request had before its first step, consistently with its ttft_ms.
"""
import threading
import time

import grpc
import pytest

import gwtest as T

MD = T.key("alice-key-0001")


@pytest.fixture(scope="module")
def stories():
    return T.stories_model()


class Call(threading.Thread):
    """One Generate read to its end: tokens, status, the last message (usage, timings)."""

    def __init__(self, stub, ids, max_tokens, go=None):
        super().__init__(daemon=True)
        self.stub, self.ids, self.max_tokens, self.go = stub, ids, max_tokens, go
        self.tokens, self.code, self.details, self.last = [], None, "", None

    def run(self):
        if self.go:
            self.go.wait()
        try:
            self.tokens, self.last = T.generate(self.stub, MD, ids=self.ids,
                                                max_tokens=self.max_tokens, timeout=120)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as e:
            self.code, self.details = e.code(), e.details()


def burst(d, n, max_tokens):
    go = threading.Event()
    cs = [Call(d.stub, [1, 100 + i, 200 + i], max_tokens, go) for i in range(n)]
    for c in cs:
        c.start()
    time.sleep(0.2)  # every thread waits on the event: they send together
    go.set()
    for c in cs:
        c.join(180)
    return cs


@pytest.mark.parametrize("n", [5, 12])
def test_burst_under_max_queue_plus_running_is_served(stories, n):
    # the case: a burst of 5 with max_queue 4 at one worker that runs up to 64 had
    # one refused; every request of a burst that fits the free running slots runs
    d = T.Daemon(stories, workers=1, limits={"max_queue": 4})
    try:
        for _ in range(3):
            cs = burst(d, n, 24)
            bad = [(c.code, c.details) for c in cs if c.code != grpc.StatusCode.OK]
            assert not bad, bad
            assert all(len(c.tokens) == 24 for c in cs)
    finally:
        assert d.stop() == 0, d.read_log()


def timings(c):
    t = c.last.timings
    assert t.HasField("queue_ms") and t.HasField("ttft_ms") and t.HasField("e2e_ms")
    return t.queue_ms, t.ttft_ms, t.e2e_ms


def test_queue_ms_measures_the_wait_behind_a_long_prefill():
    # one worker, one thread, the demo model (slow enough per token): 1000-token prompts
    # prefill as several long steps; a short request sent while they run waits for
    # the step under way (its record is read inside the step and held to its end)
    model = T.demo_model()
    d = T.Daemon(model, workers=1, limits={"max_prompt_tokens": 1024})
    try:
        # two long prompts (no shared prefix): several prefill steps, whatever the machine
        longs = [Call(d.stub, [1] + [100 + (i * (k + 3)) % 500 for i in range(999)], 2)
                 for k in range(2)]
        for a in longs:
            a.start()
        time.sleep(0.1)
        b = Call(d.stub, [1, 300, 301], 4)
        t0 = time.time()
        b.start()
        for c in longs + [b]:
            c.join(180)
        waited_ms = (time.time() - t0) * 1000
        assert all(c.code == grpc.StatusCode.OK for c in longs + [b]), [
            c.details for c in longs + [b]]
        for c in longs + [b]:
            q, ttft, e2e = timings(c)
            assert 0 <= q <= ttft <= e2e, (q, ttft, e2e)
        qb, ttftb, e2eb = timings(b)
        # alone, a 3-token prompt waits well under a millisecond; behind a prefill step it
        # waits for that step's end (once admitted, it shares the next steps with the long
        # prompt's chunks: that part of its ttft is not queueing); never more than the
        # client saw
        assert qb > 1.0, (qb, ttftb, e2eb, d.read_log())
        assert e2eb <= waited_ms + 50, (e2eb, waited_ms)
        # a request alone: a wait near zero, still within its ttft
        c = Call(d.stub, [1, 300, 302], 4)
        c.run()
        q, ttft, e2e = timings(c)
        assert 0 < q <= ttft <= e2e and q < qb, (q, ttft, qb)
    finally:
        assert d.stop() == 0, d.read_log()
