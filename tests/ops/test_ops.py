"""ops_e2e — operability against a real clocherd (issue 14) and the models users bring
(issue 17): gRPC server reflection, JSON logs, health --json, --version, and refusals of a
Hugging Face folder, a GGUF file and a missing model that name `clocher convert`.

Reflection is called the way grpcurl calls it: the raw bidirectional method, requests built
from grpc/reflection/v1/reflection.proto (stubs generated here), answers parsed with
descriptor_pb2 into a descriptor pool, from which a method is then called by name only.
"""
import json
import os
import re
import stat
import subprocess
import sys

import grpc
import pytest

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "gateway"))
import gwtest as T  # noqa: E402

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402


def _reflection_stubs():
    from grpc_tools import protoc
    out = os.path.join(T._work, "refl-stubs")
    os.makedirs(out, exist_ok=True)
    proto = os.path.join(T.SOURCE, "proto")
    inc = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    # a top-level module: "grpc.reflection..." would be looked for inside grpcio's package
    d = os.path.join(proto, "grpc", "reflection", "v1")
    rc = protoc.main(["protoc", "-I" + inc, "-I" + d, "--python_out=" + out,
                      os.path.join(d, "reflection.proto")])
    assert rc == 0
    sys.path.insert(0, out)


_reflection_stubs()
import reflection_pb2 as R  # noqa: E402

V1 = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
V1ALPHA = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
SERVICES = {"clocher.v1.Inference", "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}


@pytest.fixture(scope="module")
def d():
    dm = T.Daemon(T.stories_model(), workers=1)
    yield dm
    assert dm.stop() == 0


def reflect(d, *reqs, path=V1):
    """The answers to reqs, sent on one stream (in order, one answer each)."""
    call = d.channel.stream_stream(path, request_serializer=None, response_deserializer=None)
    out = list(call(iter([r.SerializeToString() for r in reqs]), timeout=30))
    assert len(out) == len(reqs)
    return [R.ServerReflectionResponse.FromString(b) for b in out]


def files(resp):
    assert resp.WhichOneof("message_response") == "file_descriptor_response", resp
    return [descriptor_pb2.FileDescriptorProto.FromString(b)
            for b in resp.file_descriptor_response.file_descriptor_proto]


@pytest.mark.parametrize("path", [V1, V1ALPHA])
def test_reflection_lists_services_and_serves_files(d, path):
    ls, by_sym, by_name, msg = reflect(
        d, R.ServerReflectionRequest(host="h", list_services="*"),
        R.ServerReflectionRequest(file_containing_symbol="clocher.v1.Inference"),
        R.ServerReflectionRequest(file_by_filename="grpc/health/v1/health.proto"),
        R.ServerReflectionRequest(file_containing_symbol="clocher.v1.GenerateRequest"),
        path=path)
    assert ls.valid_host == "h" and ls.original_request.list_services == "*"
    assert {s.name for s in ls.list_services_response.service} == SERVICES
    fs = files(by_sym)
    assert fs[0].name == "clocher/v1/inference.proto" and fs[0].package == "clocher.v1"
    svc = {s.name: s for s in fs[0].service}["Inference"]
    assert {"Generate", "BatchGenerate", "Tokenize", "ListModels"} <= {m.name for m in svc.method}
    assert [f.name for f in files(by_name)] == ["grpc/health/v1/health.proto"]
    assert files(msg)[0].name == "clocher/v1/inference.proto"


def test_reflection_symbols_of_every_kind(d):
    syms = ["clocher.v1.Inference.Generate", "grpc.health.v1.HealthCheckResponse.ServingStatus",
            "grpc.health.v1.HealthCheckResponse.SERVING", "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
            "grpc.reflection.v1.ServerReflectionRequest"]
    for sym, resp in zip(syms, reflect(d, *[R.ServerReflectionRequest(file_containing_symbol=s)
                                            for s in syms])):
        assert files(resp), sym


def test_reflection_not_found_answers_in_the_stream(d):
    reqs = [R.ServerReflectionRequest(file_containing_symbol="clocher.v1.Nope"),
            R.ServerReflectionRequest(file_by_filename="nope.proto"),
            R.ServerReflectionRequest(file_containing_extension=R.ExtensionRequest(
                containing_type="clocher.v1.GenerateRequest", extension_number=100)),
            R.ServerReflectionRequest(all_extension_numbers_of_type="clocher.v1.GenerateRequest"),
            R.ServerReflectionRequest(list_services="")]
    out = reflect(d, *reqs)
    for resp, want in zip(out[:4], ["clocher.v1.Nope", "nope.proto", "extension", "GenerateRequest"]):
        assert resp.WhichOneof("message_response") == "error_response"
        assert resp.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
        assert want in resp.error_response.error_message
    assert len(out[4].list_services_response.service) == len(SERVICES)  # the stream lives on


def test_reflection_refuses_bytes_that_are_not_a_request(d):
    call = d.channel.stream_stream(V1, request_serializer=None, response_deserializer=None)
    for bad in (b"\xff\xff\xff", R.ServerReflectionRequest(host="only").SerializeToString()):
        with pytest.raises(grpc.RpcError) as e:
            list(call(iter([bad]), timeout=30))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert "ServerReflectionRequest" in e.value.details()


def test_reflection_is_enough_to_call_the_api(d):
    """What grpcurl does: descriptors from reflection only, then a call by method name."""
    (resp,) = reflect(d, R.ServerReflectionRequest(file_containing_symbol="clocher.v1.Inference"))
    pool = descriptor_pool.DescriptorPool()
    for fd in reversed(files(resp)):
        pool.Add(fd)
    m = pool.FindMethodByName("clocher.v1.Inference.ListModels")
    factory = message_factory.MessageFactory(pool)  # protobuf 3.21 (Debian 12)
    req_cls = factory.GetPrototype(m.input_type)
    resp_cls = factory.GetPrototype(m.output_type)
    call = d.channel.unary_unary("/clocher.v1.Inference/ListModels",
                                 request_serializer=req_cls.SerializeToString,
                                 response_deserializer=resp_cls.FromString)
    out = call(req_cls(), metadata=T.key("alice-key-0001"), timeout=30)
    assert len(out.models) == 1, out


def test_reflection_survives_a_client_that_goes_away(d):
    call = d.channel.stream_stream(V1, request_serializer=None, response_deserializer=None)
    it = call(iter([R.ServerReflectionRequest(list_services="").SerializeToString()] * 3))
    next(it)
    it.cancel()
    assert d.status() == T.SERVING
    assert len(reflect(d, R.ServerReflectionRequest(list_services=""))) == 1


def test_health_json(d):
    p = subprocess.run([T.CLOCHER, "health", "--json", "--addr", "unix:" + d.sock],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == {"service": "", "status": "SERVING"}
    p = subprocess.run([T.CLOCHER, "health", "--json", "--addr", "unix:" + d.sock,
                        "--service", "no.such.Service"], capture_output=True, text=True,
                       timeout=60)
    j = json.loads(p.stdout)
    assert p.returncode == 6 and j["status"] == "ERROR" and j["code_name"] == "NOT_FOUND", j
    p = subprocess.run([T.CLOCHER, "health", "--json", "--addr", "unix:" + d.sock + ".none",
                        "--connect-timeout", "1"], capture_output=True, text=True, timeout=60)
    j = json.loads(p.stdout)
    assert p.returncode == 5 and j["status"] == "UNREACHABLE" and d.sock in j["error"], j
    assert p.stderr == ""


@pytest.mark.parametrize("prog", [T.CLOCHER, T.CLOCHERD, T.ENGINE])
def test_version(prog):
    p = subprocess.run([prog, "--version"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert re.fullmatch(r"(clocher|clocherd|inference-engine) \d+\.\d+\.\d+( \(git \S+\))?\n",
                        p.stdout), p.stdout


def test_log_format_json_reaches_the_workers():
    """clocherd --log-format json: every line of clocherd and of its workers is one JSON
    object with ts, level, prog, pid and msg."""
    wrapper = os.path.join(T._work, "clocherd-json")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec "%s" --log-format json "$@"\n' % T.CLOCHERD)
    os.chmod(wrapper, stat.S_IRWXU)
    real, T.CLOCHERD = T.CLOCHERD, wrapper
    try:
        dm = T.Daemon(T.stories_model(), workers=1)
    finally:
        T.CLOCHERD = real
    assert dm.stop() == 0
    lines = [ln for ln in dm.read_log().splitlines() if ln.strip()]
    progs = set()
    for ln in lines:
        if ln.startswith("==") or ln.startswith("Direct leak"):  # a sanitizer's own report
            continue
        j = json.loads(ln)
        assert {"ts", "level", "prog", "pid", "msg"} <= j.keys(), ln
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", j["ts"]), ln
        progs.add(j["prog"])
    assert "clocherd" in progs and any(p.startswith("clocher-worker") for p in progs), progs
    assert any("ready" in json.loads(ln)["msg"] for ln in lines if ln.startswith("{"))


def test_log_format_json_under_the_journal_is_prefixed_json():
    """Under systemd ($JOURNAL_STREAM): "<priority>{...}", the object undecorated."""
    env = dict(os.environ, JOURNAL_STREAM="8:1234", CLOCHER_LOG_FORMAT="json")
    p = subprocess.run([T.CLOCHERD, "--model-dir", "/nonexistent/model", "--check-config"],
                       capture_output=True, text=True, timeout=30, env=env)
    assert p.returncode == 2, p.stderr
    m = re.fullmatch(r"<3>(\{.*\})\n", p.stderr)
    assert m, p.stderr
    j = json.loads(m.group(1))
    assert j["level"] == "error" and "/nonexistent/model" in j["msg"], j


def test_log_format_refuses_an_unknown_format():
    p = subprocess.run([T.CLOCHERD, "--log-format", "xml", "--model-dir", "/nonexistent"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "--log-format" in p.stderr and "xml" in p.stderr, p.stderr


def test_log_format_key_and_the_flag_over_it(tmp_path):
    """"log_format": "json" in the file makes the lines after it JSON; --log-format text wins;
    a value that is neither is refused naming the key."""
    missing = str(tmp_path / "no-such-model")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_dir": missing, "log_format": "json"}))
    env = {k: v for k, v in os.environ.items() if k not in ("CLOCHER_LOG_FORMAT", "JOURNAL_STREAM")}
    p = subprocess.run([T.CLOCHERD, "--config", str(cfg), "--check-config"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.splitlines()
    assert lines and all(json.loads(ln)["prog"] == "clocherd" for ln in lines), p.stderr
    assert any(missing in json.loads(ln)["msg"] for ln in lines), p.stderr
    p = subprocess.run([T.CLOCHERD, "--log-format", "text", "--config", str(cfg),
                        "--check-config"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and missing in p.stderr and not p.stderr.startswith("{"), p.stderr
    cfg.write_text(json.dumps({"model_dir": missing, "log_format": "xml"}))
    p = subprocess.run([T.CLOCHERD, "--config", str(cfg), "--check-config"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "log_format" in p.stderr and "xml" in p.stderr, p.stderr


# ---- models users bring (issue 17): refused with the command that converts them ----

def _hf_folder():
    hf = os.path.join(T._work, "hf-src")
    if not os.path.exists(os.path.join(hf, "config.json")):
        T.run(T.CLOCHER, "synth", "--preset", "demo", "--seed", "1", "--layers", "1", hf)
    return hf


def _gguf_file():
    g = os.path.join(T._work, "demo.Q8_0.gguf")
    with open(g, "wb") as f:
        f.write(b"GGUF\x03\x00\x00\x00" + b"\x00" * 16)
    return g


def _convert_cmd(src):
    out = re.sub(r"\.gguf$", "", src.rstrip("/")) + "-iebin"
    return "clocher convert %s %s" % (src, out), out


@pytest.mark.parametrize("kind", ["hf", "gguf"])
@pytest.mark.parametrize("how", ["start", "check-config", "config-file", "engine"])
def test_a_model_source_is_refused_with_the_convert_command(kind, how, tmp_path):
    src = _hf_folder() if kind == "hf" else _gguf_file()
    cmd, out = _convert_cmd(src)
    # without --no-convert (convert.enabled false) they convert into the cache (tests/convcache)
    if how == "engine":
        argv, want_rc = [T.ENGINE, "--no-convert", "--model-dir", src, "--prompt", "hi"], 3
    elif how == "config-file":
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"model_dir": src, "convert": {"enabled": False}}))
        argv, want_rc = [T.CLOCHERD, "--config", str(cfg), "--check-config"], 2
    else:
        argv = [T.CLOCHERD, "--no-convert", "--model-dir", src] + (
            ["--check-config"] if how != "start" else [])
        want_rc = 2
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == want_rc, (p.returncode, p.stderr)
    assert cmd in p.stderr and ("Hugging Face" if kind == "hf" else "GGUF") in p.stderr, p.stderr
    assert "configuration ok" not in p.stdout
    if kind == "hf" and how == "start":
        # the command it names is the one that works
        T.run(*([T.CLOCHER] + cmd.split()[1:]))
        p = subprocess.run([T.CLOCHERD, "--model-dir", out, "--check-config"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and "configuration ok" in p.stdout, p.stderr


def test_check_config_checks_the_model_exists_and_is_iebin(tmp_path):
    missing = str(tmp_path / "no-such-model")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_dir": missing}))
    p = subprocess.run([T.CLOCHERD, "--config", str(cfg), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and missing in p.stderr and "model_dir" in p.stderr, p.stderr
    assert "configuration ok" not in p.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    p = subprocess.run([T.CLOCHERD, "--model-dir", str(empty), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "no model.ie.json" in p.stderr, p.stderr
    (empty / "model.ie.json").write_text('{"format": "gguf"}')
    p = subprocess.run([T.CLOCHERD, "--model-dir", str(empty), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "not an IEBIN manifest" in p.stderr, p.stderr
    (empty / "model.ie.json").write_text('{"format": ')
    p = subprocess.run([T.CLOCHERD, "--model-dir", str(empty), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "model.ie.json: line 1" in p.stderr, p.stderr
    p = subprocess.run([T.CLOCHERD, "--model-dir", T.stories_model(), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "configuration ok" in p.stdout, p.stderr


def test_a_path_with_spaces_is_quoted_in_the_command(tmp_path):
    g = tmp_path / "my model.gguf"
    g.write_bytes(b"GGUF\x03\x00\x00\x00")
    p = subprocess.run([T.CLOCHERD, "--no-convert", "--model-dir", str(g), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "clocher convert '%s' '%s'" % (g, tmp_path / "my model-iebin") in p.stderr, p.stderr
