"""The chat form of Generate (issue 13): messages in, channel-tagged text out, rendered by the
worker. Here on the demo Llama (plain template) and stories260K (no tokenizer: no template);
each bad input gets INVALID_ARGUMENT/FAILED_PRECONDITION naming what is wrong.
(The gpt-oss-tiny harmony end to end, acceptance 5, is not written yet.)"""
import json
import urllib.error
import urllib.request

import grpc
import pytest

import gwtest as T

ALICE = T.key("alice-key-0001")


@pytest.fixture(scope="module")
def d():
    dm = T.Daemon(T.demo_model(), workers=1,
                  limits={"max_prompt_bytes": 4096, "max_prompt_tokens": 512})
    yield dm
    assert dm.stop() == 0, dm.read_log()


def chat(d, msgs, max_tokens=8, **kw):
    req = T.pb.GenerateRequest(max_tokens=max_tokens,
                               sampling=T.pb.SamplingParams(temperature=0.0))
    req.chat.SetInParent()  # a chat even without messages
    for m in msgs:
        req.chat.messages.add(**m)
    for k, v in kw.items():
        setattr(req.chat, k, v)
    return list(d.stub.Generate(req, metadata=ALICE, timeout=60))


def code_of(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def test_plain_template_is_the_prompt(d):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}]
    rs = chat(d, msgs)
    last = rs[-1]
    # the worker's plain template, token for token (Tokenize adds BOS the same way)
    want = d.stub.Tokenize(T.pb.TokenizeRequest(
        text="<|system|>\nYou are terse.\n<|user|>\nHi\n<|assistant|>\n", add_bos=True),
        metadata=ALICE).ids
    assert last.usage.prompt_tokens == len(want)
    # every piece of a plain-template chat is the final channel
    assert all(r.channel == T.pb.CHANNEL_FINAL for r in rs if r.text)
    # and its ids are those of the same prompt given as ids
    ids, _ = T.generate(d.stub, ALICE, ids=list(want), max_tokens=8)
    assert [i for r in rs for i in r.token_ids] == ids


@pytest.mark.parametrize("msgs,code,words", [
    ([], grpc.StatusCode.INVALID_ARGUMENT, "chat.messages: empty"),
    ([{"role": "wizard", "content": "x"}], grpc.StatusCode.INVALID_ARGUMENT,
     "chat.messages[0].role: \"wizard\" is not a role"),
    ([{"role": "user", "content": "x"}] * 257, grpc.StatusCode.INVALID_ARGUMENT,
     "chat.messages: 257, the limit is 256"),
    ([{"role": "user", "content": "x" * 5000}], grpc.StatusCode.INVALID_ARGUMENT,
     "limits.max_prompt_bytes"),
    ([{"role": "tool", "content": "42"}], grpc.StatusCode.INVALID_ARGUMENT,
     "a tool message names its tool"),
    ([{"role": "user", "content": "x", "channel": "analysis"}], grpc.StatusCode.INVALID_ARGUMENT,
     "only assistant messages have one"),
])
def test_bad_chat(d, msgs, code, words):
    c, why = code_of(lambda: chat(d, msgs))
    assert c == code and words in why, why


def test_chat_without_template():
    port = T.free_port()
    dm = T.Daemon(T.stories_model(), workers=1,
                  extra={"http": {"listen": "127.0.0.1:%d" % port, "timeout_s": 30}})
    try:
        c, why = code_of(lambda: chat(dm, [{"role": "user", "content": "hi"}]))
        assert c == grpc.StatusCode.FAILED_PRECONDITION and "no tokenizer" in why, why
        # the HTTP door: 400 naming why
        auth = {"Authorization": "Bearer alice-key-0001"}
        with urllib.request.urlopen(urllib.request.Request(
                "http://127.0.0.1:%d/v1/models" % port, headers=auth), timeout=30) as r:
            name = json.loads(r.read())["data"][0]["id"]
        req = urllib.request.Request(
            "http://127.0.0.1:%d/v1/chat/completions" % port, method="POST",
            data=json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}]})
            .encode(), headers={"Content-Type": "application/json",
                                "Authorization": "Bearer alice-key-0001"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        body = json.loads(e.value.read())
        assert e.value.code == 400 and "no tokenizer" in body["error"]["message"], body
    finally:
        assert dm.stop() == 0, dm.read_log()
