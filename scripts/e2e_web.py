#!/usr/bin/env python3
"""The web chat page in a real browser (Chromium driven by Playwright) against a running
`flowrt serve` started with `--api-key`: the page loads without the key, lists no model until
the key is entered, then lists the model with its sha256; a first answer streams in and shows
time-to-first-token and tokens/s; a long answer is stopped (it stops growing, the page is
ready again, the server cancels the sequence); a further turn sends the whole conversation. Every request the page makes must
go to the server itself.

Usage: e2e_web.py BASE_URL MODEL EMBED_MODEL API_KEY CHROMIUM [SCREENSHOT.png]
(EMBED_MODEL: a served embedding-only model, which the picker must show but not offer.)
Prints `all web chat checks passed` at the end; any failed check raises.
"""

import json
import re
import sys
import time
import urllib.request
from urllib.parse import urlsplit

from playwright.sync_api import sync_playwright

base, model, embed_model, key, chromium = sys.argv[1:6]
screenshot = sys.argv[6] if len(sys.argv) > 6 else None
origin = urlsplit(base).netloc

req = urllib.request.Request(base + "/v1/models", headers={"Authorization": f"Bearer {key}"})
served = {m["id"]: m for m in json.load(urllib.request.urlopen(req))["data"]}
assert model in served and embed_model in served, f"{model}, {embed_model} not in /v1/models: {list(served)}"
sha = served[model]["sha256"]


def cancelled():
    """Sequences the server has cancelled (its Prometheus counter)."""
    req = urllib.request.Request(base + "/metrics", headers={"Authorization": f"Bearer {key}"})
    text = urllib.request.urlopen(req).read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith("flowrt_sequences_total{") and 'finish="cancelled"' in l)


def letters(s):
    """The letters of a text: equal for a Markdown source and its rendering."""
    return re.sub(r"[^A-Za-z]", "", s)


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what, flush=True)


with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    foreign, chats, console_errors = [], [], []
    # Nothing may leave the server: any other host is recorded and refused.
    def route(r):
        if urlsplit(r.request.url).netloc != origin:
            foreign.append(r.request.url)
            r.abort()
        else:
            r.continue_()
    page.route("**/*", route)
    page.on("request", lambda r: chats.append(r) if r.url.endswith("/v1/chat/completions") else None)
    page.on("pageerror", lambda e: console_errors.append(str(e)))

    page.goto(base + "/")
    page.wait_for_function("() => document.getElementById('status').textContent.includes('API key')")
    check(page.locator("#model option").count() == 0, "without the key the page loads and lists no model")

    page.fill("#api-key", key)
    page.dispatch_event("#api-key", "change")
    page.wait_for_function("() => document.body.dataset.state === 'idle'")
    label = page.locator("#model option:checked").inner_text()
    check(model in label and sha[:12] in label, f"model picker shows tag and sha256: {label!r}")
    embed_opt = page.locator(f"#model option[value='{embed_model}']")
    check(embed_opt.is_disabled() and "embedding only" in embed_opt.inner_text(),
          f"the embedding-only model is marked and not offered: {embed_opt.inner_text()!r}")
    page.select_option("#model", model)

    page.fill("#system", "You are a helpful assistant.")
    page.fill("#temperature", "0")
    page.fill("#seed", "7")
    answer = ".msg.assistant >> nth={} >> .content"
    stats = ".msg.assistant >> nth={} >> .stats"

    # Turn 1: a short answer, streamed, with its figures.
    page.fill("#max_tokens", "24")
    page.fill("#prompt", "What is the capital of France?")
    page.click("#send")
    page.wait_for_function("() => document.body.dataset.state === 'idle'", timeout=60000)
    first = page.locator(answer.format(0)).inner_text()
    check(first.strip() != "", f"first answer: {first!r}")
    figures = page.locator(stats.format(0)).inner_text()
    check(re.search(r"TTFT \d+ ms", figures) and re.search(r"\d+ tokens · [\d.]+ tok/s", figures),
          f"time-to-first-token and tokens/s shown: {figures!r}")
    body = json.loads(chats[-1].post_data)
    check(body["stream"] is True and body["stream_options"] == {"include_usage": True}
          and body["temperature"] == 0 and body["seed"] == 7 and body["max_tokens"] == 24,
          "request streams and carries the sampling settings")
    check(chats[-1].headers.get("authorization") == f"Bearer {key}", "request carries the API key")
    check(body["messages"][0] == {"role": "system", "content": "You are a helpful assistant."},
          "system prompt sent first")

    # Turn 2: a long answer, seen growing while it streams, then stopped.
    page.fill("#max_tokens", "900")
    page.fill("#prompt", "Write a very long story about a dragon who learns to cook.")
    page.click("#send")
    page.wait_for_function(
        "() => document.body.dataset.state === 'streaming' && "
        "document.querySelectorAll('.msg.assistant')[1].querySelector('.content').textContent.length > 40",
        timeout=60000)
    seen = len(page.locator(answer.format(1)).inner_text())
    page.wait_for_function(
        f"() => document.querySelectorAll('.msg.assistant')[1].querySelector('.content').textContent.length > {seen}",
        timeout=30000)
    check(True, "the long answer grows while it streams")
    check(page.is_enabled("#stop") and page.is_disabled("#send"), "Stop enabled, Send disabled while streaming")
    cancelled_before = cancelled()
    page.click("#stop")
    page.wait_for_function("() => document.body.dataset.state === 'idle'", timeout=5000)
    at_stop = page.locator(answer.format(1)).inner_text()
    time.sleep(1.5)
    after = page.locator(answer.format(1)).inner_text()
    check(after == at_stop, f"the stopped answer stops growing ({len(after)} characters)")
    check(page.is_enabled("#send") and page.is_disabled("#stop"), "the page is ready again after Stop")
    check("stopped" in page.locator(stats.format(1)).inner_text(), "the stopped answer says so")
    deadline = time.time() + 5
    while cancelled() == cancelled_before and time.time() < deadline:
        time.sleep(0.1)
    check(cancelled() == cancelled_before + 1, "the server cancelled the stopped sequence")

    # Turn 3: the request holds the whole conversation.
    page.fill("#max_tokens", "48")
    page.fill("#prompt", "Give me three facts about Paris as a list.")
    page.click("#send")
    page.wait_for_function("() => document.body.dataset.state === 'idle'", timeout=60000)
    msgs = json.loads(chats[-1].post_data)["messages"]
    check([m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
          and msgs[1]["content"] == "What is the capital of France?"
          and letters(msgs[2]["content"]) == letters(first)
          and msgs[4]["content"] != "",
          "the third request carries both earlier turns")
    check(page.locator(answer.format(2)).inner_text().strip() != "", "third answer")

    # Markdown is rendered, and model text never becomes markup.
    rendered = page.evaluate("renderMarkdown('**b** *i* `c<x>`\\n\\n- one\\n- two\\n\\n```\\n<script>alert(1)</script>\\n```')")
    check(rendered == "<p><strong>b</strong> <em>i</em> <code>c&lt;x&gt;</code></p>"
          "<ul><li>one</li><li>two</li></ul><pre><code>&lt;script&gt;alert(1)&lt;/script&gt;</code></pre>",
          f"markdown rendered and escaped: {rendered}")

    if screenshot:
        page.screenshot(path=screenshot)
        print("screenshot:", screenshot)
    check(not foreign, f"no request left the server: {foreign}")
    check(not console_errors, f"no script errors: {console_errors}")
    browser.close()

print("all web chat checks passed")
