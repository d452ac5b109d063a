#!/usr/bin/env python3
"""Drive a running `flowrt serve` with the official `openai` and `ollama` Python clients.

Usage: e2e_clients.py BASE_URL MODEL   (e.g. http://127.0.0.1:8001 smollm2:135m)
Exits non-zero on the first failed check; prints one line per check.
"""
import sys

import ollama
import openai


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def main():
    base, model = sys.argv[1], sys.argv[2]
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

    try:
        oa.chat.completions.create(model=model, messages=msgs, n=2)
        check("openai n=2 -> BadRequestError", False, "no error")
    except openai.BadRequestError as e:
        check("openai n=2 -> BadRequestError", e.status_code == 400, e)

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
    print("all client checks passed")


if __name__ == "__main__":
    main()
