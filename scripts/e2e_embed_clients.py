#!/usr/bin/env python3
"""The official `openai` and `ollama` Python clients against `flowrt serve`'s embedding routes.

Usage: e2e_embed_clients.py BASE_URL EXPECTED.json

EXPECTED.json is `flowrt embed MODEL TEXT... --json` of the same model: each client's vectors
must equal those (the server runs the same engine), and usage must count the same tokens.
Run by crates/flowrt-cli/tests/serve.rs with the pinned clients in .venv-clients.
"""

import json
import sys

import ollama
import openai


def close(a, b, what):
    assert len(a) == len(b), f"{what}: {len(a)} values, expected {len(b)}"
    worst = max(abs(x - y) for x, y in zip(a, b))
    assert worst <= 1e-6, f"{what}: differs by {worst}"


def main() -> int:
    base, expected_path = sys.argv[1], sys.argv[2]
    expected = json.load(open(expected_path))
    want = [d["embedding"] for d in expected["data"]]
    texts = expected["texts"]

    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused")
    model = client.models.list().data[0].id

    # The client asks for base64 unless told otherwise, and decodes it.
    r = client.embeddings.create(model=model, input=texts)
    assert r.model == model, r.model
    for i, d in enumerate(r.data):
        assert d.index == i
        close(d.embedding, want[i], f"openai base64 #{i}")
    assert r.usage.prompt_tokens == expected["tokens"], r.usage
    assert r.usage.total_tokens == expected["tokens"], r.usage

    r = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
    close(r.data[0].embedding, want[0], "openai float")

    try:
        client.embeddings.create(model=model, input=[])
        raise AssertionError("an empty input list was accepted")
    except openai.BadRequestError as e:
        assert e.body and e.body.get("param") == "input", e.body

    o = ollama.Client(host=base)
    r = o.embed(model=model, input=texts)
    for i, v in enumerate(r.embeddings):
        close(v, want[i], f"ollama embed #{i}")
    assert r.prompt_eval_count == expected["tokens"], r.prompt_eval_count
    r = o.embeddings(model=model, prompt=texts[0])
    close(r.embedding, want[0], "ollama embeddings")
    try:
        o.embed(model=model, input=[])
        raise AssertionError("an empty input list was accepted")
    except ollama.ResponseError as e:
        assert e.status_code == 400 and "input" in str(e.error), e

    print("all embedding client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
