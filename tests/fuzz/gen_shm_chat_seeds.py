#!/usr/bin/env python3
"""Seeds for fuzz_shm_chat: shm chat encodings (shm/shm_abi.h "The chat encoding", ABI 5).

Layout: u32 tools_len, u32 tool_choice (bits 0..7 auto 0 / required 1 / function 2, bits 8..31
the function's index), tools JSON; then per message u32 role, channel_len,
recipient_len, content_len, tool_call_id_len, reserved, then channel, recipient, tool_call_id,
content. Run: python3 gen_shm_chat_seeds.py corpus/shm_chat
"""
import os
import struct
import sys

SYSTEM, DEVELOPER, USER, ASSISTANT, TOOL = range(5)
TOOLS = (b'[{"type": "function", "function": {"name": "get_weather", "description": "Weather",'
         b' "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]')


def msg(role, content=b"", channel=b"", recipient=b"", call_id=b"", reserved=0):
    return (struct.pack("<6I", role, len(channel), len(recipient), len(content), len(call_id),
                        reserved) + channel + recipient + call_id + content)


def chat(msgs, tools=b"", choice=0):
    return struct.pack("<II", len(tools), choice) + tools + b"".join(msgs)


def seeds():
    s = {}
    s["user"] = chat([msg(USER, b"Hi!")])
    s["system_user"] = chat([msg(SYSTEM, b"Be brief."), msg(USER, b"Hi")])
    s["tools_round_trip"] = chat([
        msg(USER, b"Weather in Paris?"),
        msg(ASSISTANT, b'{"city": "Paris"}', b"commentary", b"functions.get_weather", b"call_1"),
        msg(TOOL, b"21C", recipient=b"functions.get_weather", call_id=b"call_1"),
        msg(ASSISTANT, b"It is 21C.", b"final")], TOOLS)
    s["parallel_calls"] = chat([
        msg(USER, b"Paris and Oslo?"),
        msg(ASSISTANT, b"Checking both."),
        msg(ASSISTANT, b'{"city": "Paris"}', recipient=b"functions.get_weather", call_id=b"a"),
        msg(ASSISTANT, b'{"city": "Oslo"}', recipient=b"functions.get_weather", call_id=b"b"),
        msg(TOOL, b"21C", recipient=b"get_weather", call_id=b"a"),
        msg(TOOL, b"3C", recipient=b"get_weather", call_id=b"b")], TOOLS)
    s["analysis"] = chat([msg(USER, b"2+2"), msg(ASSISTANT, b"think", b"analysis"),
                          msg(DEVELOPER, b"x")])
    s["choice_required"] = chat([msg(USER, b"Weather?")], TOOLS, 1)
    s["choice_function"] = chat([msg(USER, b"Weather?")], TOOLS, 2)
    s["choice_function_far"] = chat([msg(USER, b"Weather?")], TOOLS, 2 | 7 << 8)
    # refusals
    s["bad_empty"] = chat([])
    s["bad_choice"] = chat([msg(USER, b"x")], TOOLS, 3)
    s["bad_choice_no_tools"] = chat([msg(USER, b"x")], choice=1)
    s["bad_choice_index"] = chat([msg(USER, b"x")], TOOLS, 1 | 1 << 8)
    s["bad_msg_reserved"] = chat([msg(USER, b"x", reserved=2)])
    s["bad_tools_nul"] = chat([msg(USER, b"x")], b"[\0]")
    s["bad_tools_len"] = struct.pack("<II", 1000, 0) + msg(USER, b"x")
    s["bad_user_call_id"] = chat([msg(USER, b"x", call_id=b"c")])
    s["bad_tool_no_name"] = chat([msg(TOOL, b"x")])
    s["bad_call_id_byte"] = chat([msg(TOOL, b"x", recipient=b"f", call_id=b"c d")])
    s["bad_role"] = chat([msg(9, b"x")])
    s["bad_cut"] = chat([msg(USER, b"hello")])[:-2]
    s["bad_content_nul"] = chat([msg(USER, b"a\0b")])
    return s


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                               "corpus", "shm_chat")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(out, name + ".bin"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
