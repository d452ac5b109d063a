#!/usr/bin/env python3
"""Drive a running `flowrt serve --api-key KEY` with the official `anthropic` Python client.

Usage: e2e_anthropic_client.py BASE_URL MODEL KEY   (e.g. http://127.0.0.1:8001 smollm2:135m s3cret)
The client sends the key as `x-api-key` (its normal `api_key=`). Exits non-zero on the first
failed check; prints one line per check.
"""
import json
import sys
import urllib.request

import anthropic


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}: {detail}", flush=True)
        sys.exit(1)
    print(f"ok   {name}", flush=True)


def openai_route_text(base, key, model, system, messages, max_tokens):
    """The greedy answer of /v1/chat/completions to the same conversation (plain HTTP)."""
    body = {
        "model": model,
        "messages": [{"role": "system", "content": system}] + messages,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    req = urllib.request.Request(
        f"{base}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        v = json.load(r)
    return v["choices"][0]["message"]["content"]


def main():
    base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    system = "You are a terse assistant."
    messages = [
        {"role": "user", "content": "Name a fruit."},
        {"role": "assistant", "content": "Apple."},
        {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]},
    ]
    # This client version has no `temperature` argument; greedy decoding goes in the body.
    args = dict(model=model, system=system, messages=messages, max_tokens=16, extra_body={"temperature": 0})

    m = client.messages.create(**args)
    text = "".join(b.text for b in m.content if b.type == "text")
    check("messages.create type/role/model", m.type == "message" and m.role == "assistant" and m.model == model, m)
    check("messages.create id", m.id.startswith("msg_"), m.id)
    check("messages.create text", bool(text) and len(m.content) == 1, m.content)
    check("messages.create stop_reason", m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None, m.stop_reason)
    check("messages.create usage", m.usage.input_tokens > 10 and 0 < m.usage.output_tokens <= 16, m.usage)
    check("messages.create stop_reason agrees with usage",
          (m.stop_reason == "max_tokens") == (m.usage.output_tokens == 16), (m.stop_reason, m.usage))
    expected = openai_route_text(base, key, model, system, messages, 16)
    check("messages.create text equals /v1/chat/completions greedy", text == expected, (text, expected))

    with client.messages.stream(**args) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    check("messages.stream text_stream equals create", streamed == text, (streamed, text))
    final_text = "".join(b.text for b in final.content if b.type == "text")
    check("messages.stream get_final_message text", final_text == text, final.content)
    check("messages.stream get_final_message stop_reason", final.stop_reason == m.stop_reason, final.stop_reason)
    check("messages.stream get_final_message usage",
          final.usage.input_tokens == m.usage.input_tokens and final.usage.output_tokens == m.usage.output_tokens,
          final.usage)

    # A stop sequence from the middle of the answer.
    stop = text[3:5]
    s = client.messages.create(**args, stop_sequences=[stop])
    s_text = "".join(b.text for b in s.content if b.type == "text")
    check("stop_sequences -> stop_reason stop_sequence",
          s.stop_reason == "stop_sequence" and s.stop_sequence == stop and s_text == text[: text.find(stop)],
          (s.stop_reason, s.stop_sequence, s_text))

    n = client.messages.count_tokens(model=model, system=system, messages=messages)
    check("messages.count_tokens", n.input_tokens == m.usage.input_tokens, n)

    try:
        client.messages.create(**{**args, "model": "claude-no-such-model"})
        check("unknown model -> NotFoundError", False, "no error")
    except anthropic.NotFoundError as e:
        check("unknown model -> NotFoundError",
              e.status_code == 404 and e.body["error"]["type"] == "not_found_error" and "claude-no-such-model" in e.message, e)

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    try:
        client.messages.create(**{**args, "messages": [{"role": "user", "content": [image]}]})
        check("image block -> BadRequestError", False, "no error")
    except anthropic.BadRequestError as e:
        check("image block -> BadRequestError",
              e.body["error"]["type"] == "invalid_request_error" and "messages[0].content[0].type" in e.message, e)

    try:
        client.messages.create(**args, tools=[{"name": "f", "input_schema": {"type": "object"}}])
        check("tools -> BadRequestError", False, "no error")
    except anthropic.BadRequestError as e:
        check("tools -> BadRequestError", "tools" in e.message, e)

    bad = anthropic.Anthropic(base_url=base, api_key=key + "x", max_retries=0)
    try:
        bad.messages.create(**args)
        check("wrong key -> AuthenticationError", False, "no error")
    except anthropic.AuthenticationError as e:
        check("wrong key -> AuthenticationError", e.body["error"]["type"] == "authentication_error", e)

    print("all anthropic client checks passed", flush=True)


if __name__ == "__main__":
    main()
