#!/usr/bin/env python3
"""Drive a running `flowrt serve` with the official `openai` and `ollama` Python clients.

Usage: e2e_clients.py BASE_URL MODEL [--one-constrained]   (e.g. http://127.0.0.1:8001 smollm2:135m)
Exits non-zero on the first failed check; prints one line per check.

--one-constrained keeps, of the structured-output, tool and reasoning checks, one
grammar-constrained answer (`json_object`): those checks exercise the server's grammar and
parsers, which are the same on every backend, and cost minutes on a software Vulkan driver.
The CPU run does them all.
"""
import json
import sys
import urllib.request

import ollama
import openai
from pydantic import BaseModel, Field


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def post_json(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    if len(args) != 2 or any(f != "--one-constrained" for f in flags):
        sys.exit(__doc__)
    base, model = args
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

    models = [m.id for m in oa.models.list()]
    check("openai models.list", model in models, models)
    m = oa.models.retrieve(model)
    check("openai models.retrieve", m.id == model, m)

    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    r = oa.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=16)
    check("openai chat model", r.model == model, r.model)
    check("openai chat content", bool(r.choices[0].message.content), r)
    check("openai chat usage", r.usage.completion_tokens <= 16 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)
    check("openai chat finish", r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)

    parts, usage = [], None
    stream = oa.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=16,
                                        stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
    check("openai chat streaming equals plain", "".join(parts) == r.choices[0].message.content, "".join(parts))
    check("openai streaming usage", usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)

    c = oa.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=8)
    check("openai completions", c.model == model and "Paris" in c.choices[0].text, c)

    try:
        oa.chat.completions.create(model="no-such-model:1b", messages=msgs, max_tokens=4)
        check("openai unknown model -> NotFoundError", False, "no error")
    except openai.NotFoundError as e:
        check("openai unknown model -> NotFoundError", e.status_code == 404, e)

    # n = 2 greedy choices: both the start of the answer above (6 of its tokens).
    r2 = oa.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=6, n=2)
    check("openai chat n=2", [c.index for c in r2.choices] == [0, 1]
          and r2.choices[0].message.content == r2.choices[1].message.content
          and r.choices[0].message.content.startswith(r2.choices[0].message.content)
          and r2.usage.completion_tokens == 12, r2)
    texts = ["", ""]
    for chunk in oa.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=6,
                                            n=2, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    check("openai chat n=2 streaming", texts == [r2.choices[0].message.content] * 2, texts)
    try:
        oa.chat.completions.create(model=model, messages=msgs, n=17)
        check("openai n=17 -> BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("openai n=17 -> BadRequestError", e.status_code == 400, e)

    ids = post_json(f"{base}/tokenize", {"model": model, "content": " Lyon"})["tokens"]
    text = post_json(f"{base}/detokenize", {"model": model, "tokens": ids})["content"]
    check("tokenize/detokenize round trip", text == " Lyon", (ids, text))
    first = post_json(f"{base}/detokenize", {"model": model, "tokens": ids[:1]})["content"]
    c = oa.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=1,
                              logit_bias={str(ids[0]): 100})
    check("openai logit_bias forces a token", c.choices[0].text == first, (c, first))

    ol = ollama.Client(host=base)
    names = [x.model for x in ol.list().models]
    check("ollama list", model in names, names)
    s = ol.show(model)
    check("ollama show", s.details.family == "llama" and bool(s.template) and s.modelinfo.get("general.architecture") == "llama", s.details)
    r = ol.chat(model=model, messages=msgs, options={"temperature": 0, "num_predict": 16})
    check("ollama chat", r.model == model and bool(r.message.content) and r.done, r)
    parts = [p.message.content for p in ol.chat(model=model, messages=msgs, stream=True,
                                                 options={"temperature": 0, "num_predict": 16})]
    check("ollama chat streaming equals plain", "".join(parts) == r.message.content, parts)
    g = ol.generate(model=model, prompt="The capital of France is", raw=True,
                    options={"temperature": 0, "num_predict": 8})
    check("ollama generate", g.model == model and "Paris" in g.response, g)
    try:
        ol.chat(model="no-such-model:1b", messages=msgs)
        check("ollama unknown model -> ResponseError", False, "no error")
    except ollama.ResponseError as e:
        check("ollama unknown model -> ResponseError 404", e.status_code == 404, e)
    ps = ol.ps()
    check("ollama ps", any(x.model == model for x in ps.models), ps)
    agent_checks(oa, ol, model, everything="--one-constrained" not in flags)
    print("all client checks passed")


class City(BaseModel):
    name: str
    country: str
    population: int = Field(ge=0)
    landmarks: list[str] = Field(min_length=1, max_length=3)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
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
        "description": "Current local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def valid_weather_args(args):
    return (isinstance(args, dict) and set(args) == {"city", "unit"} and isinstance(args["city"], str)
            and args["unit"] in ("celsius", "fahrenheit"))


def agent_checks(oa, ol, model, everything=True):
    """Structured outputs, tools and reasoning through the official clients (with `everything`
    false, only one grammar-constrained answer)."""
    ask = [{"role": "user", "content": "Describe Paris as JSON."}]
    r = oa.chat.completions.create(model=model, messages=ask, temperature=1.0, seed=7, max_tokens=300,
                                   response_format={"type": "json_object"})
    check("openai json_object", isinstance(json.loads(r.choices[0].message.content), dict), r)
    if not everything:
        return

    for seed in range(3):
        r = oa.chat.completions.parse(model=model, messages=ask, response_format=City,
                                      temperature=1.0, seed=seed, max_tokens=300)
        m = r.choices[0].message
        check(f"openai parse (Pydantic structured output) seed {seed}",
              isinstance(m.parsed, City) and r.choices[0].finish_reason == "stop", m)

    r = oa.chat.completions.create(model=model, messages=ask, temperature=1.0, seed=7, max_tokens=3,
                                   response_format={"type": "json_object"})
    check("openai json_object cut by max_tokens -> finish length",
          r.choices[0].finish_reason == "length", r.choices[0])

    try:
        oa.chat.completions.create(model=model, messages=ask, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "no-such"}}})
        check("openai unsupported schema -> 400", False, "no error")
    except openai.BadRequestError as e:
        check("openai unsupported schema -> 400", e.status_code == 400, e)

    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = oa.chat.completions.create(model=model, messages=q, tools=[WEATHER, TIME], tool_choice="required",
                                   temperature=1.0, seed=3, max_tokens=200)
    ch = r.choices[0]
    calls = ch.message.tool_calls or []
    check("openai tool_choice required -> tool_calls", ch.finish_reason == "tool_calls" and len(calls) >= 1, ch)
    for c in calls:
        args = json.loads(c.function.arguments)
        ok = c.function.name in ("get_weather", "get_time") and c.id and c.type == "function"
        ok = ok and (valid_weather_args(args) if c.function.name == "get_weather" else set(args) == {"zone"})
        check("openai tool call parses and matches its schema", ok, c)

    with oa.chat.completions.stream(model=model, messages=q, tools=[WEATHER, TIME],
                                    tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                    parallel_tool_calls=False,
                                    temperature=1.0, seed=5, max_tokens=200) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    check("openai streamed named tool call reassembles",
          len(calls) == 1 and calls[0].function.name == "get_weather"
          and valid_weather_args(json.loads(calls[0].function.arguments))
          and final.choices[0].finish_reason == "tool_calls", final.choices[0])

    # Second turn: the tool result goes back through the template; the model answers in text.
    call = calls[0]
    turn2 = q + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "sky": "clear"})},
    ]
    r = oa.chat.completions.create(model=model, messages=turn2, tools=[WEATHER, TIME], tool_choice="none",
                                   temperature=0, max_tokens=40)
    ch = r.choices[0]
    check("openai two-turn tool conversation answers in text",
          bool(ch.message.content) and not ch.message.tool_calls and ch.finish_reason in ("stop", "length"), ch)

    try:
        oa.chat.completions.create(model=model, messages=q, tools=[WEATHER], max_tokens=8,
                                   tool_choice={"type": "function", "function": {"name": "no_such_fn"}})
        check("openai tool_choice naming an unknown function -> 400", False, "no error")
    except openai.BadRequestError as e:
        check("openai tool_choice naming an unknown function -> 400", "tool_choice" in str(e), e)

    try:
        oa.chat.completions.create(model=model, messages=q, max_tokens=8,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        check("openai enable_thinking on a model that cannot think -> 400", False, "no error")
    except openai.BadRequestError as e:
        check("openai enable_thinking on a model that cannot think -> 400", e.status_code == 400, e)

    r = ol.chat(model=model, messages=ask, format=City.model_json_schema(),
                options={"temperature": 1.0, "seed": 11, "num_predict": 300})
    check("ollama format=schema", isinstance(City.model_validate_json(r.message.content), City), r.message)
    r = ol.chat(model=model, messages=ask, format="json", options={"temperature": 0, "num_predict": 300})
    check("ollama format=json", r.done_reason == "stop" and isinstance(json.loads(r.message.content), dict), r)

    r = ol.chat(model=model, messages=q, tools=[WEATHER, TIME], options={"temperature": 0, "num_predict": 200})
    calls = r.message.tool_calls or []
    check("ollama tools: a text answer or well-formed calls",
          (bool(r.message.content) and not calls) or all(
              c.function.name in ("get_weather", "get_time") and isinstance(c.function.arguments, dict)
              for c in calls), r.message)
    try:
        ol.chat(model=model, messages=q, think=True, options={"num_predict": 8})
        check("ollama think on a model that cannot think -> 400", False, "no error")
    except ollama.ResponseError as e:
        check("ollama think on a model that cannot think -> 400", e.status_code == 400, e)


if __name__ == "__main__":
    main()
