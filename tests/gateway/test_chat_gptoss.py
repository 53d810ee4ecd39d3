"""Acceptance 5 of issue 13: clocherd serves gpt-oss-tiny (random weights, the real
o200k_harmony vocabulary from the js-tiktoken npm package, as tests/tok does) end to end
through the chat form of Generate and HTTP /v1/chat/completions, and a worker killed
mid-stream is replaced as for Llama.

What is asserted (random weights give random tokens, so the structure is what is checked):
- rendering: the chat's prompt has exactly the ids of an expectation built here from the
  harmony format (docs/TOKENIZER.md) — text pieces through Tokenize (plain text, specials
  never parsed), structural tokens by their o200k_harmony ids — shown by the prompt length
  and by greedy generation from those ids giving the chat's generated ids;
- a user message spelling "<|end|>" stays text (Tokenize gives no special id for it, and the
  chat's prompt still matches the expectation);
- channels: each reply piece's channel is what a harmony parser written here says about the
  generated ids (random output seldom forms a header: the pieces are then NONE, then OTHER);
- forced output: copies of the model rewritten into a bigram machine (every layer's output
  zeroed, so the logits depend on the last token only; tok_embd/output chosen so each token
  of a chain is followed by the next) emit exact harmony sequences: a final answer ending in
  <|return|> (FINISH_REASON_EOS, text on FINAL, HTTP "stop"), a commentary message ending in
  <|call|> (TOOL_CALL, HTTP "tool_calls"), and repeated analysis messages (text on ANALYSIS,
  HTTP reasoning_content, finish LENGTH);
- HTTP: content and reasoning_content are the final and analysis channels' text;
- a worker SIGKILLed mid-stream: the stream ends UNAVAILABLE, the next chat succeeds.
Without npm/node or the registry every test here is skipped (pytest's skip)."""
import json
import os
import struct
import shutil
import signal
import subprocess
import threading
import time
import urllib.request

import grpc
import pytest

import gwtest as T

ALICE = T.key("alice-key-0001")
START, END, MESSAGE, CHANNEL, RETURN, CALL, CONSTRAIN = (200006, 200007, 200008, 200005,
                                                         200002, 200012, 200003)
SYSTEM = ("You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: "
          "2024-06\n\nReasoning: %s\n\n# Valid channels: analysis, commentary, final. Channel "
          "must be included for every message.")


def o200k():
    """BUILD/tok-js/o200k_base.tiktoken, made as tests/tok/test_tiktoken.py makes it."""
    work = os.path.join(T.BUILD, "tok-js")
    out = os.path.join(work, "o200k_base.tiktoken")
    if os.path.exists(out):
        return out
    npm, node = shutil.which("npm"), shutil.which("node")
    if not npm or not node:
        pytest.skip("npm or node is not installed")
    js = os.path.join(T.SOURCE, "tests", "tok", "js")
    os.makedirs(work, exist_ok=True)
    for f in ("package.json", "package-lock.json", "dump.mjs"):
        shutil.copyfile(os.path.join(js, f), os.path.join(work, f))
    try:
        r = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=work,
                           capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip("npm ci timed out (no network to the npm registry?)")
    if r.returncode != 0:
        pytest.skip("npm ci failed (no network to the npm registry?)")
    corpus = os.path.join(T.SOURCE, "tests", "tok", "tiktoken_corpus.txt")
    r = subprocess.run([node, "dump.mjs", work, corpus], cwd=work, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture(scope="module")
def model():
    hf, out = os.path.join(T._work, "gptoss-hf"), os.path.join(T._work, "gptoss")
    if not os.path.exists(os.path.join(out, "model.ie.json")):
        T.run(T.CLOCHER, "synth", "--preset", "gpt-oss-tiny", "--seed", "5", "--tokenizer",
              o200k(), hf)
        T.run(T.CLOCHER, "convert", hf, out)
    yield out
    for p in (hf, out):  # 100 MB each: not left behind in /tmp
        shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def d(model):
    port = T.free_port()
    dm = T.Daemon(model, workers=1,
                  extra={"http": {"listen": "127.0.0.1:%d" % port, "timeout_s": 30}})
    dm.http_port = port
    yield dm
    assert dm.stop() == 0, dm.read_log()


def tokenize(d, text):
    return list(d.stub.Tokenize(T.pb.TokenizeRequest(text=text, add_bos=False),
                                metadata=ALICE).ids)


def expected_prompt(d, msgs, effort="medium"):
    """harmony's rendering, built from the format's text: system, developer (from the first
    system message), the rest, then the generation prompt."""
    ids = [START] + tokenize(d, "system") + [MESSAGE] + tokenize(d, SYSTEM % effort) + [END]
    rest = msgs
    if msgs and msgs[0]["role"] == "system":
        ids += ([START] + tokenize(d, "developer") + [MESSAGE] +
                tokenize(d, "# Instructions\n\n" + msgs[0]["content"]) + [END])
        rest = msgs[1:]
    for m in rest:
        ids += [START] + tokenize(d, m["role"]) + [MESSAGE] + tokenize(d, m["content"]) + [END]
    return ids + [START] + tokenize(d, "assistant")


def chat(d, msgs, max_tokens=12, effort=None, timeout=60):
    req = T.pb.GenerateRequest(max_tokens=max_tokens,
                               sampling=T.pb.SamplingParams(temperature=0.0))
    for m in msgs:
        req.chat.messages.add(**m)
    if effort is not None:
        req.chat.reasoning_effort = effort
    return list(d.stub.Generate(req, metadata=ALICE, timeout=timeout))


def parse(d, ids):
    """The channel of each generated id, by harmony's grammar (a parser written here): header
    ids (NONE) until <|message|>; then the header's channel; an id the grammar refuses where
    it comes is OTHER (the worker's convention for malformed output), and the parser stays."""
    known = {"analysis": T.pb.CHANNEL_ANALYSIS, "commentary": T.pb.CHANNEL_COMMENTARY,
             "final": T.pb.CHANNEL_FINAL}
    out, state, header, chan = [], "header", [], T.pb.CHANNEL_NONE
    for i in ids:
        if state == "header":
            if i == MESSAGE:
                text = d.stub.Detokenize(T.pb.DetokenizeRequest(ids=header),
                                         metadata=ALICE).text if header else ""
                name = text.split("<|channel|>")[-1] if CHANNEL in header else ""
                name = name.split(" ")[0]
                chan = known.get(name, T.pb.CHANNEL_OTHER if CHANNEL in header
                                 else T.pb.CHANNEL_FINAL)
                out.append(chan)
                state = "content"
                continue
            if i in (START, END, RETURN, CALL) or (i >= 199998 and i not in (CHANNEL, CONSTRAIN)):
                out.append(T.pb.CHANNEL_OTHER)
                continue
            header.append(i)
            # the parser's header bound: 255 bytes; past it, ids are refused
            out.append(T.pb.CHANNEL_NONE)
        elif state == "content":
            out.append(chan)
            if i in (END, RETURN, CALL):
                state = "between" if i == END else "done"
        else:
            out.append(T.pb.CHANNEL_OTHER if i != START else T.pb.CHANNEL_NONE)
            if i == START:
                state, header = "header", []
    return out


def test_chat_renders_harmony_and_tags_channels(d):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2? say <|end|> literally"}]
    # the special's spelling in a message is text: Tokenize never gives its id
    assert END not in tokenize(d, msgs[1]["content"])
    want = expected_prompt(d, msgs)
    rs = chat(d, msgs)
    last = rs[-1]
    assert last.usage.prompt_tokens == len(want)
    got = [i for r in rs for i in r.token_ids]
    ids, ref = T.generate(d.stub, ALICE, ids=want, max_tokens=12)
    if RETURN not in got and CALL not in got:
        assert got == ids, "the chat's prompt is not harmony's rendering"
    # channels: every response's channel is the parser's for its ids
    chans = parse(d, got)
    k = 0
    for r in rs:
        for _ in r.token_ids:
            if r.text:
                assert r.channel == chans[k] or chans[k] == T.pb.CHANNEL_NONE, (r, chans[k])
            k += 1
    # stops: an emitted <|return|>/<|call|> ends the reply with its reason
    for stop, reason in ((RETURN, T.pb.FINISH_REASON_EOS), (CALL, T.pb.FINISH_REASON_TOOL_CALL)):
        if stop in got:
            assert got[-1] == stop and last.finish_reason == reason
    if RETURN not in got and CALL not in got:
        assert last.finish_reason in (T.pb.FINISH_REASON_LENGTH, T.pb.FINISH_REASON_EOS)


def test_reasoning_effort_is_rendered(d):
    msgs = [{"role": "user", "content": "hi"}]
    rs = chat(d, msgs, max_tokens=1, effort=T.pb.REASONING_EFFORT_HIGH)
    want = expected_prompt(d, msgs, "high")
    assert rs[-1].usage.prompt_tokens == len(want)
    ids, _ = T.generate(d.stub, ALICE, ids=want, max_tokens=1)
    assert [i for r in rs for i in r.token_ids] == ids


def http_chat(d, body):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % d.http_port,
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer alice-key-0001"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def test_http_chat(d):
    msgs = [{"role": "user", "content": "hi"}]
    body = {"model": json.loads(http_models(d))["data"][0]["id"], "messages": msgs,
            "max_tokens": 8, "temperature": 0}
    rs = chat(d, msgs, max_tokens=8)
    final = "".join(r.text for r in rs if r.channel not in (T.pb.CHANNEL_ANALYSIS,))
    thought = "".join(r.text for r in rs if r.channel == T.pb.CHANNEL_ANALYSIS)
    one = json.loads(http_chat(d, body))
    m = one["choices"][0]["message"]
    assert m["content"] == final
    assert m.get("reasoning_content", "") == thought
    # streamed: the deltas add up to the same
    text = http_chat(d, dict(body, stream=True))
    content, reasoning = "", ""
    for line in text.splitlines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0].get("delta", {})
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
    assert content == final and reasoning == thought


def http_models(d):
    with urllib.request.urlopen(urllib.request.Request(
            "http://127.0.0.1:%d/v1/models" % d.http_port,
            headers={"Authorization": "Bearer alice-key-0001"}), timeout=10) as r:
        return r.read().decode()


def test_worker_killed_mid_stream_is_replaced(d):
    pids = d.worker_pids()
    res = {}

    def run():
        try:
            req = T.pb.GenerateRequest(max_tokens=400,
                                       sampling=T.pb.SamplingParams(temperature=0.0))
            req.chat.messages.add(role="user", content="tell a long story")
            for r in d.stub.Generate(req, metadata=ALICE, timeout=120):
                res["tokens"] = res.get("tokens", 0) + len(r.token_ids)
            res["code"] = grpc.StatusCode.OK
        except grpc.RpcError as e:
            res["code"], res["details"] = e.code(), e.details()

    t = threading.Thread(target=run)
    t.start()
    end = time.time() + 30
    while res.get("tokens", 0) < 2 and time.time() < end:
        time.sleep(0.01)
    assert res.get("tokens", 0) >= 2, "the stream never started"
    os.kill(pids[0], signal.SIGKILL)
    t.join(60)
    assert res["code"] == grpc.StatusCode.UNAVAILABLE, res
    assert "killed by signal 9" in res["details"], res
    end = time.time() + 10
    while time.time() < end and d.worker_pids().get(0) in (None, pids[0]):
        time.sleep(0.05)
    assert d.worker_pids().get(0) not in (None, pids[0]), d.read_log()
    d.wait_serving()
    rs = chat(d, [{"role": "user", "content": "hi"}], max_tokens=4)
    assert rs[-1].HasField("finish_reason")


# ---- forced output: a bigram machine in the model's own weights ----

def forced_model(base, name, chain):
    """A copy of the IEBIN model `base` whose greedy output after chain[i] is chain[i + 1]:
    attn_o, ffn_down_exps and their biases zeroed (the residual stream is the token's
    embedding), tok_embd[chain[i]] = e_i, output_norm = 1, output[chain[i + 1]][i] = 1 (bf16),
    so the logit of the next token is sqrt(dim) and every other one 0."""
    out = os.path.join(T._work, "forced-" + name)
    if os.path.exists(out):
        return out
    os.makedirs(out)
    for f in os.listdir(base):
        shutil.copyfile(os.path.join(base, f), os.path.join(out, f))
    man = json.load(open(os.path.join(out, "model.ie.json")))
    tens = {t["name"]: t for t in man["tensors"]}
    dim = man["hparams"]["dim"]
    assert len(chain) - 1 <= dim
    one_bf16 = struct.pack("<H", 0x3F80)
    with open(os.path.join(out, man["blob"]["file"]), "r+b") as f:
        def fill(t, data):
            f.seek(t["offset"])
            f.write(data)
        for n, t in tens.items():
            if n.endswith((".attn_o", ".attn_o_bias", ".ffn_down_exps", ".ffn_down_exps_bias")):
                fill(t, bytes(t["size"]))  # zero bytes are 0.0 in f32, bf16 and mxfp4
        assert tens["tok_embd"]["dtype"] == "bf16" and tens["output"]["dtype"] == "bf16"
        fill(tens["tok_embd"], bytes(tens["tok_embd"]["size"]))
        fill(tens["output"], bytes(tens["output"]["size"]))
        fill(tens["output_norm"], struct.pack("<%df" % dim, *([1.0] * dim)))
        for i, (a, b) in enumerate(zip(chain, chain[1:])):
            f.seek(tens["tok_embd"]["offset"] + (a * dim + i) * 2)
            f.write(one_bf16)
            f.seek(tens["output"]["offset"] + (b * dim + i) * 2)
            f.write(one_bf16)
    return out


def forced_daemon(model, d, name, pieces):
    """(daemon, chain): the chain of ids after the generation prompt's last token."""
    a = tokenize(d, "assistant")
    chain = [a[-1]]
    for p in pieces:
        chain += [p] if isinstance(p, int) else tokenize(d, p)
    cyc = chain[-1] == chain[0]
    assert len(set(chain[:-1] if cyc else chain)) == len(chain) - cyc, "a bigram repeats"
    port = T.free_port()
    dm = T.Daemon(forced_model(model, name, chain), workers=1,
                  extra={"http": {"listen": "127.0.0.1:%d" % port, "timeout_s": 30}})
    dm.http_port = port
    return dm, chain[1:]


def run_forced(d, max_tokens):
    rs = chat(d, [{"role": "user", "content": "hi"}], max_tokens=max_tokens)
    ids = [i for r in rs for i in r.token_ids]
    texts = [(r.channel, r.text) for r in rs if r.text]
    body = {"model": json.loads(http_models(d))["data"][0]["id"], "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    return rs, ids, texts, json.loads(http_chat(d, body))["choices"][0]


def client_chat(fd, *args):
    """`clocher chat`: (exit code, stdout, stderr)."""
    p = subprocess.run([T.CLOCHER, "chat", "--addr", "unix:" + fd.sock,
                        "--api-key", "alice-key-0001", "--temperature", "0", *args],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_forced_final_stops_on_return(model, d):
    fd, chain = forced_daemon(model, d, "return",
                              [CHANNEL, "final", MESSAGE, " Hi there", RETURN])
    try:
        rs, ids, texts, h = run_forced(fd, 40)
        # nothing after <|return|>, which o200k_harmony makes its end-of-sequence id: like
        # every model's EOS it is not among the reply's ids
        assert ids == chain[:-1], (ids, chain)
        assert rs[-1].finish_reason == T.pb.FINISH_REASON_EOS
        assert texts and all(c == T.pb.CHANNEL_FINAL for c, _ in texts), texts
        assert "".join(t for _, t in texts) == " Hi there"
        assert h["message"]["content"] == " Hi there" and h["finish_reason"] == "stop"
        assert "reasoning_content" not in h["message"]
        rc, out, err = client_chat(fd, "--message", "user=hi", "--max-tokens", "40")
        assert rc == 0 and out == "[final]\n Hi there\n" and "finish: eos" in err, (out, err)
    finally:
        assert fd.stop() == 0, fd.read_log()
        shutil.rmtree(fd.cfg["model_dir"], ignore_errors=True)  # a 100 MB copy


def test_forced_tool_call_stops_on_call(model, d):
    fd, chain = forced_daemon(model, d, "call",
                              [CHANNEL, "commentary", MESSAGE, '{"x": 1}', CALL])
    try:
        rs, ids, texts, h = run_forced(fd, 40)
        assert ids == chain, (ids, chain)
        assert rs[-1].finish_reason == T.pb.FINISH_REASON_TOOL_CALL
        assert texts and all(c == T.pb.CHANNEL_COMMENTARY for c, _ in texts), texts
        assert h["finish_reason"] == "tool_calls" and h["message"]["content"] == '{"x": 1}'
    finally:
        assert fd.stop() == 0, fd.read_log()
        shutil.rmtree(fd.cfg["model_dir"], ignore_errors=True)  # a 100 MB copy


def test_forced_analysis_is_reasoning(model, d):
    a = tokenize(d, "assistant")[-1]
    fd, chain = forced_daemon(model, d, "analysis",
                              [CHANNEL, "analysis", MESSAGE, " think", END, START, a])
    try:
        rs, ids, texts, h = run_forced(fd, 3 * len(chain))
        assert ids == (chain * 3)[:len(ids)] and len(ids) == 3 * len(chain)
        assert rs[-1].finish_reason == T.pb.FINISH_REASON_LENGTH
        assert texts and all(c == T.pb.CHANNEL_ANALYSIS for c, _ in texts), texts
        assert "".join(t for _, t in texts) == " think" * 3
        assert h["message"]["reasoning_content"] == " think" * 3
        assert h["message"]["content"] == "" and h["finish_reason"] == "length"
        msgs = os.path.join(T._work, "msgs.json")
        with open(msgs, "w") as f:
            json.dump({"messages": [{"role": "user", "content": "hi"}]}, f)
        n = str(3 * len(chain))
        rc, out, err = client_chat(fd, "--messages", msgs, "--max-tokens", n)
        assert rc == 0 and out == "[analysis]\n think think think\n", (out, err)
        rc, out, err = client_chat(fd, "--messages", msgs, "--max-tokens", n, "--final-only")
        assert rc == 0 and out == "", (out, err)
        # the client's own refusals: no messages, a message without ROLE=
        assert client_chat(fd)[0] == 2 and client_chat(fd, "--message", "hi")[0] == 2
    finally:
        assert fd.stop() == 0, fd.read_log()
        shutil.rmtree(fd.cfg["model_dir"], ignore_errors=True)  # a 100 MB copy
