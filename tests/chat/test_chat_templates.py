"""Chat templates rendered by Clocher's Jinja2 interpreter (worker/tok/jinja*.c, through the
jinja_render driver) compared byte for byte with Debian's python3-jinja2 rendering them the way
Hugging Face's apply_chat_template does (transformers' render_jinja_template): an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, a json.dumps
`tojson`, and the raise_exception / strftime_now globals; variables messages, tools (None when
absent), documents=None, add_generation_prompt and the tokenizer's special tokens.

The eight templates of ../shared/fixtures/chat-templates (read from CLOCHER_FIXTURES, never
copied here) plus Llama 2's and Zephyr's (TinyLlama-Chat), written below from their model cards.
Where jinja2 raises (raise_exception, an error), the interpreter must fail too, with the
template's message.
"""
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1785000000  # 2026-07-25: strftime_now's clock on both sides
os.environ["TZ"] = "UTC"

FIXTURES = os.environ.get("CLOCHER_FIXTURES", os.path.join(os.path.dirname(__file__), "../../../shared/fixtures"))
BUILD = os.environ.get("CLOCHER_BUILD_DIR", os.path.join(os.path.dirname(__file__), "../../build/release"))
DRIVER = os.path.join(BUILD, "tests", "chat", "jinja_render")
TPL_DIR = os.path.join(FIXTURES, "chat-templates")

# meta-llama/Llama-2-7b-chat-hf tokenizer_config.json chat_template
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
# TinyLlama/TinyLlama-1.1B-Chat-v1.0 (Zephyr's format) tokenizer_config.json chat_template
ZEPHYR = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"
)

TEMPLATES = {
    "llama-3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "llama-3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", None, "<|im_end|>"),
    "phi-3.5": ("microsoft-Phi-3.5-mini-instruct.jinja", "<s>", "<|endoftext|>"),
    "mistral-nemo": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>"),
    "gpt-oss": ("openai-gpt-oss-120b.jinja", "<|startoftext|>", "<|return|>"),
    "gemma-2": ("google-gemma-2-2b-it.jinja", "<bos>", "<eos>"),
    "deepseek-r1": ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "llama-2": (LLAMA2, "<s>", "</s>"),
    "zephyr": (ZEPHYR, "<s>", "</s>"),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "integer", "description": "Forecast days", "default": 1},
            "hourly": {"type": "boolean", "nullable": True},
            "tags": {"type": "array", "items": {"type": "string"}},
            "ratio": {"type": "number", "default": 0.5},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                      "required": ["lat"]},
        }, "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "now", "description": "The time now", "parameters": {"type": "object", "properties": {}}}},
]

SYS = {"role": "system", "content": "You are a helpful assistant.  "}
U1 = {"role": "user", "content": "  Hello, 世界! What is 2+2?\n"}
A1 = {"role": "assistant", "content": "2+2 is 4. \"Quoted\" and {braces} 🙂"}
U2 = {"role": "user", "content": "And the weather in Paris?"}
CALL_D = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": {"location": "Paris", "days": 2}}}]}
CALL_S = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\", \"days\": 2}"}}]}
RES = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"temp\": 21, \"sky\": \"clear\"}"}
A2 = {"role": "assistant", "content": "It is 21°C and clear in Paris."}
THINK = {"role": "assistant", "content": "4.", "thinking": "Add two and two."}

CONVERSATIONS = {
    "user": ([U1], None),
    "system_user": ([SYS, U1], None),
    "multi_turn": ([SYS, U1, A1, U2], None),
    "multi_turn_nosys": ([U1, A1, U2], None),
    "ends_assistant": ([SYS, U1, A1], None),
    "thinking": ([U1, THINK], None),
    "tools_dict_args": ([SYS, U2, CALL_D, RES, A2], TOOLS),
    "tools_str_args": ([U2, CALL_S, RES], TOOLS),
    "tools_no_calls": ([SYS, U1], TOOLS),
    "bad_alternation": ([U1, U2], None),
}


class RaisedByTemplate(Exception):
    pass


def jinja2_render(src, variables, now=NOW):
    """apply_chat_template's rendering (transformers.utils.chat_template_utils)."""
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src).render(**variables)


def c_render(src, variables):
    assert os.path.exists(DRIVER), f"{DRIVER} not built (cmake --build ... --target jinja_render)"
    with tempfile.TemporaryDirectory() as d:
        tp, vp = os.path.join(d, "t.jinja"), os.path.join(d, "v.json")
        with open(tp, "w", encoding="utf-8") as f:
            f.write(src)
        with open(vp, "w", encoding="utf-8") as f:
            json.dump(variables, f, ensure_ascii=False)
        env = dict(os.environ, CLOCHER_JINJA_NOW=str(NOW), TZ="UTC")
        return subprocess.run([DRIVER, tp, vp], capture_output=True, env=env, timeout=60)


def template_text(name):
    src = TEMPLATES[name][0]
    if src.endswith(".jinja"):
        path = os.path.join(TPL_DIR, src)
        assert os.path.exists(path), f"fixture {path} missing (CLOCHER_FIXTURES={FIXTURES})"
        with open(path, encoding="utf-8") as f:
            return f.read()
    return src


CASES = [(t, c, g) for t in TEMPLATES for c in CONVERSATIONS for g in (True, False)]


@pytest.mark.parametrize("tpl,conv,gen", CASES, ids=[f"{t}-{c}-{'gen' if g else 'nogen'}" for t, c, g in CASES])
def test_same_bytes_as_jinja2(tpl, conv, gen):
    src = template_text(tpl)
    messages, tools = CONVERSATIONS[conv]
    _, bos, eos = TEMPLATES[tpl]
    variables = {"messages": messages, "tools": tools, "documents": None,
                 "add_generation_prompt": gen, "bos_token": bos, "eos_token": eos}
    try:
        want = jinja2_render(src, json.loads(json.dumps(variables))).encode("utf-8")
        raised = None
    except RaisedByTemplate as ex:
        want, raised = None, ("raise", str(ex))
    except jinja2.TemplateError as ex:
        want, raised = None, ("error", str(ex))
    except TypeError as ex:
        want, raised = None, ("error", str(ex))
    r = c_render(src, variables)
    assert r.returncode != 2, f"template refused at load: {r.stderr.decode()}"
    if raised is None:
        assert r.returncode == 0, f"jinja2 rendered, clocher failed: {r.stderr.decode()}"
        assert r.stdout == want, f"differs from jinja2:\n--- jinja2\n{want!r}\n--- clocher\n{r.stdout!r}"
    else:
        assert r.returncode == 3, f"jinja2 raised {raised}, clocher rendered {r.stdout!r}"
        if raised[0] == "raise":
            assert raised[1] in r.stderr.decode(), r.stderr.decode()


def test_all_fixture_templates_covered():
    """Every template of the fixture folder is in TEMPLATES (a new one is not silently skipped)."""
    assert os.path.isdir(TPL_DIR), f"fixtures missing: {TPL_DIR}"
    have = {v[0] for v in TEMPLATES.values()}
    for f in os.listdir(TPL_DIR):
        assert f in have, f"{f} is not compared"


EXPRESSIONS = [
    "{{ [1, 'a', {'b': none, 'c': true}, 1.5, 1e20, 0.1, 1e-5, -0.0] }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 1 == 1.0 }} {{ true == 1 }}",
    "{{ 'abcdef'[1:4] }}{{ 'abcdef'[::-2] }}{{ [1,2,3,4][-2:] }}{{ 'héllo'[1] }}{{ [1,2][5] }}|",
    "{{ '  x y  '|trim }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'abc'.startswith(('x','a')) }}",
    "{{ {'b': 1, 'a': [1, {}]}|tojson }}{{ {'b': 1, 'a': [1, {}]}|tojson(indent=2) }}{{ 'é\\n\"'|tojson }}",
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}{{ [1,2]|tojson(separators=(',', ':')) }}",
    "{% for k, v in {'x': 1, 'y': 2}.items() %}{{ loop.index }}{{ k }}={{ v }}{{ ',' if not loop.last }}{% endfor %}",
    "{% for i in range(5) if i is odd %}{{ i }}{{ loop.length }}{% else %}none{% endfor %}",
    "{% for i in [] %}x{% else %}empty{% endfor %}{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% set ns = namespace(n=0) %}{% for i in range(4) %}{% set ns.n = ns.n + i %}{% set local = i %}{% endfor %}{{ ns.n }}{{ local is defined }}",
    "{% macro m(a, b='dflt') %}<{{ a }}|{{ b }}>{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}{{ m('x', 'y')|length }}",
    "{{ ['a','b','c']|join('-') }}{{ [{'r':'u'},{'r':'a'}]|selectattr('r','equalto','u')|list|length }}{{ [1,2,3]|reject('equalto',2)|list }}",
    "{{ x|default('d') }}{{ none|default('d') }}{{ ''|default('d', true) }}{{ 'Abc'|upper }}{{ 'ABC'|lower }}{{ 'aBC'|capitalize }}",
    "{{ 'a' ~ 1 ~ none ~ true }}{{ 'a' in 'cat' }}{{ 3 not in [1,2] }}{{ 'k' in {'k': 1} }}{{ 1 if false }}|{{ 2 if false else 3 }}",
    "{%- if true -%}\n   x   \n{%- endif -%}\n  {% if true %}\n  y\n  {% endif %}\n{# c #}\n  {#- c2 -#}  z  {%+ if true %}w{% endif %}\n",
    "{{ {'a': 1}.get('a') }}{{ {'a': 1}.get('b', 5) }}{{ {'a': 1}.keys()|list }}{{ {'a':1}|items|list|length }}{{ 'x'.replace('x', 'yy') }}",
    "{{ 1 is number }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ u is defined }}{{ none is none }}{{ 3 is divisibleby 3 }}",
    "{{ 'a\\tb\\u00e9\\x41' }}{{ \"q'uote\" }}{{ [\"it's\"] }}{{ 'x' 'y' }}",
    "{{ -(3) }}{{ +3 }}{{ not 0 }}{{ (1, 2)|length }}{{ [] or 'e' }}{{ 'a' and 'b' }}{{ 10 - 2 - 3 }}",
    "{{ strftime_now('%Y-%m-%d %H:%M %b %d') }}",
    "{{ dict(a=1, b=[2]) }}{{ dict(a=1).a }}{% macro later() %}L{% endmacro %}{{ later() }}",
    "{{ raise_exception('boom') }}",
    "{{ u.attr }}",
]


@pytest.mark.parametrize("src", EXPRESSIONS, ids=range(len(EXPRESSIONS)))
def test_constructs_same_as_jinja2(src):
    try:
        want = jinja2_render(src, {}).encode("utf-8")
        raised = False
    except (RaisedByTemplate, jinja2.TemplateError, TypeError):
        want, raised = None, True
    r = c_render(src, {})
    if raised:
        assert r.returncode == 3, f"jinja2 raised, clocher: rc {r.returncode} {r.stdout!r} {r.stderr!r}"
    else:
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == want, f"\n--- jinja2\n{want!r}\n--- clocher\n{r.stdout!r}"


# ---- the worker's own messages: a chat as gRPC/HTTP carry it (the shm chat encoding) rendered
# by the worker (chat_render driver: chat_render_jinja_text) must give the bytes
# apply_chat_template gives for the same conversation in OpenAI's shape ----

CHAT_DRIVER = os.path.join(BUILD, "tests", "chat", "chat_render")
CALL2 = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call12345", "type": "function",
     "function": {"name": "get_weather", "arguments": {"location": "Paris"}}},
    {"id": "call67890", "type": "function",
     "function": {"name": "get_weather", "arguments": {"location": "Oslo", "days": 2}}}]}
RES2 = {"role": "tool", "tool_call_id": "call67890", "name": "get_weather", "content": "3C"}
RES1 = {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "21C"}

TOOL_CONVERSATIONS = {
    "call_answer_reply": [SYS, U2, CALL_D, RES, A2],
    "call_answer": [U2, CALL_D, RES],
    "parallel_calls": [U2, CALL2, RES1, RES2],
    "tools_no_calls": [SYS, U1],
}
# the templates with tool blocks (gpt-oss renders through harmony in the worker: test_chat_model)
TOOL_TEMPLATES = ["llama-3.1", "llama-3.2", "qwen2.5", "mistral-nemo"]


def to_wire(messages):
    """OpenAI messages as the HTTP door turns them into gRPC's ChatMessage (daemon/http_oai.c):
    one assistant message per tool call (recipient functions.NAME, the arguments' JSON text,
    tool_call_id), a tool answer with its tool's name as recipient."""
    out = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            if m.get("content"):
                out.append({"role": "assistant", "content": m["content"]})
            for c in m["tool_calls"]:
                args = c["function"]["arguments"]
                out.append({"role": "assistant", "recipient": "functions." + c["function"]["name"],
                            "tool_call_id": c["id"],
                            "content": args if isinstance(args, str) else json.dumps(args)})
        elif m["role"] == "tool":
            out.append({"role": "tool", "recipient": "functions." + m["name"],
                        "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


TOOL_CASES = [(t, c) for t in TOOL_TEMPLATES for c in TOOL_CONVERSATIONS]


@pytest.mark.parametrize("tpl,conv", TOOL_CASES, ids=[f"{t}-{c}" for t, c in TOOL_CASES])
def test_worker_tool_messages_same_as_apply_chat_template(tpl, conv):
    assert os.path.exists(CHAT_DRIVER), f"{CHAT_DRIVER} not built"
    src = template_text(tpl)
    _, bos, eos = TEMPLATES[tpl]
    messages = TOOL_CONVERSATIONS[conv]
    # the worker passes tool answers' keys in its own order and parses arguments into objects
    variables = {"messages": messages, "tools": TOOLS, "documents": None,
                 "add_generation_prompt": True, "bos_token": bos, "eos_token": eos}
    try:  # the worker renders with the real clock (strftime_now: Llama 3.2's date line)
        want = jinja2_render(src, json.loads(json.dumps(variables)), time.time()).encode("utf-8")
    except RaisedByTemplate as ex:
        want = ("raise", str(ex))
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "chat.ie.json"), "w", encoding="utf-8") as f:
            json.dump({"chat_template": src}, f)
        cp = os.path.join(d, "chat.json")
        with open(cp, "w", encoding="utf-8") as f:
            json.dump({"tools": TOOLS, "messages": to_wire(messages), "bos_token": bos,
                       "eos_token": eos}, f, ensure_ascii=False)
        env = dict(os.environ, CLOCHER_JINJA_NOW=str(NOW), TZ="UTC")
        r = subprocess.run([CHAT_DRIVER, d, cp], capture_output=True, env=env, timeout=60)
    if isinstance(want, tuple):
        assert r.returncode == 3 and want[1] in r.stderr.decode(), (want, r.stderr.decode())
        return
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout == want, f"differs from apply_chat_template:\n--- jinja2\n{want!r}\n--- worker\n{r.stdout!r}"
