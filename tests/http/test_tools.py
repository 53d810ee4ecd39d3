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
    fd, chain = G.forced_daemon(oss.model, oss, "tools-call",
                                [G.CHANNEL, "commentary to=functions.get_weather ",
                                 G.CONSTRAIN, "json", G.MESSAGE, '{"city":"Oslo"}', G.CALL])
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
