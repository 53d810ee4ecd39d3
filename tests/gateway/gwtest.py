"""gwtest — what the gateway's end-to-end tests share: Python stubs generated from proto/ at
test time (Debian's grpc_tools), IEBIN models made by the build's own `clocher`, reference
outputs from the in-process engine (`inference-engine`), and a real clocherd started on a Unix
socket in a temporary directory (no fixed ports), stopped with SIGTERM.
"""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import grpc

BUILD = os.environ.get("CLOCHER_BUILD_DIR") or sys.exit("CLOCHER_BUILD_DIR is not set")
SOURCE = os.environ.get("CLOCHER_SOURCE_DIR") or sys.exit("CLOCHER_SOURCE_DIR is not set")
FIXTURES = os.environ.get("CLOCHER_FIXTURES") or sys.exit("CLOCHER_FIXTURES is not set")
CLOCHER = os.path.join(BUILD, "client", "clocher")
# Under TSan every program these tests start links gRPC core, which is not instrumented:
# the `clocher` client as much as clocherd (a race inside absl between gRPC's timer threads
# failed test_logprobs' client once). The suppressions go to every child through os.environ.
if "tests/gateway/tsan.supp" not in os.environ.get("TSAN_OPTIONS", ""):
    os.environ["TSAN_OPTIONS"] = ":".join(filter(None, [
        os.environ.get("TSAN_OPTIONS"),
        "suppressions=" + os.path.join(SOURCE, "tests", "gateway", "tsan.supp")]))
CLOCHERD = os.path.join(BUILD, "daemon", "clocherd")
ENGINE = os.path.join(BUILD, "worker", "inference-engine")

_work = tempfile.mkdtemp(prefix="clocher-gw-")
# the models and daemons of one pytest run take up to 0.5 GB: gone when it ends (a CI machine
# runs the suite three times), kept for a look with CLOCHER_KEEP_TMP=1
if not os.environ.get("CLOCHER_KEEP_TMP"):
    atexit.register(shutil.rmtree, _work, ignore_errors=True)


def _stubs():
    from grpc_tools import protoc

    out = os.path.join(_work, "stubs")
    os.makedirs(out, exist_ok=True)
    proto = os.path.join(SOURCE, "proto")
    inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    for args in (["-I" + proto, os.path.join(proto, "clocher/v1/inference.proto")],
                 ["-I" + os.path.join(proto, "grpc/health/v1"),
                  os.path.join(proto, "grpc/health/v1/health.proto")]):
        rc = protoc.main(["protoc", "-I" + inc, "--python_out=" + out, "--grpc_python_out=" + out]
                         + args)
        assert rc == 0, "grpc_tools.protoc failed on %s" % args[-1]
    sys.path.insert(0, out)


_stubs()
from clocher.v1 import inference_pb2 as pb  # noqa: E402
from clocher.v1 import inference_pb2_grpc as pb_grpc  # noqa: E402
import health_pb2  # noqa: E402
import health_pb2_grpc  # noqa: E402

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, "%s failed (%d): %s" % (" ".join(cmd), p.returncode, p.stderr)
    return p.stdout


def stories_model():
    """stories260K as an f32 IEBIN model (no tokenizer: prompts are token ids)."""
    out = os.path.join(_work, "stories")
    if not os.path.exists(os.path.join(out, "model.ie.json")):
        run(CLOCHER, "convert", os.path.join(FIXTURES, "stories260K", "stories260K.bin"), out)
    return out


def demo_model():
    """The synthesized demo Llama (random weights, a real SentencePiece tokenizer, 1024 ctx):
    slower per token than stories260K, so streams last long enough to be interrupted."""
    hf, out = os.path.join(_work, "demo-hf"), os.path.join(_work, "demo")
    if not os.path.exists(os.path.join(out, "model.ie.json")):
        run(CLOCHER, "synth", "--preset", "demo", "--seed", "1", hf)
        run(CLOCHER, "convert", hf, out)
    return out


def adapter(model, name, seed, rank=8, targets="q,v"):
    out = os.path.join(_work, "adapter-%s-%s" % (os.path.basename(model), name))
    if not os.path.exists(os.path.join(out, "adapter_config.json")):
        run(CLOCHER, "synth-adapter", model, out, "--rank", str(rank), "--seed", str(seed),
            "--targets", targets, "--strength", "0.5")
    return out


def reference(model, ids, max_new, adapter_dir=None, adapter_name="a", extra=()):
    """Greedy tokens of the in-process serving engine for the same request."""
    cmd = [ENGINE, "--model-dir", model, "--prompt-ids", ",".join(map(str, ids)), "--greedy",
           "--max-new", str(max_new), "--print-ids", "--quiet", "--threads", "1",
           "--concurrency", "1"] + list(extra)
    if adapter_dir:
        cmd += ["--adapter", "%s=%s" % (adapter_name, adapter_dir)]
    out = run(*cmd)
    return json.loads(out.strip().splitlines()[-1])["generated_ids"][0]


def free_port():
    """A TCP port free right now on loopback (the metrics endpoint's config wants one)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def key(k):
    return [("authorization", "Bearer " + k)]


class Daemon:
    """A clocherd on a Unix socket; `cfg` is merged over a small default configuration."""

    def __init__(self, model, workers=2, tenants=None, adapters=None, limits=None, extra=None,
                 sock=None):
        self.dir = tempfile.mkdtemp(prefix="d-", dir=_work)
        self.sock = sock or os.path.join(self.dir, "gw.sock")
        self.cfg_path = os.path.join(self.dir, "clocherd.json")
        self.log_path = os.path.join(self.dir, "clocherd.log")
        self.cfg = {
            "listen": {"tcp": None, "unix": self.sock},
            "metrics": {"listen": None},
            "model_dir": model,
            "workers": workers,
            "threads_per_worker": 1,
            "kv_budget_mb": 64,
            # the daemon's default KV cache is bf16; these tests compare token ids with
            # inference-engine's references, computed with an f32 cache
            "kv_dtype": "f32",
            "drain_timeout_s": 20,
            "limits": dict({"max_message_bytes": 1 << 20, "max_prompt_tokens": 256,
                            "max_tokens": 1024, "max_streams_per_connection": 256,
                            "max_queue": 256}, **(limits or {})),
            "supervisor": {"respawn_initial_ms": 100, "ready_timeout_s": 120,
                           "heartbeat_timeout_s": 60, "stop_grace_s": 10},
            "tenants": tenants if tenants is not None else [
                {"name": "alice", "api_keys": ["alice-key-0001"], "allowed_adapters": "*",
                 "max_concurrent_streams": 200}],
            "adapters": adapters or {},
        }
        self.cfg.update(extra or {})
        self.write_config()
        self.log = open(self.log_path, "w")
        env = dict(os.environ)
        # under ASan, freed memory waits in a quarantine: RSS checks would measure that
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"),
                                                     "quarantine_size_mb=0",
                                                     "thread_local_quarantine_size_kb=0"]))
        # under TSan: gRPC core is not instrumented, what happens inside it is not ours
        env["TSAN_OPTIONS"] = ":".join(filter(None, [
            env.get("TSAN_OPTIONS"),
            "suppressions=" + os.path.join(SOURCE, "tests", "gateway", "tsan.supp"),
            "report_signal_unsafe=0"]))
        self.proc = subprocess.Popen([CLOCHERD, "--config", self.cfg_path], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env)
        self.channel = grpc.insecure_channel("unix:" + self.sock)
        self.stub = pb_grpc.InferenceStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)
        self.wait_serving()

    def write_config(self):
        with open(self.cfg_path + ".tmp", "w") as f:
            json.dump(self.cfg, f)
        os.replace(self.cfg_path + ".tmp", self.cfg_path)

    def status(self):
        try:
            return self.health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
        except grpc.RpcError:
            return None

    def wait_serving(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            assert self.proc.poll() is None, "clocherd exited (%s): %s" % (
                self.proc.returncode, self.read_log())
            if self.status() == SERVING:
                return
            time.sleep(0.1)
        raise AssertionError("clocherd not SERVING after %d s: %s" % (timeout, self.read_log()))

    def read_log(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def worker_pids(self):
        """{slot: pid} of the current workers, from the supervisor's log lines."""
        import re
        pids = {}
        for m in re.finditer(r"worker (\d+) \(pid (\d+), generation (\d+)\): ready",
                             self.read_log()):
            pids[int(m.group(1))] = int(m.group(2))
        return pids

    def ready_workers(self, timeout=60):
        """{slot: pid} once every configured worker is ready: clocherd says SERVING as soon as
        the first one is, and on a loaded machine the others may take seconds more."""
        end = time.time() + timeout
        while len(self.worker_pids()) < self.cfg["workers"] and time.time() < end:
            time.sleep(0.05)
        return self.worker_pids()

    def rss_kb(self, pid=None):
        with open("/proc/%d/status" % (pid or self.proc.pid)) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def sigterm(self):
        self.terminated = True
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout=60):
        if self.proc.poll() is None and not getattr(self, "terminated", False):
            self.sigterm()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.channel.close()
        self.log.close()
        if rc != 0:
            sys.stderr.write("clocherd exited with %s; its log:\n%s\n" % (rc, self.read_log()))
        return rc


def generate(stub, md, ids=None, prompt=None, max_tokens=16, adapter="", temperature=0.0,
             timeout=60, **kw):
    """(token ids, final message) of one Generate call; raises grpc.RpcError."""
    req = pb.GenerateRequest(max_tokens=max_tokens, adapter=adapter,
                             sampling=pb.SamplingParams(temperature=temperature,
                                                        **kw.pop("sampling", {})), **kw)
    if prompt is not None:
        req.prompt = prompt
    else:
        req.prompt_ids.ids.extend(ids)
    out, last = [], None
    for r in stub.Generate(req, metadata=md, timeout=timeout):
        out += list(r.token_ids)
        last = r
    return out, last
