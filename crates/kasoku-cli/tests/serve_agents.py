"""The clients agents are built on, against a running `kasoku serve` on Qwen2.5-Coder-0.5B
(started by tests/serve.rs with --api-key): the official `openai` client (a tool round trip
plain and streamed, tool_choice required and named, parallel_tool_calls, structured output
parsed into a Pydantic model, logprobs, fill-in-the-middle), the official `anthropic` client
(messages, streaming, a tool_use/tool_result round trip, count_tokens, the key from x-api-key),
and `langchain-openai` (bind_tools round trip, with_structured_output).

Environment: KASOKU_URL (http://127.0.0.1:PORT), KASOKU_MODEL_ID, KASOKU_API_KEY.
"""

import json
import os
import sys

import anthropic
import openai
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

URL = os.environ["KASOKU_URL"]
MODEL = os.environ["KASOKU_MODEL_ID"]
KEY = os.environ["KASOKU_API_KEY"]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    checks += 1


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
        },
    },
}


def valid_weather_args(arguments):
    args = json.loads(arguments)
    return (
        isinstance(args.get("city"), str)
        and args.get("unit") in ("celsius", "fahrenheit")
        and set(args) == {"city", "unit"}
    )


# ---- openai -------------------------------------------------------------------------------
client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=0, timeout=300)
question = [{"role": "user", "content": "What is the weather like in Paris right now?"}]

# A forced call, then its result answered in text.
r = client.chat.completions.create(
    model=MODEL, messages=question, tools=[WEATHER, TIME], tool_choice="required",
    temperature=0, max_tokens=64,
)
choice = r.choices[0]
check(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason}")
calls = choice.message.tool_calls or []
check(len(calls) >= 1, "a tool call")
check(all(c.function.name in ("get_weather", "get_time") for c in calls), "known tools")
check("<tool_call>" not in (choice.message.content or ""), "no markup in content")
call = calls[0]
history = question + [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
        ],
    },
    {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18, "sky": "clear"}'},
]
r = client.chat.completions.create(
    model=MODEL, messages=history, tools=[WEATHER, TIME], tool_choice="none",
    temperature=0, max_tokens=48,
)
check(r.choices[0].finish_reason in ("stop", "length"), "the tool result is answered")
check(bool(r.choices[0].message.content), "an answer in text")
check(not r.choices[0].message.tool_calls, "no call with tool_choice none")

# A named function, streamed: the deltas rebuild one call with valid arguments.
stream = client.chat.completions.create(
    model=MODEL, messages=question, tools=[WEATHER, TIME],
    tool_choice={"type": "function", "function": {"name": "get_weather"}},
    temperature=0, max_tokens=64, stream=True,
)
name, arguments, content, finish = None, "", "", None
for chunk in stream:
    if not chunk.choices:
        continue
    delta = chunk.choices[0].delta
    content += delta.content or ""
    for tc in delta.tool_calls or []:
        if tc.function and tc.function.name:
            name = tc.function.name
        if tc.function and tc.function.arguments:
            arguments += tc.function.arguments
    finish = chunk.choices[0].finish_reason or finish
check(name == "get_weather", f"the named function, got {name}")
check(valid_weather_args(arguments), f"arguments valid against the schema: {arguments}")
check("<tool_call>" not in content and "{" not in content, f"no markup streamed: {content!r}")
check(finish == "tool_calls", f"streamed finish_reason {finish}")

# parallel_tool_calls false: exactly one call.
r = client.chat.completions.create(
    model=MODEL,
    messages=[{"role": "user", "content": "What is the weather in Paris and in Tokyo?"}],
    tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
    temperature=0, max_tokens=96,
)
check(len(r.choices[0].message.tool_calls or []) == 1, "one call without parallel calls")
check(valid_weather_args(r.choices[0].message.tool_calls[0].function.arguments), "valid args")


# Structured output into a Pydantic model (json_schema, strict).
class Language(BaseModel):
    name: str
    year: int
    typed: bool


parsed = client.chat.completions.parse(
    model=MODEL,
    messages=[{"role": "user", "content": "Describe the Rust programming language briefly."}],
    response_format=Language, temperature=0, max_tokens=96,
)
lang = parsed.choices[0].message.parsed
check(isinstance(lang, Language), f"parsed: {parsed.choices[0].message.content!r}")

# logprobs.
r = client.chat.completions.create(
    model=MODEL, messages=[{"role": "user", "content": "Say hello."}],
    temperature=0, max_tokens=8, logprobs=True, top_logprobs=2,
)
content_lp = r.choices[0].logprobs.content
check(len(content_lp) == r.usage.completion_tokens, "a logprob per token")
check(all(e.logprob <= 0 and len(e.top_logprobs) == 2 for e in content_lp), "logprob entries")

# Fill-in-the-middle.
r = client.completions.create(
    model=MODEL, prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n",
    temperature=0, max_tokens=16,
)
check("return" in r.choices[0].text, f"FIM fills the body: {r.choices[0].text!r}")

# ---- anthropic ----------------------------------------------------------------------------
# (This SDK version has no temperature argument; the API field goes in the body.)
GREEDY = {"extra_body": {"temperature": 0}}
claude = anthropic.Anthropic(base_url=URL, api_key=KEY, max_retries=0, timeout=300)
m = claude.messages.create(
    model=MODEL, max_tokens=32, system="You answer in one short sentence.",
    messages=[{"role": "user", "content": "What is the capital of France?"}], **GREEDY,
)
check(m.type == "message" and m.role == "assistant", "a message")
check(m.content and m.content[0].type == "text" and "Paris" in m.content[0].text,
      f"text block: {m.content}")
check(m.stop_reason in ("end_turn", "max_tokens"), f"stop_reason {m.stop_reason}")
check(m.usage.input_tokens > 0 and m.usage.output_tokens > 0, "usage")

with claude.messages.stream(
    model=MODEL, max_tokens=32, system="You answer in one short sentence.",
    messages=[{"role": "user", "content": "What is the capital of France?"}], **GREEDY,
) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed == m.content[0].text, f"the stream gives the same text: {streamed!r}")
check(final.stop_reason == m.stop_reason, "the stream's stop reason")

tool = {
    "name": "get_weather",
    "description": "The current weather of a city",
    "input_schema": WEATHER["function"]["parameters"],
}
ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
m = claude.messages.create(
    model=MODEL, max_tokens=64, messages=ask, tools=[tool],
    tool_choice={"type": "tool", "name": "get_weather"}, **GREEDY,
)
uses = [b for b in m.content if b.type == "tool_use"]
check(m.stop_reason == "tool_use" and len(uses) == 1, f"tool_use: {m.content}")
check(valid_weather_args(json.dumps(uses[0].input)), f"tool input: {uses[0].input}")
m = claude.messages.create(
    model=MODEL, max_tokens=48, tools=[tool], **GREEDY,
    messages=ask + [
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                      "content": "18 degrees and clear"}]},
    ],
)
check(any(b.type == "text" and b.text for b in m.content), f"the result answered: {m.content}")

count = claude.messages.count_tokens(model=MODEL, messages=ask, tools=[tool])
check(count.input_tokens > 10, f"count_tokens {count.input_tokens}")
try:
    anthropic.Anthropic(base_url=URL, api_key="wrong", max_retries=0).messages.create(
        model=MODEL, max_tokens=4, messages=ask)
    check(False, "a wrong x-api-key is refused")
except anthropic.AuthenticationError:
    check(True, "")

# ---- langchain-openai ---------------------------------------------------------------------
llm = ChatOpenAI(base_url=URL + "/v1", api_key=KEY, model=MODEL, temperature=0,
                 max_tokens=64, max_retries=0, timeout=300)


class get_weather(BaseModel):
    """The current weather of a city"""

    city: str
    unit: str


bound = llm.bind_tools([get_weather], tool_choice="get_weather")
ai = bound.invoke([HumanMessage("What is the weather like in Paris right now?")])
check(len(ai.tool_calls) == 1 and ai.tool_calls[0]["name"] == "get_weather",
      f"langchain tool call: {ai.tool_calls}")
check(isinstance(ai.tool_calls[0]["args"].get("city"), str), "langchain args")
answer = llm.bind_tools([get_weather]).invoke([
    HumanMessage("What is the weather like in Paris right now?"),
    ai,
    ToolMessage("18 degrees and clear", tool_call_id=ai.tool_calls[0]["id"]),
])
check(isinstance(answer.content, str) and answer.content, "langchain answers the result")

structured = llm.with_structured_output(Language).invoke(
    "Describe the Rust programming language briefly.")
check(isinstance(structured, Language), f"with_structured_output: {structured!r}")

print(f"{checks} checks passed")
