#!/usr/bin/env python3
"""Make the tool-calling chat template goldens that crates/flowrt-text is tested against.

Writes into tests/fixtures/text/ (repository root):

  templates/<model>.jinja   real chat templates of tool-calling / reasoning models
  templates/README.md       where they come from
  tool_templates.json       renders of conversations with tools, tool calls, tool results and
                            reasoning, made by transformers' apply_chat_template(tokenize=False)

Setup (the same venv as scripts/make_text_goldens.py; no torch needed):

  python3.11 -m venv .venv-text
  .venv-text/bin/pip install transformers==5.24.0 tokenizers jinja2
  .venv-text/bin/python scripts/make_tool_template_goldens.py [--sdist PATH]

Where the templates come from
-----------------------------
llama.cpp keeps copies of the chat templates of many models (the models' own
`tokenizer_config.json` chat_template, unchanged) under `models/templates/`, and the PyPI sdist
of llama-cpp-python vendors llama.cpp. The script fetches that sdist from PyPI (the file URL is
looked up with PyPI's JSON "simple" API), checks its sha256 and extracts only the templates named
in TEMPLATES. `--sdist` uses an already downloaded copy instead (the sha256 is still checked).

What is rendered
----------------
Each case is `apply_chat_template(messages, tools=tools, add_generation_prompt=..., **kwargs,
tokenize=False)` on a PreTrainedTokenizerFast whose only special tokens are the template's BOS and
EOS texts (BOS_EOS below), so the template sees `bos_token`/`eos_token` and nothing else from the
tokenizer. transformers drops message keys whose value is None and adds `thinking` next to
`reasoning_content`; the Rust side must do the same. A case whose render raises records the
exception's type and message instead of `expected`.

Llama 3.2's template prints today's date through `strftime_now` unless `date_string` is given, so
every Llama case passes a fixed `date_string` (no goldens depend on the clock).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import io
import json
import sys
import tarfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "text"
TEMPLATE_DIR = OUT / "templates"

SDIST_NAME = "llama_cpp_python-0.3.16.tar.gz"
SDIST_SHA256 = "34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6"
SDIST_TEMPLATE_DIR = "llama_cpp_python-0.3.16/vendor/llama.cpp/models/templates/"
PYPI_SIMPLE = "https://pypi.org/simple/llama-cpp-python/"

TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct",
    "Qwen-Qwen3-0.6B",
    "meta-llama-Llama-3.1-8B-Instruct",
    "meta-llama-Llama-3.2-3B-Instruct",
    "mistralai-Mistral-Nemo-Instruct-2407",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
]

# The texts of each model's BOS and EOS tokens.
BOS_EOS = {
    "Qwen-Qwen2.5-7B-Instruct": ("<|endoftext|>", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("<|endoftext|>", "<|im_end|>"),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

# ----------------------------------------------------------------------------------------------
# Fetching the templates
# ----------------------------------------------------------------------------------------------


def sdist_url() -> str:
    req = urllib.request.Request(PYPI_SIMPLE, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        index = json.load(r)
    for f in index["files"]:
        if f["filename"] == SDIST_NAME:
            if f.get("hashes", {}).get("sha256") not in (None, SDIST_SHA256):
                sys.exit(f"PyPI lists a different sha256 for {SDIST_NAME}: {f['hashes']}")
            return f["url"]
    sys.exit(f"{SDIST_NAME} is not listed at {PYPI_SIMPLE}")


def fetch_templates(sdist: Path | None) -> dict[str, str]:
    if sdist is not None:
        data = sdist.read_bytes()
    else:
        url = sdist_url()
        print(f"downloading {url}", file=sys.stderr)
        with urllib.request.urlopen(url, timeout=600) as r:
            data = r.read()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SDIST_SHA256:
        sys.exit(f"{SDIST_NAME}: sha256 {digest}, expected {SDIST_SHA256}")
    out = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for name in TEMPLATES:
            member = tar.getmember(SDIST_TEMPLATE_DIR + name + ".jinja")
            f = tar.extractfile(member)
            assert f is not None
            out[name] = f.read().decode("utf-8")
    return out


def write_templates(templates: dict[str, str]) -> None:
    TEMPLATE_DIR.mkdir(parents=True, exist_ok=True)
    for name, text in templates.items():
        # Bytes as in the sdist: no newline added or removed.
        (TEMPLATE_DIR / f"{name}.jinja").write_bytes(text.encode("utf-8"))
    listing = "\n".join(f"- `{n}.jinja`" for n in TEMPLATES)
    readme = f"""# Real chat templates (test fixtures)

These are the chat templates of the models named in the file names (each model's own
`chat_template`, model data). They were taken unchanged from the copies llama.cpp keeps under
`models/templates/`, as vendored in the PyPI source distribution

    {SDIST_NAME}
    sha256 {SDIST_SHA256}
    path   {SDIST_TEMPLATE_DIR}

by `scripts/make_tool_template_goldens.py`, which also renders them with HF transformers into
`../tool_templates.json`.

{listing}
"""
    (TEMPLATE_DIR / "README.md").write_text(readme, encoding="utf-8")


# ----------------------------------------------------------------------------------------------
# Conversations
# ----------------------------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — température en °C ou °F",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City and country, e.g. Zürich, CH"},
                    "unit": {
                        "type": "string",
                        "enum": ["celsius", "fahrenheit"],
                        "description": "Temperature unit",
                    },
                },
                "required": ["location"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Search flights between two airports",
            "parameters": {
                "type": "object",
                "properties": {
                    "route": {
                        "type": "object",
                        "description": "Origin and destination IATA codes",
                        "properties": {
                            "from": {"type": "string"},
                            "to": {"type": "string"},
                        },
                        "required": ["from", "to"],
                    },
                    "dates": {
                        "type": "array",
                        "description": "Travel dates (YYYY-MM-DD)",
                        "items": {"type": "string"},
                    },
                    "max_price": {"type": "number", "description": "Upper price bound in EUR"},
                    "direct_only": {"type": "boolean", "description": "Only non-stop flights"},
                },
                "required": ["route"],
            },
        },
    },
]

CALL_WEATHER = {
    "id": "a1b2c3d4e",
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"location": "Zürich, CH", "unit": "celsius"}},
}
CALL_FLIGHTS = {
    "id": "f5g6h7i8j",
    "type": "function",
    "function": {
        "name": "search_flights",
        "arguments": {
            "route": {"from": "ZRH", "to": "LIS"},
            "dates": ["2025-03-14", "2025-03-21"],
            "max_price": 250.5,
            "direct_only": True,
        },
    },
}

SYSTEM = {"role": "system", "content": "You are a travel assistant. Answer briefly."}
USER1 = {"role": "user", "content": "What's the weather in Zürich, and are there flights to Lisbon?"}


def tool_result(call: dict, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call["id"], "name": call["function"]["name"], "content": content}


CONVERSATIONS = {
    "plain": {"tools": False, "messages": [
        {"role": "user", "content": "Hello! Who are you?"},
        {"role": "assistant", "content": "  I am an assistant.  "},
        {"role": "user", "content": "Tell me a joke."},
    ]},
    "plain_system": {"tools": False, "messages": [
        SYSTEM,
        {"role": "user", "content": "Hi"},
    ]},
    "tools_first_turn": {"tools": True, "messages": [SYSTEM, USER1]},
    "tools_no_system": {"tools": True, "messages": [USER1]},
    "one_call": {"tools": True, "messages": [
        SYSTEM,
        USER1,
        {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER]},
        tool_result(CALL_WEATHER, '{"temperature": 21.5, "sky": "sunny"}'),
        {"role": "assistant", "content": "It is 21.5 °C and sunny in Zürich."},
        {"role": "user", "content": "Thanks! And the flights?"},
    ]},
    "one_call_no_content_key": {"tools": True, "messages": [
        USER1,
        {"role": "assistant", "tool_calls": [CALL_WEATHER]},
        tool_result(CALL_WEATHER, '{"temperature": 21.5}'),
    ]},
    "one_call_content_none": {"tools": True, "messages": [
        USER1,
        {"role": "assistant", "content": None, "tool_calls": [CALL_WEATHER]},
        tool_result(CALL_WEATHER, '{"temperature": 21.5}'),
    ]},
    "one_call_with_text": {"tools": True, "messages": [
        USER1,
        {"role": "assistant", "content": "Let me check.", "tool_calls": [CALL_WEATHER]},
        tool_result(CALL_WEATHER, "21.5 C"),
    ]},
    "parallel_calls": {"tools": True, "messages": [
        SYSTEM,
        USER1,
        {"role": "assistant", "content": "", "tool_calls": [CALL_WEATHER, CALL_FLIGHTS]},
        tool_result(CALL_WEATHER, '{"temperature": 21.5}'),
        tool_result(CALL_FLIGHTS, '[{"flight": "LX2086", "price": 199}]'),
        {"role": "assistant", "content": "21.5 °C; flight LX2086 costs 199 EUR."},
        {"role": "user", "content": "Book it."},
    ]},
    "bad_call_id": {"tools": True, "messages": [
        USER1,
        {"role": "assistant", "content": "", "tool_calls": [dict(CALL_WEATHER, id="call_abc")]},
        tool_result(dict(CALL_WEATHER, id="call_abc"), "21"),
    ]},
    "reasoning_history": {"tools": False, "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two.\nThat is four."},
        {"role": "user", "content": "And 3+3?"},
    ]},
    "reasoning_last_assistant": {"tools": False, "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "\nTwo plus two.\n"},
    ]},
    "think_in_content": {"tools": False, "messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "Sure?"},
    ]},
    "reasoning_tool_loop": {"tools": True, "messages": [
        USER1,
        {"role": "assistant", "content": "", "reasoning_content": "Need the weather.",
         "tool_calls": [CALL_WEATHER]},
        tool_result(CALL_WEATHER, '{"temperature": 21.5}'),
    ]},
}

# Extra template variables per template (each entry: a name and the kwargs).
LLAMA_DATE = {"date_string": "14 Mar 2025"}
KWARGS = {
    "meta-llama-Llama-3.1-8B-Instruct": [("", LLAMA_DATE),
                                         ("tools_in_system", dict(LLAMA_DATE, tools_in_user_message=False))],
    "meta-llama-Llama-3.2-3B-Instruct": [("", LLAMA_DATE),
                                         ("tools_in_system", dict(LLAMA_DATE, tools_in_user_message=False))],
    "Qwen-Qwen3-0.6B": [("", {}), ("thinking_on", {"enable_thinking": True}),
                        ("thinking_off", {"enable_thinking": False})],
}


def render_all(templates: dict[str, str]) -> list[dict]:
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    cases = []
    for tname in TEMPLATES:
        bos, eos = BOS_EOS[tname]
        base = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
        tok = PreTrainedTokenizerFast(tokenizer_object=base, bos_token=bos, eos_token=eos,
                                      chat_template=templates[tname])
        for cname, conv in CONVERSATIONS.items():
            for kname, kwargs in KWARGS.get(tname, [("", {})]):
                for add_gen in (False, True):
                    messages = copy.deepcopy(conv["messages"])
                    tools = copy.deepcopy(TOOLS) if conv["tools"] else None
                    case = {
                        "template": tname,
                        "conversation": cname,
                        "name": cname + (f"/{kname}" if kname else ""),
                        "add_generation_prompt": add_gen,
                        "kwargs": kwargs,
                    }
                    try:
                        case["expected"] = tok.apply_chat_template(
                            messages, tools=tools, add_generation_prompt=add_gen, tokenize=False, **kwargs)
                    except Exception as exc:  # the template raised: the Rust render must fail too
                        case["error_type"] = type(exc).__name__
                        case["error"] = str(exc)
                    cases.append(case)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", type=Path, help=f"a local copy of {SDIST_NAME}")
    args = ap.parse_args()

    templates = fetch_templates(args.sdist)
    write_templates(templates)
    cases = render_all(templates)
    n_err = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} renders ({n_err} expected errors)", file=sys.stderr)
    golden = {
        "reference": "transformers apply_chat_template(messages, tools=..., add_generation_prompt=..., "
                     "**kwargs, tokenize=False)",
        "transformers_version": __import__("transformers").__version__,
        "jinja2_version": __import__("jinja2").__version__,
        "templates_source": {"sdist": SDIST_NAME, "sha256": SDIST_SHA256, "path": SDIST_TEMPLATE_DIR},
        "templates": {n: {"file": f"templates/{n}.jinja", "bos_token": BOS_EOS[n][0], "eos_token": BOS_EOS[n][1]}
                      for n in TEMPLATES},
        "tools": TOOLS,
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    path = OUT / "tool_templates.json"
    path.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
