"""convcache_e2e — the models users bring, served as they are (issue 17, "Using what the user
has"): a Hugging Face folder or a GGUF given to clocherd or inference-engine is converted once
into the conversion cache (`clocher convert --cache`, client/offline/convcache.h), reused on the
next start, converted again when the source changes; a conversion that fails or dies leaves no
entry; --no-convert keeps the refusal naming `clocher convert`. The acceptance: clocherd started
on a GGUF with a chat template answers a gRPC chat and an HTTP /v1/chat/completions. And the
model's generation_config sampling defaults apply where a request is silent.
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "gateway"))
import gwtest as T  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_kv  # noqa: E402

ALICE = T.key("alice-key-0001")
# a Llama 3 style template (bos, headers, eot) over the synthetic SentencePiece vocabulary
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
            "<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
            "{% endif %}")


def render(msgs):
    """The template's text after its bos_token (the BOS id itself)."""
    out = ""
    for m in msgs:
        out += "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (
            m["role"], m["content"].strip())
    return out + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def work(name):
    d = os.path.join(T._work, "convcache", name)
    os.makedirs(os.path.dirname(d), exist_ok=True)
    return d


def synth_hf(name, preset="llama3-tiny", seed=1):
    """A Hugging Face folder of the preset (and its GGUF twin beside it, NAME.gguf)."""
    hf = work(name)
    if not os.path.exists(os.path.join(hf, "config.json")):
        T.run(T.CLOCHER, "synth", "--preset", preset, "--seed", str(seed), hf, "--gguf",
              hf + ".gguf")
    return hf


def chat_gguf(name="l3chat", seed=1):
    """llama3-tiny as a GGUF carrying tokenizer.chat_template, as downloads do."""
    g = work(name + ".gguf")
    if not os.path.exists(g):
        hf = synth_hf(name + "-src", seed=seed)
        gguf_kv.add_string_kv(hf + ".gguf", g, "tokenizer.chat_template", TEMPLATE)
    return g


def convert(cache, src, *extra):
    return subprocess.run([T.CLOCHER, "convert", "--cache", cache] + list(extra) + [src],
                          capture_output=True, text=True, timeout=120)


def entries(cache):
    """The cache's entries (complete folders) and scratch folders left over."""
    if not os.path.isdir(cache):
        return [], []
    names = sorted(os.listdir(cache))
    return ([n for n in names if not n.endswith(".lock") and ".tmp." not in n],
            [n for n in names if ".tmp." in n])


# ---- the cache itself (`clocher convert --cache`) ----

def test_converts_once_then_reuses(tmp_path):
    cache, src = str(tmp_path / "cache"), chat_gguf()
    p = convert(cache, src)
    assert p.returncode == 0, p.stderr
    path = p.stdout.strip()
    assert os.path.dirname(path) == cache and os.path.basename(path).startswith("l3chat-")
    assert os.path.exists(os.path.join(path, "model.ie.json"))
    # the chat template travelled with the weights
    meta = json.load(open(os.path.join(path, "chat.ie.json")))
    assert meta["chat_template"] == TEMPLATE
    assert "converting %s: 20/20 tensors (100%%" % src in p.stderr, p.stderr
    q = convert(cache, src)
    assert q.returncode == 0 and q.stdout.strip() == path, q.stderr
    assert "converted before" in q.stderr and "tensors (" not in q.stderr, q.stderr
    assert entries(cache) == ([os.path.basename(path)], [])


def test_the_key_follows_the_content(tmp_path):
    cache = str(tmp_path / "cache")
    hf = str(tmp_path / "hf")
    shutil.copytree(synth_hf("l3"), hf)
    first = convert(cache, hf).stdout.strip()
    assert first
    # a file the converter does not read changes nothing
    (tmp_path / "hf" / "README.md").write_text("# my model\n")
    assert convert(cache, hf).stdout.strip() == first
    # the same bytes under another mtime: a new key (a tool rewrote the file)
    cfg = tmp_path / "hf" / "config.json"
    st = os.stat(cfg)
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = convert(cache, hf).stdout.strip()
    assert second and second != first
    # different bytes with the size and mtime kept (a copy with its time): a new key
    text = cfg.read_text()
    st = os.stat(cfg)
    assert "\n  " in text
    cfg.write_text(text.replace("\n  ", "\n\t ", 1))  # still the same JSON
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(cfg).st_size == st.st_size
    third = convert(cache, hf).stdout.strip()
    assert third and third not in (first, second)
    # the dtype asked for is part of the key; int8 is q8_0 by another name
    q8 = convert(cache, hf, "--dtype", "q8_0").stdout.strip()
    assert q8 and q8 not in (first, second, third)
    assert convert(cache, hf, "--dtype", "int8").stdout.strip() == q8
    assert len(entries(cache)[0]) == 4 and entries(cache)[1] == []


def test_concurrent_starts_convert_once(tmp_path):
    cache, src = str(tmp_path / "cache"), synth_hf("demo", preset="demo")
    ps = [subprocess.Popen([T.CLOCHER, "convert", "--cache", cache, "--dtype", "int4", src],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in ps]
    assert [p.returncode for p in ps] == [0, 0, 0], outs
    paths = {o[0].strip() for o in outs}
    assert len(paths) == 1
    errs = "".join(o[1] for o in outs)
    assert errs.count("converted %s in" % src) == 1, errs
    assert entries(cache) == ([os.path.basename(paths.pop())], [])


def test_a_conversion_killed_midway_leaves_no_entry(tmp_path):
    cache, src = str(tmp_path / "cache"), synth_hf("demo", preset="demo")
    p = subprocess.Popen([T.CLOCHER, "convert", "--cache", cache, "--dtype", "int4", src],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:  # the first progress line: the conversion is under way
        if "tensors (" in line:
            p.send_signal(signal.SIGKILL)
            break
    p.wait(60)
    assert p.returncode == -signal.SIGKILL
    done, scratch = entries(cache)
    assert done == [] and len(scratch) == 1, (done, scratch)
    # the next one removes the leftover and converts
    q = convert(cache, src, "--dtype", "int4")
    assert q.returncode == 0, q.stderr
    assert "left by a conversion that did not finish" in q.stderr, q.stderr
    assert entries(cache) == ([os.path.basename(q.stdout.strip())], [])


def _bad_sources(tmp_path):
    hf = synth_hf("l3")
    noshard = tmp_path / "noshard"
    shutil.copytree(hf, noshard)
    os.remove(noshard / "model.safetensors")
    phi = tmp_path / "phi"
    shutil.copytree(hf, phi)
    cfg = json.loads((phi / "config.json").read_text())
    cfg["model_type"] = "phi3"
    (phi / "config.json").write_text(json.dumps(cfg))
    trunc = tmp_path / "trunc.gguf"
    trunc.write_bytes(open(chat_gguf(), "rb").read()[:200000])
    return {
        "missing": (str(tmp_path / "no-such-model"), ["no-such-model", "No such file"]),
        "no-weights": (str(noshard), ["noshard", "no safetensors weights"]),
        "unsupported": (str(phi), ["config.json", "model_type phi3 is not supported"]),
        "truncated": (str(trunc), ["trunc.gguf", "beyond the end of the file"]),
    }


@pytest.mark.parametrize("kind", ["missing", "no-weights", "unsupported", "truncated"])
def test_a_bad_source_is_named_and_leaves_no_entry(kind, tmp_path):
    cache = str(tmp_path / "cache")
    src, words = _bad_sources(tmp_path)[kind]
    p = convert(cache, src)
    assert p.returncode == 3, (p.returncode, p.stderr)
    for w in words:
        assert w in p.stderr, p.stderr
    assert p.stdout == ""
    assert entries(cache) == ([], [])


def test_clocherd_reports_a_failed_conversion(tmp_path):
    """The supervisor names the converter, its exit status and its last line; exit 2."""
    cache = str(tmp_path / "cache")
    src, words = _bad_sources(tmp_path)["truncated"]
    p = subprocess.run([T.CLOCHERD, "--model-dir", src, "--cache-dir", cache, "--workers", "1"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "conversion failed" in p.stderr and "exited with status 3" in p.stderr, p.stderr
    assert "beyond the end of the file" in p.stderr.split("conversion failed")[1], p.stderr
    assert "worker 0: started" not in p.stderr
    assert entries(cache) == ([], [])
    # inference-engine: the same refusal, its exit status for a bad model (3)
    e = subprocess.run([T.ENGINE, "--model-dir", src, "--cache-dir", cache, "--prompt", "hi"],
                       capture_output=True, text=True, timeout=120)
    assert e.returncode == 3 and "exited with status 3" in e.stderr, e.stderr


def test_sigterm_while_converting_stops_the_converter(tmp_path):
    """clocherd stops its converter and exits 0; nothing half-converted becomes an entry."""
    cache = str(tmp_path / "cache")
    log = tmp_path / "clocherd.log"
    with open(log, "w") as f:
        p = subprocess.Popen([T.CLOCHERD, "--model-dir", synth_hf("demo", preset="demo"),
                              "--cache-dir", cache, "--convert-dtype", "int4", "--workers", "1"],
                             stdout=f, stderr=subprocess.STDOUT)
    end = time.time() + 60
    while "tensors (" not in log.read_text() and p.poll() is None and time.time() < end:
        time.sleep(0.01)
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0, log.read_text()
    text = log.read_text()
    assert "SIGTERM while converting the model: stopping the converter" in text, text
    assert "stopped while converting the model" in text and "worker 0: started" not in text
    assert entries(cache)[0] == []


# ---- the refusal kept (--no-convert, convert.enabled false) ----

@pytest.mark.parametrize("how", ["flag", "config", "engine"])
def test_no_convert_refuses_with_the_command(how, tmp_path):
    src = chat_gguf()
    if how == "engine":
        argv, want = [T.ENGINE, "--no-convert", "--model-dir", src, "--prompt", "hi"], 3
    elif how == "config":
        cfg = tmp_path / "c.json"
        cfg.write_text(json.dumps({"model_dir": src, "convert": {"enabled": False}}))
        argv, want = [T.CLOCHERD, "--config", str(cfg), "--check-config"], 2
    else:
        argv, want = [T.CLOCHERD, "--no-convert", "--model-dir", src, "--check-config"], 2
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == want, (p.returncode, p.stderr)
    assert "clocher convert %s %s" % (src, src[:-5] + "-iebin") in p.stderr, p.stderr


def test_check_config_says_where_it_will_convert(tmp_path):
    src = chat_gguf()
    p = subprocess.run([T.CLOCHERD, "--model-dir", src, "--cache-dir", str(tmp_path / "c"),
                        "--check-config"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "a GGUF file, converted at start into the cache %s" % (tmp_path / "c") in p.stdout
    assert "configuration ok" in p.stdout
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"model_dir": src, "convert": {"dtype": "q3_k"}}))
    p = subprocess.run([T.CLOCHERD, "--config", str(bad), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "convert.dtype" in p.stderr and "q3_k" in p.stderr, p.stderr
    p = subprocess.run([T.CLOCHERD, "--model-dir", src, "--convert-program",
                        str(tmp_path / "nothere"), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "nothere" in p.stderr, p.stderr


def test_inference_engine_runs_a_gguf(tmp_path):
    cache = str(tmp_path / "cache")
    argv = [T.ENGINE, "--model-dir", chat_gguf(), "--cache-dir", cache, "--prompt", "hello",
            "--max-new", "4", "--greedy", "--threads", "1", "--print-ids", "--quiet"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    run1 = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(run1["generated_ids"]) == 4
    assert "20/20 tensors" in p.stderr
    q = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert q.returncode == 0 and "converted before" in q.stderr and "tensors (" not in q.stderr
    assert json.loads(q.stdout.strip().splitlines()[-1])["generated_ids"] == run1["generated_ids"]
    # --cache-max-gb: another model's run evicts this (old) entry, not its own
    (mine,), _ = entries(cache)
    os.utime(os.path.join(cache, mine), (time.time() - 3600,) * 2)
    other = argv[:2] + [chat_gguf("l3chat-seed2", seed=2)] + argv[3:] + ["--cache-max-gb",
                                                                         "0.000001"]
    r = subprocess.run(other, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "evicted %s" % os.path.join(cache, mine) in r.stderr, r.stderr
    assert len(entries(cache)[0]) == 1 and mine not in entries(cache)[0]
    bad = subprocess.run(argv + ["--cache-max-gb", "-3"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--cache-max-gb -3" in bad.stderr, bad.stderr


# ---- acceptance: clocherd started on a GGUF serves a chat request ----

def _daemon(src, cache, port):
    return T.Daemon(src, workers=1,
                    extra={"convert": {"cache_dir": cache},
                           "http": {"listen": "127.0.0.1:%d" % port}})


def _http_chat(port, msgs):
    body = json.dumps({"model": "l3chat.gguf", "messages": msgs, "max_tokens": 6,
                       "temperature": 0}).encode()
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port, data=body,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer alice-key-0001"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status, json.loads(r.read())


def test_clocherd_started_on_a_gguf_serves_chat(tmp_path):
    cache = str(tmp_path / "cache")
    src = str(tmp_path / "l3chat.gguf")
    shutil.copy(chat_gguf(), src)
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    port = T.free_port()
    d = _daemon(src, cache, port)
    try:
        log = d.read_log()
        assert "20/20 tensors (100%" in log and "serving its conversion" in log, log
        # gRPC chat: rendered with the GGUF's own template
        req = T.pb.GenerateRequest(max_tokens=6, sampling=T.pb.SamplingParams(temperature=0.0))
        for m in msgs:
            req.chat.messages.add(**m)
        rs = list(d.stub.Generate(req, metadata=ALICE, timeout=60))
        assert rs[-1].usage.completion_tokens == 6
        want = d.stub.Tokenize(T.pb.TokenizeRequest(text=render(msgs), add_bos=True),
                               metadata=ALICE).ids
        assert rs[-1].usage.prompt_tokens == len(want)
        grpc_text = "".join(r.text for r in rs)
        # HTTP: the same chat, the same greedy answer
        status, body = _http_chat(port, msgs)
        assert status == 200 and body["usage"]["prompt_tokens"] == len(want)
        assert body["choices"][0]["message"]["content"] == grpc_text
    finally:
        assert d.stop() == 0
    (first,), _ = entries(cache)

    # the second start reuses the entry: no conversion in its log, and quick
    t0 = time.time()
    d = _daemon(src, cache, port)
    try:
        took = time.time() - t0
        log = d.read_log()
        assert "converted before" in log and "tensors (" not in log, log
        assert took < 30, took
        assert _http_chat(port, msgs)[1]["choices"][0]["message"]["content"] == grpc_text
    finally:
        assert d.stop() == 0
    assert entries(cache) == ([first], [])

    # a changed source (other weights under the same name) is converted again
    os.remove(src)
    shutil.copy(chat_gguf("l3chat-seed2", seed=2), src)
    d = _daemon(src, cache, port)
    try:
        assert "20/20 tensors (100%" in d.read_log()
    finally:
        assert d.stop() == 0
    done, scratch = entries(cache)
    assert len(done) == 2 and first in done and scratch == []


# ---- eviction (--cache-max-gb, convert.cache_max_gb) ----

def _bytes(path):
    """Bytes on disk under path (st_blocks, as the evictor counts them)."""
    n = os.lstat(path).st_blocks * 512
    for root, dirs, files in os.walk(path):
        for f in dirs + files:
            n += os.lstat(os.path.join(root, f)).st_blocks * 512
    return n


def test_eviction_removes_the_least_recently_used_but_never_one_in_use(tmp_path):
    cache = str(tmp_path / "cache")
    srcs = [chat_gguf(), chat_gguf("l3chat-seed2", seed=2), chat_gguf("l3chat-seed3", seed=3)]
    paths = []
    for s_ in srcs:
        p = convert(cache, s_)
        assert p.returncode == 0, p.stderr
        paths.append(p.stdout.strip())
    size = max(_bytes(p) for p in paths)
    now = time.time()
    for age, p in zip((3000, 2000, 1000), paths):  # paths[0] is the least recently used
        os.utime(p, (now - age, now - age))
    limit_gb = "%.9f" % (size * 1.5 / 1e9)  # room for one entry, not two
    # a server holds paths[0] (its shared lock): eviction keeps it and removes paths[1]
    hold = open(paths[0] + ".lock", "a+")
    fcntl.flock(hold, fcntl.LOCK_SH)
    try:
        r = convert(cache, srcs[2], "--cache-max-gb", limit_gb)
        assert r.returncode == 0 and r.stdout.strip() == paths[2], r.stderr
        assert "%s is in use: kept" % paths[0] in r.stderr, r.stderr
        assert "evicted %s" % paths[1] in r.stderr, r.stderr
        assert "above its limit" in r.stderr, r.stderr
        assert entries(cache) == (sorted(os.path.basename(p) for p in (paths[0], paths[2])), [])
    finally:
        hold.close()
    # released: it goes now; the entry just served (and stamped) stays
    r = convert(cache, srcs[2], "--cache-max-gb", limit_gb)
    assert r.returncode == 0 and "evicted %s" % paths[0] in r.stderr, r.stderr
    assert entries(cache) == ([os.path.basename(paths[2])], [])
    # an entry used within the last minute is not evicted either (a server may be about to
    # take its lock): paths[1] comes back, then paths[2] is served with room for one only
    p = convert(cache, srcs[1])
    assert p.returncode == 0 and p.stdout.strip() == paths[1], p.stderr
    r = convert(cache, srcs[2], "--cache-max-gb", limit_gb)
    assert r.returncode == 0 and "evicted" not in r.stderr and "above its limit" in r.stderr
    assert len(entries(cache)[0]) == 2
    # what was evicted converts again when asked for, as a miss
    r = convert(cache, srcs[0])
    assert r.returncode == 0 and "tensors (100%" in r.stderr and r.stdout.strip() == paths[0]


@pytest.mark.parametrize("args, says", [
    (["--cache-max-gb", "0"], "above 0"), (["--cache-max-gb", "-1"], "above 0"),
    (["--cache-max-gb", "lots"], "expected a number"), (["--cache-max-gb", "1e9"], "at most"),
    (["--cache-max-gb", "nan"], "expected a number")])
def test_a_bad_cache_max_gb_is_refused(args, says, tmp_path):
    p = subprocess.run([T.CLOCHER, "convert", "--cache", str(tmp_path / "c")] + args +
                       [chat_gguf()], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--cache-max-gb" in p.stderr and says in p.stderr, p.stderr
    p = subprocess.run([T.CLOCHER, "convert", chat_gguf(), str(tmp_path / "o"),
                        "--cache-max-gb", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--cache-max-gb goes with --cache" in p.stderr, p.stderr


@pytest.mark.parametrize("value, says", [("10", "number of gigabytes"),
                                         (-1, "number of gigabytes in 0..")])
def test_a_bad_convert_cache_max_gb_key_is_refused(value, says, tmp_path):
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({"model_dir": chat_gguf(), "convert": {"cache_max_gb": value}}))
    p = subprocess.run([T.CLOCHERD, "--config", str(bad), "--check-config"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "convert.cache_max_gb" in p.stderr and says in p.stderr, \
        p.stderr


def test_clocherd_holds_its_entry_against_eviction(tmp_path):
    """clocherd keeps a shared lock on the entry it serves: another program trimming the cache
    (a second daemon with convert.cache_max_gb, or `clocher convert --cache-max-gb`) keeps it,
    so a worker respawned later still finds its weights."""
    cache = str(tmp_path / "cache")
    src = str(tmp_path / "l3chat.gguf")
    shutil.copy(chat_gguf(), src)
    port = T.free_port()
    d = T.Daemon(src, workers=1, extra={"convert": {"cache_dir": cache, "cache_max_gb": 100},
                                         "http": {"listen": "127.0.0.1:%d" % port}})
    try:
        (served,), _ = entries(cache)
        served = os.path.join(cache, served)
        os.utime(served, (time.time() - 3600,) * 2)
        r = convert(cache, chat_gguf("l3chat-seed2", seed=2), "--cache-max-gb", "0.000001")
        assert r.returncode == 0, r.stderr
        assert "%s is in use: kept" % served in r.stderr, r.stderr
        assert os.path.exists(os.path.join(served, "model.ie.json"))
        # a worker killed now is replaced from the same entry and serves
        old = d.worker_pids()[0]
        os.kill(old, signal.SIGKILL)
        end = time.time() + 120
        while d.worker_pids().get(0) in (None, old):
            assert time.time() < end, d.read_log()
            time.sleep(0.1)
        status, body = _http_chat(port, [{"role": "user", "content": "Hi"}])
        assert status == 200 and body["usage"]["completion_tokens"] > 0
    finally:
        assert d.stop() == 0
    # stopped: nothing holds it any more
    r = convert(cache, chat_gguf("l3chat-seed2", seed=2), "--cache-max-gb", "0.000001")
    assert "evicted %s" % served in r.stderr, r.stderr


@pytest.mark.parametrize("key", ["http", "listen"])
def test_a_taken_port_is_reported_before_converting(key, tmp_path):
    """A conversion may take minutes: a port another process holds is reported first, naming
    the key, and nothing is converted."""
    import socket
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    cache = tmp_path / "cache"
    cfg = {"model_dir": chat_gguf(), "workers": 1, "metrics": {"listen": None},
           "listen": {"unix": str(tmp_path / "gw.sock"), "tcp": None},
           "convert": {"cache_dir": str(cache)}}
    if key == "http":
        cfg["http"] = {"listen": "127.0.0.1:%d" % port}
    else:
        cfg["listen"]["tcp"] = "127.0.0.1:%d" % port
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    try:
        p = subprocess.run([T.CLOCHERD, "--config", str(tmp_path / "c.json")],
                           capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    name = "http.listen" if key == "http" else "listen.tcp"
    assert p.returncode == 1, p.stderr
    assert "%s: cannot listen on 127.0.0.1:%d" % (name, port) in p.stderr, p.stderr
    assert "another process serves that port" in p.stderr
    assert "converting" not in p.stderr and entries(str(cache)) == ([], [])


# ---- generation_config's sampling defaults ----

def test_generation_config_defaults_apply_where_the_request_is_silent(tmp_path):
    hf = str(tmp_path / "hf")
    shutil.copytree(synth_hf("l3"), hf)
    # top_k 1: the model's own default makes every unspecified request greedy
    with open(os.path.join(hf, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "top_k": 1, "temperature": 1.0}, f)
    d = T.Daemon(hf, workers=1, extra={"convert": {"cache_dir": str(tmp_path / "cache")}})
    try:
        def gen(sampling):
            req = T.pb.GenerateRequest(max_tokens=12, prompt="Once upon a time")
            if sampling is not None:
                req.sampling.CopyFrom(sampling)
            return [i for r in d.stub.Generate(req, metadata=ALICE, timeout=60)
                    for i in r.token_ids]
        greedy = gen(T.pb.SamplingParams(temperature=0.0))
        # silent on top_k: the model's 1 applies, whatever the seed
        for seed in (1, 2, 3):
            assert gen(T.pb.SamplingParams(seed=seed)) == greedy
        assert gen(None) == greedy
        # the request's own top_k (0 = off) wins over the model's
        free = [gen(T.pb.SamplingParams(seed=s, top_k=0, temperature=1.5)) for s in (1, 2, 3)]
        assert any(f != greedy for f in free)
    finally:
        assert d.stop() == 0


def test_a_sampling_default_out_of_range_is_refused_at_start(tmp_path):
    hf = str(tmp_path / "hf")
    shutil.copytree(synth_hf("l3"), hf)
    with open(os.path.join(hf, "generation_config.json"), "w") as f:
        json.dump({"top_p": 0}, f)
    p = subprocess.run([T.CLOCHERD, "--model-dir", hf, "--cache-dir", str(tmp_path / "c"),
                        "--workers", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert "chat.ie.json: sampling.top_p: 0 is outside (0, 1]" in p.stderr, p.stderr
    assert "worker 0: started" not in p.stderr
