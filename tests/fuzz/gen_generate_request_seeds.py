"""Writes the seed corpus of fuzz_generate_request (clocher.v1.GenerateRequest messages) into
tests/fuzz/corpus/generate_request. Run with Debian's /usr/bin/python3 (python3-grpc-tools):
    /usr/bin/python3 tests/fuzz/gen_generate_request_seeds.py
"""
import os
import sys
import tempfile

from grpc_tools import protoc

here = os.path.dirname(os.path.abspath(__file__))
src = os.path.join(here, "..", "..", "proto")
out = tempfile.mkdtemp()
inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
assert protoc.main(["protoc", "-I" + inc, "-I" + src, "--python_out=" + out,
                    os.path.join(src, "clocher/v1/inference.proto")]) == 0
sys.path.insert(0, out)
from clocher.v1 import inference_pb2 as pb  # noqa: E402

S = pb.SamplingParams
seeds = {
    "text": pb.GenerateRequest(prompt="Once upon a time"),
    "ids": pb.GenerateRequest(prompt_ids=pb.TokenIds(ids=[1, 403, 407]), max_tokens=20),
    "greedy_adapter": pb.GenerateRequest(prompt="hi", adapter="a0", adapter_scale=0.5,
                                         sampling=S(temperature=0, seed=7)),
    "all_sampling": pb.GenerateRequest(prompt="x", sampling=S(temperature=1.2, top_k=40,
                                       top_p=0.9, min_p=0.05, repetition_penalty=1.1, seed=3)),
    "stops": pb.GenerateRequest(prompt="a", stop=["\n", "The end"], priority=pb.PRIORITY_HIGH,
                                request_id="req-1", model="m", add_bos=False),
    "bad_top_p": pb.GenerateRequest(prompt="a", sampling=S(top_p=1.5)),
    "forbidden": pb.GenerateRequest(prompt="a", adapter="a1"),
    "too_long": pb.GenerateRequest(prompt_ids=pb.TokenIds(ids=list(range(70)))),
    "max_tokens": pb.GenerateRequest(prompt="a", max_tokens=301),
    "empty": pb.GenerateRequest(),
}
d = os.path.join(here, "corpus", "generate_request")
os.makedirs(d, exist_ok=True)
for name, m in seeds.items():
    with open(os.path.join(d, name + ".bin"), "wb") as f:
        f.write(m.SerializeToString())
print("%d seeds in %s" % (len(seeds), d))
