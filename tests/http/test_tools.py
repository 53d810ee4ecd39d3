"""Tool calling end to end against a real clocherd (docs/CHAT.md "Tools"): the chat form of
Generate (gRPC) with Chat.tools_json, tool calls and tool answers, on gpt-oss-tiny (harmony)
and on the demo Llama given Qwen2.5's chat template (Jinja, Hermes-style calls).

Random weights never call a tool by themselves, so:
- the render is checked: the prompt the worker builds has exactly the ids of the text
  python3-jinja2 renders with the model's template the way apply_chat_template does (Qwen2.5),
  shown by the prompt length and by greedy generation from those ids giving the chat's ids;
  for harmony, the prompt grows by exactly the "# Tools" block;
- the parse is forced: a copy of gpt-oss-tiny rewritten into a bigram machine
  (tests/gateway/test_chat_gptoss.py's forced_model) emits
  `<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}<|call|>`:
  the reply's arguments carry recipient "functions.get_weather" and a tool_call_id
  "call_" + 24 alphanumerics, and finish TOOL_CALL (the Jinja formats' parsers are held to
  exact token streams in tests/chat/test_chat_tools.c);
- bad tools are INVALID_ARGUMENT naming the element and field.
Without npm/node or the registry (the o200k vocabulary), the gpt-oss tests are skipped."""
import json
import os
import re
import shutil
import sys
import urllib.error
import urllib.request

import grpc
import pytest

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "gateway"))
sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "chat"))
import gwtest as T  # noqa: E402
import test_chat_gptoss as G  # noqa: E402

ALICE = T.key("alice-key-0001")
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def chat(d, msgs, tools=None, max_tokens=8):
    req = T.pb.GenerateRequest(max_tokens=max_tokens,
                               sampling=T.pb.SamplingParams(temperature=0.0))
    for m in msgs:
        req.chat.messages.add(**m)
    if tools is not None:
        req.chat.tools_json = tools if isinstance(tools, str) else json.dumps(tools)
    return list(d.stub.Generate(req, metadata=ALICE, timeout=60))


def code_of(fn):
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


CALL_ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "recipient": "functions.get_weather", "tool_call_id": "call00001",
     "content": '{"city": "Paris"}'},
    {"role": "tool", "recipient": "functions.get_weather", "tool_call_id": "call00001",
     "content": "21C"},
]

# ---- Jinja: the demo Llama with Qwen2.5's template ----


@pytest.fixture(scope="module")
def qwen():
    base = T.demo_model()
    out = os.path.join(T._work, "demo-qwen-template")
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(base):
        if f != "chat.ie.json" and not os.path.exists(os.path.join(out, f)):
            os.symlink(os.path.join(base, f), os.path.join(out, f))
    with open(os.path.join(T.FIXTURES, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")) as f:
        src = f.read()
    with open(os.path.join(out, "chat.ie.json"), "w") as f:
        json.dump({"chat_template": src}, f)
    dm = T.Daemon(out, workers=1, limits={"max_prompt_tokens": 1000, "max_prompt_bytes": 65536})
    dm.template = src
    yield dm
    assert dm.stop() == 0, dm.read_log()


def apply_chat_template(src, messages, tools):
    import test_chat_templates as CT  # python3-jinja2 the way transformers renders
    return CT.jinja2_render(src, {"messages": messages, "tools": tools, "documents": None,
                                  "add_generation_prompt": True})


def test_jinja_render_with_tools_is_apply_chat_template(qwen):
    # the same conversation as OpenAI's clients send it (arguments parsed, as the worker does)
    hf = [CALL_ROUND_TRIP[0],
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call00001", "type": "function",
               "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "content": "21C", "name": "get_weather", "tool_call_id": "call00001"}]
    text = apply_chat_template(qwen.template, hf, TOOLS)
    assert "<tools>" in text and "<tool_response>\n21C\n</tool_response>" in text
    want = list(qwen.stub.Tokenize(T.pb.TokenizeRequest(text=text, add_bos=False),
                                   metadata=ALICE).ids)
    rs = chat(qwen, CALL_ROUND_TRIP, TOOLS)
    assert rs[-1].usage.prompt_tokens == len(want)
    ids, _ = T.generate(qwen.stub, ALICE, ids=want, max_tokens=8)
    assert [i for r in rs for i in r.token_ids] == ids
    # random text is no tool call: content only, no recipient, finish not TOOL_CALL
    assert not any(r.recipient or r.tool_call_id for r in rs)
    assert rs[-1].finish_reason != T.pb.FINISH_REASON_TOOL_CALL
    # without tools the template leaves its tools block out: a shorter prompt
    rs2 = chat(qwen, [CALL_ROUND_TRIP[0]])
    assert rs2[-1].usage.prompt_tokens < rs[-1].usage.prompt_tokens


@pytest.mark.parametrize("tools,words", [
    ("[1", "chat.tools_json: not JSON"),
    ('{"type": "function"}', "chat.tools_json: not an array"),
    ("[1]", "chat.tools_json[0]: not an object"),
    ('[{"type": "code_interpreter"}]', 'chat.tools_json[0].type: must be "function"'),
    ('[{"type": "function"}]', "chat.tools_json[0].function: missing"),
    ('[{"type": "function", "function": {"name": "ok"}}, {"type": "function", "function": {}}]',
     "chat.tools_json[1].function.name: missing"),
    ('[{"type": "function", "function": {"name": "get weather"}}]',
     'chat.tools_json[0].function.name: "get weather" is not'),
    ('[{"type": "function", "function": {"name": "f", "parameters": []}}]',
     "chat.tools_json[0].function.parameters: not a JSON Schema object"),
    ('[{"type": "function", "function": {"name": "f", "description": 3}}]',
     "chat.tools_json[0].function.description: not a string"),
])
def test_bad_tools_named(qwen, tools, words):
    c, why = code_of(lambda: chat(qwen, [{"role": "user", "content": "x"}], tools))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and words in why, (c, why)


@pytest.mark.parametrize("msgs,words", [
    ([{"role": "user", "content": "x", "tool_call_id": "call1"}],
     "messages[0].tool_call_id: only a tool call"),
    ([{"role": "tool", "recipient": "f", "tool_call_id": "call 1", "content": "x"}],
     "messages[0].tool_call_id: byte 0x20"),
])
def test_bad_tool_call_ids_named(qwen, msgs, words):
    c, why = code_of(lambda: chat(qwen, msgs))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and words in why, (c, why)


# ---- harmony: gpt-oss-tiny ----

@pytest.fixture(scope="module")
def oss():
    hf, out = os.path.join(T._work, "tools-gptoss-hf"), os.path.join(T._work, "tools-gptoss")
    if not os.path.exists(os.path.join(out, "model.ie.json")):
        T.run(T.CLOCHER, "synth", "--preset", "gpt-oss-tiny", "--seed", "5", "--tokenizer",
              G.o200k(), hf)
        T.run(T.CLOCHER, "convert", hf, out)
    dm = T.Daemon(out, workers=1)
    dm.model = out
    yield dm
    assert dm.stop() == 0, dm.read_log()
    for p in (hf, out):  # 100 MB each
        shutil.rmtree(p, ignore_errors=True)


def test_harmony_render_with_tools(oss):
    user = [{"role": "user", "content": "Weather in Paris?"}]
    bare = chat(oss, user, max_tokens=1)[-1].usage.prompt_tokens
    withtools = chat(oss, user, TOOLS, max_tokens=1)[-1].usage.prompt_tokens
    # gpt-oss's template: a developer message "# Tools\n\n## functions\n\nnamespace functions
    # {...}" and the system message's line on where calls go
    block = ("# Tools\n\n## functions\n\nnamespace functions {\n\n// Weather in a city\n"
             "type get_weather = (_: {\ncity: string,\n}) => any;\n\n} // namespace functions")
    line = "\nCalls to these tools must go to the commentary channel: 'functions'."
    extra = (len(G.tokenize(oss, G.SYSTEM % "medium" + line)) -
             len(G.tokenize(oss, G.SYSTEM % "medium")) +
             3 + len(G.tokenize(oss, "developer")) + len(G.tokenize(oss, block)))
    assert withtools - bare == extra
    # a whole round trip renders (the call as commentary to=..., the answer from the tool)
    rs = chat(oss, CALL_ROUND_TRIP, TOOLS, max_tokens=2)
    assert rs[-1].usage.prompt_tokens > withtools
    # harmony refuses tools its template cannot render, naming them
    c, why = code_of(lambda: chat(oss, user, [{"type": "function", "function": {"name": "f"}}]))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and "tools[0] (f): no description" in why, why


def test_forced_harmony_tool_call(oss):
    fd, chain = G.forced_daemon(oss.model, oss, "tools-call", FORCED_CALL)
    try:
        rs = chat(fd, [{"role": "user", "content": "hi"}], TOOLS, max_tokens=40)
        assert [i for r in rs for i in r.token_ids] == chain
        calls = [r for r in rs if r.recipient]
        assert calls, rs
        assert all(r.recipient == "functions.get_weather" for r in calls)
        ids = {r.tool_call_id for r in calls}
        assert len(ids) == 1 and re.fullmatch(r"call_[A-Za-z0-9]{24}", ids.pop()), ids
        assert "".join(r.text for r in calls) == '{"city":"Oslo"}'
        assert all(r.channel == T.pb.CHANNEL_COMMENTARY for r in calls)
        # nothing of the call leaks into text without a recipient
        assert "".join(r.text for r in rs if not r.recipient) == ""
        assert rs[-1].finish_reason == T.pb.FINISH_REASON_TOOL_CALL
    finally:
        assert fd.stop() == 0, fd.read_log()
        shutil.rmtree(fd.cfg["model_dir"], ignore_errors=True)  # a 100 MB copy


FORCED_CALL = [G.CHANNEL, "commentary to=functions.get_weather ", G.CONSTRAIN, "json", G.MESSAGE,
               '{"city":"Oslo"}', G.CALL]

# ---- tool_choice: the server opens the call; random weights then write its arguments ----

TOOLS2 = TOOLS + [{"type": "function", "function": {
    "name": "get_time", "description": "Time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def chat_choice(d, msgs, tools, choice, fn=None, max_tokens=3, parallel=None):
    req = T.pb.GenerateRequest(max_tokens=max_tokens,
                               sampling=T.pb.SamplingParams(temperature=0.0))
    for m in msgs:
        req.chat.messages.add(**m)
    if tools is not None:
        req.chat.tools_json = json.dumps(tools)
    if choice is not None:
        req.chat.tool_choice = choice
    if fn is not None:
        req.chat.tool_choice_function = fn
    if parallel is not None:
        req.chat.parallel_tool_calls = parallel
    return list(d.stub.Generate(req, metadata=ALICE, timeout=60))


def test_tool_choice_harmony(oss):
    """A named function: the prompt ends with the call's opening (exactly its ids) and the
    reply, whatever the random weights write, is a call of that tool; "required" opens the call
    up to the name, which the model writes."""
    user = [{"role": "user", "content": "Time in Oslo?"}]
    auto = chat_choice(oss, user, TOOLS2, None, max_tokens=1)[-1].usage.prompt_tokens
    rs = chat_choice(oss, user, TOOLS2, "function", "get_time", max_tokens=3)
    opening = ([G.CHANNEL] + G.tokenize(oss, "commentary to=functions.get_time ") +
               [G.CONSTRAIN] + G.tokenize(oss, "json") + [G.MESSAGE])
    assert rs[-1].usage.prompt_tokens == auto + len(opening)
    calls = [r for r in rs if r.recipient]
    assert calls and calls[0] is rs[0], rs  # the first piece opens the call
    assert {r.recipient for r in calls} == {"functions.get_time"}
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0].tool_call_id)
    assert rs[-1].finish_reason == T.pb.FINISH_REASON_LENGTH
    req = chat_choice(oss, user, TOOLS2, "required", max_tokens=1)
    assert req[-1].usage.prompt_tokens == \
        auto + 1 + len(G.tokenize(oss, "commentary to=functions."))
    # "auto" and unset are the same; "none" leaves the tools out
    assert chat_choice(oss, user, TOOLS2, "auto", max_tokens=1)[-1].usage.prompt_tokens == auto
    assert chat_choice(oss, user, TOOLS2, "none", max_tokens=1)[-1].usage.prompt_tokens == \
        chat_choice(oss, user, None, None, max_tokens=1)[-1].usage.prompt_tokens


@pytest.mark.parametrize("tools,choice,fn,words", [
    (TOOLS, "sometimes", None, 'chat.tool_choice: "sometimes" is not auto, none, required'),
    (TOOLS, "function", None, "chat.tool_choice_function: missing"),
    (TOOLS, "required", "get_weather", "chat.tool_choice_function: given without"),
    (TOOLS, "function", "get_time", 'chat.tool_choice_function: "get_time" is not a function'),
    (None, "required", None, 'chat.tool_choice: "required" needs chat.tools_json'),
    (None, "function", "get_time", 'chat.tool_choice: "function" needs chat.tools_json'),
])
def test_tool_choice_refusals_named(qwen, tools, choice, fn, words):
    c, why = code_of(lambda: chat_choice(qwen, [{"role": "user", "content": "x"}], tools,
                                         choice, fn))
    assert c == grpc.StatusCode.INVALID_ARGUMENT and words in why, (c, why)


def test_tool_choice_hermes(qwen):
    """Qwen2.5's template (Hermes calls): the prompt is python3-jinja2's render followed by
    `<tool_call>\n{"name": "get_time", "arguments": ` and the reply is a call of get_time,
    its arguments what the model wrote (cut by max_tokens: still that tool's call)."""
    user = [{"role": "user", "content": "Time in Oslo?"}]
    text = apply_chat_template(qwen.template, user, TOOLS2)
    want = list(qwen.stub.Tokenize(T.pb.TokenizeRequest(
        text=text + '<tool_call>\n{"name": "get_time", "arguments": ', add_bos=False),
        metadata=ALICE).ids)
    rs = chat_choice(qwen, user, TOOLS2, "function", "get_time", max_tokens=4)
    assert rs[-1].usage.prompt_tokens == len(want)
    ids, _ = T.generate(qwen.stub, ALICE, ids=want, max_tokens=4)
    assert [i for r in rs for i in r.token_ids] == ids
    calls = [r for r in rs if r.recipient]
    assert calls and {r.recipient for r in calls} == {"functions.get_time"}, rs
    assert "".join(r.text for r in rs if not r.recipient) == ""
    assert rs[-1].finish_reason == T.pb.FINISH_REASON_LENGTH


def test_parallel_tool_calls_false(qwen):
    """parallel_tool_calls false travels to the worker (shm's ONE_CALL bit) and changes nothing
    while no call has closed: the same ids as without it, one call of the named tool; without
    tools it is accepted and ignored. (Ending the reply at the call's close, and keeping a
    list's first call, are test_chat_tools' parse_one_call.)"""
    user = [{"role": "user", "content": "Time in Oslo?"}]
    free = chat_choice(qwen, user, TOOLS2, "function", "get_time", max_tokens=4)
    one = chat_choice(qwen, user, TOOLS2, "function", "get_time", max_tokens=4, parallel=False)
    assert [i for r in one for i in r.token_ids] == [i for r in free for i in r.token_ids]
    assert {r.recipient for r in one if r.recipient} == {"functions.get_time"}, one
    assert len({r.tool_call_id for r in one if r.tool_call_id}) == 1, one
    plain = chat_choice(qwen, user, None, None, max_tokens=2, parallel=False)
    assert plain[-1].finish_reason == T.pb.FINISH_REASON_LENGTH


# ---- HTTP: /v1/chat/completions with tools ----
# These need daemon/http.c to read bodies with HTTP_OAI_TOOLS and map tool calls back
# (http_oai.h); until it does, the door refuses `tools` as unsupported and they are skipped
# with that reason (ctest: http_tools_door, SKIP_REGULAR_EXPRESSION).

DOOR_SKIP = "SKIP-DOOR: the HTTP door does not carry tools yet (daemon/http.c)"


def need_door(port, model):
    st, text = http_post(port, {"model": model, "tools": TOOLS, "max_tokens": 1,
                                "messages": [{"role": "user", "content": "x"}]})
    if st == 400 and "not supported by this server" in text and '"tools"' in text:
        print(DOOR_SKIP)
        pytest.skip(DOOR_SKIP)

def http_post(port, body, key="alice-key-0001"):
    req = urllib.request.Request("http://127.0.0.1:%d/v1/chat/completions" % port,
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_http_forced_tool_call(oss):
    fd, _ = G.forced_daemon(oss.model, oss, "tools-call-http", FORCED_CALL)
    try:
        need_door(fd.http_port, json.loads(G.http_models(fd))["data"][0]["id"])
        check_http_call(fd)
        check_openai_sdk(fd)
    finally:
        assert fd.stop() == 0, fd.read_log()
        shutil.rmtree(fd.cfg["model_dir"], ignore_errors=True)  # a 100 MB copy


def check_http_call(fd):
    """The forced call through HTTP: message.tool_calls whole, and streamed as OpenAI streams
    them (index, id, type and name first, then arguments pieces)."""
    model = json.loads(G.http_models(fd))["data"][0]["id"]
    body = {"model": model, "max_tokens": 40, "temperature": 0, "tools": TOOLS,
            "messages": [{"role": "user", "content": "hi"}]}
    st, text = http_post(fd.http_port, body)
    assert st == 200, text
    ch = json.loads(text)["choices"][0]
    assert ch["finish_reason"] == "tool_calls", ch
    calls = ch["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["type"] == "function", calls
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", calls[0]["id"]), calls
    assert ch["message"]["content"] is None
    st, text = http_post(fd.http_port, dict(body, stream=True))
    assert st == 200, text
    deltas, finish = [], None
    for line in text.splitlines():
        if line.startswith("data: {"):
            c = json.loads(line[6:])["choices"]
            if c:
                deltas += c[0].get("delta", {}).get("tool_calls") or []
                finish = c[0].get("finish_reason") or finish
    assert finish == "tool_calls"
    assert deltas and deltas[0]["index"] == 0 and deltas[0]["function"]["name"] == "get_weather"
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", deltas[0]["id"]) and deltas[0]["type"] == "function"
    assert all(d["index"] == 0 and "id" not in d and "name" not in d["function"]
               for d in deltas[1:]), deltas
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city":"Oslo"}'


@pytest.fixture(scope="module")
def hq(qwen):
    """the Qwen-template daemon again, with an HTTP listener"""
    port = T.free_port()
    dm = T.Daemon(qwen.cfg["model_dir"], workers=1,
                  limits={"max_prompt_tokens": 1000, "max_prompt_bytes": 65536},
                  extra={"http": {"listen": "127.0.0.1:%d" % port, "timeout_s": 30}})
    dm.http_port = port
    yield dm
    assert dm.stop() == 0, dm.read_log()


def test_http_round_trip_renders_as_grpc(hq):
    """OpenAI's round trip (tools, an assistant message with tool_calls, the tool's answer)
    reaches the worker as the gRPC chat does: the same prompt, the same greedy reply."""
    model = json.loads(G.http_models(hq))["data"][0]["id"]
    need_door(hq.http_port, model)
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call00001", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "call00001", "content": "21C"}]
    st, text = http_post(hq.http_port, {"model": model, "messages": msgs, "tools": TOOLS,
                                        "max_tokens": 8, "temperature": 0})
    assert st == 200, text
    one = json.loads(text)
    rs = chat(hq, CALL_ROUND_TRIP, TOOLS)
    assert one["usage"]["prompt_tokens"] == rs[-1].usage.prompt_tokens
    assert one["choices"][0]["message"]["content"] == "".join(r.text for r in rs)
    assert "tool_calls" not in one["choices"][0]["message"]
    # tool_choice "none" leaves the tools out of the prompt
    st, text = http_post(hq.http_port, {"model": model, "messages": msgs[:1], "tools": TOOLS,
                                        "tool_choice": "none", "max_tokens": 1})
    assert st == 200 and json.loads(text)["usage"]["prompt_tokens"] == \
        chat(hq, CALL_ROUND_TRIP[:1], max_tokens=1)[-1].usage.prompt_tokens


@pytest.mark.parametrize("extra,param,words", [
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools",
     'tools[0].function.name: "a b" is not'),
    ({"tools": {"x": 1}}, "tools", "tools: must be an array"),
    ({"tool_choice": "required"}, "tool_choice", 'tool_choice: "required" needs tools'),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "tool_choice", '"get_time" is not one of the tools'),
    ({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "x"}]}, "messages",
     '"nope" answers no earlier tool call'),
])
def test_http_bad_tools_400(hq, extra, param, words):
    model = json.loads(G.http_models(hq))["data"][0]["id"]
    need_door(hq.http_port, model)
    body = dict({"model": model, "messages": [{"role": "user", "content": "x"}]}, **extra)
    st, text = http_post(hq.http_port, body)
    err = json.loads(text)["error"]
    assert st == 400 and err["param"] == param and words in err["message"], (st, text)


def test_http_tool_choice_named(hq):
    """tool_choice {"type": "function", ...} through /v1/chat/completions: message.tool_calls
    holds that tool's call (whole and streamed), finish_reason "length" (max_tokens cut it)."""
    model = json.loads(G.http_models(hq))["data"][0]["id"]
    need_door(hq.http_port, model)
    body = {"model": model, "max_tokens": 4, "temperature": 0, "tools": TOOLS2,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "messages": [{"role": "user", "content": "Time in Oslo?"}]}
    st, text = http_post(hq.http_port, body)
    assert st == 200, text
    ch = json.loads(text)["choices"][0]
    calls = ch["message"]["tool_calls"]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_time", ch
    assert ch["finish_reason"] == "length" and not ch["message"]["content"], ch
    st, text = http_post(hq.http_port, dict(body, stream=True))
    assert st == 200, text
    deltas = []
    for line in text.splitlines():
        if line.startswith("data: {"):
            c = json.loads(line[6:])["choices"]
            if c:
                deltas += c[0].get("delta", {}).get("tool_calls") or []
    assert deltas and deltas[0]["function"]["name"] == "get_time", deltas
    assert "".join(d["function"]["arguments"] for d in deltas) == calls[0]["function"]["arguments"]


def check_openai_sdk(fd):
    """openai_sdk.mjs's toolCalls case (the official `openai` npm package) against the forced
    daemon; skipped (pytest's skip) without node/npm or the registry."""
    import subprocess
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import openai_sdk
    folder = os.path.join(T.BUILD, "tests", "http", "npm")
    try:
        openai_sdk.install(folder)
    except SystemExit:
        pytest.skip("the openai npm package cannot be installed (node, npm or the registry)")
    model = json.loads(G.http_models(fd))["data"][0]["id"]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_sdk.mjs")
    shutil.copy(script, os.path.join(folder, "openai_sdk_tools.mjs"))
    env = dict(os.environ, NODE_PATH=os.path.join(folder, "node_modules"),
               CLOCHER_HTTP="http://127.0.0.1:%d/v1" % fd.http_port, CLOCHER_MODEL=model,
               CLOCHER_KEY="alice-key-0001", CLOCHER_KEY_BOB="unused-key-0000",
               CLOCHER_ONLY="toolCalls")
    p = subprocess.run(["node", os.path.join(folder, "openai_sdk_tools.mjs")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "ok toolCalls" in p.stdout, p.stdout + p.stderr
