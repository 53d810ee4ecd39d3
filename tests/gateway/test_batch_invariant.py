"""Batch-invariant requests through clocherd (issue 16, "the same tokens at any batch size"): a
seeded sampled request gives the same tokens alone and beside 9 concurrent others (mixed prompt
lengths, greedy and sampled, some joining while it decodes), with the flag given on the request
(GenerateRequest.batch_invariant) alone and taken from the daemon's `batch_invariant` key under
load. One worker, so every request shares its steps. The demo model (f32 weights: the products
whose rounding depends on the batch on AVX2 and AVX-512). Ids and the float32 log-probability of
each token are compared: the ids of a random-weight model rarely flip, the logprob bits do
(the same test without the flag sees them differ)."""
import concurrent.futures as cf
import random
import time

import gwtest as T

MAX_NEW = 48
SEED = 4242


def sampled(d, md, prompt, **kw):
    """(ids, logprobs) of one seeded sampled Generate with logprobs."""
    req = T.pb.GenerateRequest(max_tokens=MAX_NEW, logprobs=True,
                               sampling=T.pb.SamplingParams(temperature=0.9, top_p=0.95,
                                                            seed=SEED), **kw)
    req.prompt_ids.ids.extend(prompt)
    ids, lps = [], []
    for r in d.stub.Generate(req, metadata=md, timeout=120):
        ids += list(r.token_ids)
        lps += [lp.logprob for lp in r.logprobs]
    return ids, lps


def test_seeded_sampled_alone_equals_under_load():
    model = T.demo_model()
    d = T.Daemon(model, workers=1, extra={"batch_invariant": True})
    try:
        md = T.key("alice-key-0001")
        rnd = random.Random(7)
        prompt = [1] + [rnd.randrange(3, 4000) for _ in range(20)]
        alone, alone_lp = sampled(d, md, prompt, batch_invariant=True)
        assert len(alone) == MAX_NEW and len(alone_lp) == MAX_NEW

        others = [[1] + [rnd.randrange(3, 4000) for _ in range(n)]
                  for n in (2, 90, 7, 150, 33, 64, 1, 120, 12)]

        def other(i):
            if i >= 6:
                time.sleep(0.05 * (i - 5))  # joins while the watched request decodes
            return T.generate(d.stub, md, others[i], max_tokens=MAX_NEW,
                              temperature=0.0 if i % 3 == 0 else 0.8,
                              sampling={"seed": 100 + i})[0]

        with cf.ThreadPoolExecutor(10) as ex:
            futs = [ex.submit(other, i) for i in range(len(others))]
            time.sleep(0.02)
            # the daemon's key makes this one invariant too (the field is left unset)
            loaded, loaded_lp = sampled(d, md, prompt)
            rest = [f.result() for f in futs]
        assert all(len(r) > 0 for r in rest)
        first = next((i for i, (a, b) in enumerate(zip(alone, loaded)) if a != b), None)
        assert loaded == alone, "diverged at token %s" % first
        diff = [i for i, (a, b) in enumerate(zip(alone_lp, loaded_lp)) if a != b]
        assert not diff, "logprobs differ at tokens %s" % diff[:8]
    finally:
        assert d.stop() == 0, d.read_log()
