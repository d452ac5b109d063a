//! What agent apps send, through the routes: structured output, tools and `tool_choice`,
//! reasoning switches, multi-turn tool conversations.
//!
//! - SmolLM2 (its template has no tools: flowrt's Generic format) over HTTP;
//! - the tiny random-weight Qwen3 checkpoint with the real Qwen3 chat template (Hermes calls,
//!   `<think>` reasoning) over HTTP: the constraint alone makes its answer a valid call;
//! - `plan_chat` with the real Qwen3, Llama 3.1 and Mistral Nemo templates, and the `Shaper`
//!   over synthetic streams.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::StatusCode;
use axum::Router;
use common::*;
use flowrt_engine::tools::ToolChoice;
use flowrt_engine::{EngineOptions, LoadedModel};
use flowrt_server::agent::{parse_tools, plan_chat, ChatInput, OutputShape, Piece, Shaped, Shaper};
use flowrt_server::{app, AppState, ModelSpec, ServerConfig};
use flowrt_text::{ChatMessage, ChatTemplate, FunctionCall, ReasoningFormat, ToolCall, ToolFormat};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Shared pieces

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn template_src(file: &str) -> String {
    let p = repo().join("tests/fixtures/text/templates").join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

const QWEN3: &str = "Qwen-Qwen3-0.6B.jinja";
const LLAMA31: &str = "meta-llama-Llama-3.1-8B-Instruct.jinja";
const MISTRAL: &str = "mistralai-Mistral-Nemo-Instruct-2407.jinja";

/// Two tools whose arguments a test can check by hand.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["city", "unit"],
                "additionalProperties": false
            }
        }},
        {"type": "function", "function": {
            "name": "get_time",
            "description": "Current time in a time zone",
            "parameters": {
                "type": "object",
                "properties": {"zone": {"type": "string", "maxLength": 12}},
                "required": ["zone"],
                "additionalProperties": false
            }
        }}
    ])
}

/// Panics unless `args` is valid against the schema of `name` in [`tools`].
fn check_args(name: &str, args: &Value) {
    let o = args
        .as_object()
        .unwrap_or_else(|| panic!("{name}: arguments {args} are not an object"));
    match name {
        "get_weather" => {
            let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
            keys.sort();
            assert_eq!(keys, ["city", "unit"], "{args}");
            assert!(
                ["Paris", "London", "Tokyo"].contains(&o["city"].as_str().unwrap_or("")),
                "{args}"
            );
            assert!(
                ["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap_or("")),
                "{args}"
            );
        }
        "get_time" => {
            assert_eq!(o.len(), 1, "{args}");
            let z = o["zone"].as_str().unwrap_or_else(|| panic!("{args}"));
            assert!(z.chars().count() <= 12, "{args}");
        }
        other => panic!("a call of an unknown function {other:?}"),
    }
}

fn body(messages: Value, extra: Value) -> Value {
    let mut b = json!({
        "model": MODEL,
        "messages": messages,
        "temperature": 1.0,
        // SmolLM2 repeats parallel calls until `max_tokens` without a repeat penalty.
        "repeat_penalty": 1.1,
        "seed": 1,
        "max_tokens": 60,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn ask(q: &str) -> Value {
    json!([{"role": "user", "content": q}])
}

/// The OpenAI 400 of `r`, checked to name `param`; returns the message.
fn openai_400(r: &Reply, param: &str) -> String {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["type"], "invalid_request_error", "{}", r.text());
    assert_eq!(e["code"], "invalid_request", "{}", r.text());
    assert_eq!(e["param"], param, "{}", r.text());
    e["message"].as_str().unwrap().to_string()
}

/// The Ollama 400 of `r` (`{"error": "..."}`), checked to name `field`; returns the message.
fn ollama_400(r: &Reply, field: &str) -> String {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    let m = r.json()["error"]
        .as_str()
        .unwrap_or_else(|| panic!("not {{\"error\": \"...\"}}: {}", r.text()))
        .to_string();
    // Named as a field: in backticks, or a path (`tools[0].function.parameters`) as such.
    let named = m.contains(&format!("`{field}`")) || (field.contains('[') && m.contains(field));
    assert!(named, "the error does not name `{field}`: {m}");
    m
}

/// The chunks of an OpenAI SSE answer (without `[DONE]`, checked to end the stream).
fn chunks(r: &Reply) -> Vec<Value> {
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let ev = r.sse();
    assert_eq!(
        ev.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.text()
    );
    ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap_or_else(|err| panic!("{err}: {e}")))
        .collect()
}

/// A streamed chat answer put back together: content, reasoning, calls (arguments
/// concatenated per index, as clients do), finish reason.
#[derive(Debug, Default)]
struct Streamed {
    content: String,
    reasoning: String,
    calls: BTreeMap<u64, (String, String)>,
    finish: Option<String>,
}

fn reassemble(r: &Reply) -> Streamed {
    let mut s = Streamed::default();
    for c in chunks(r) {
        assert!(c.get("error").is_none(), "{c}");
        let Some(ch) = c["choices"].get(0) else {
            continue;
        };
        let d = &ch["delta"];
        s.content.push_str(d["content"].as_str().unwrap_or(""));
        s.reasoning
            .push_str(d["reasoning_content"].as_str().unwrap_or(""));
        if let Some(list) = d.get("tool_calls") {
            for tc in list.as_array().unwrap() {
                let i = tc["index"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no index: {tc}"));
                assert_eq!(tc["type"], "function", "{tc}");
                let id = tc["id"].as_str().unwrap_or("");
                assert!(!id.is_empty(), "a call delta without an id: {tc}");
                let e = s.calls.entry(i).or_default();
                e.0.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                e.1.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        if let Some(f) = ch["finish_reason"].as_str() {
            assert!(s.finish.is_none(), "two finish reasons");
            s.finish = Some(f.to_string());
        }
    }
    s
}

/// `message.tool_calls` of a non-streamed answer as (name, arguments string), each checked
/// for an id and `type: function`.
fn message_calls(v: &Value) -> Vec<(String, String)> {
    let m = &v["choices"][0]["message"];
    m["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {v}"))
        .iter()
        .map(|tc| {
            assert_eq!(tc["type"], "function", "{tc}");
            assert!(tc["id"].as_str().is_some_and(|i| !i.is_empty()), "{tc}");
            assert!(tc.get("index").is_none(), "{tc}");
            (
                tc["function"]["name"].as_str().unwrap().to_string(),
                tc["function"]["arguments"]
                    .as_str()
                    .unwrap_or_else(|| panic!("arguments are not a JSON string: {tc}"))
                    .to_string(),
            )
        })
        .collect()
}

fn check_calls(calls: &[(String, String)]) {
    assert!(!calls.is_empty());
    for (name, args) in calls {
        let a: Value = serde_json::from_str(args)
            .unwrap_or_else(|e| panic!("{name}: arguments {args:?} are not JSON: {e}"));
        check_args(name, &a);
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Bad input: a 400 naming the field

#[tokio::test]
async fn bad_openai_agent_fields_are_400s_naming_the_field() {
    let app = router();
    let q = ask("Hi");
    let mut bad_tools = tools();
    bad_tools[1]["function"]["parameters"] = json!({
        "type": "object",
        "properties": {"zone": {"type": "array", "uniqueItems": true}}
    });
    let mut string_params = tools();
    string_params[1]["function"]["parameters"] = json!("an object please");
    let mut not_object = tools();
    not_object[1]["function"]["parameters"] = json!({"type": "string"});
    let mut dup = tools();
    dup[1]["function"]["name"] = json!("get_weather");
    let mut bad_name = tools();
    bad_name[0]["function"]["name"] = json!("get weather!");
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "object"}}}),
            "response_format.json_schema.schema",
            "schema",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                {"type": "object", "properties": {"a": {"type": "string", "minLength": "three"}}}}}}),
            "response_format",
            "minLength",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                {"type": "array", "uniqueItems": true}}}}),
            "response_format",
            "uniqueItems",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":
                {"type": "string", "format": "no-such-format"}}}}),
            "response_format",
            "no-such-format",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format.type",
            "xml",
        ),
        (
            json!({"response_format": {"json_schema": {"schema": {}}}}),
            "response_format.type",
            "type",
        ),
        (
            json!({"tools": bad_tools, "tool_choice": "required"}),
            "tools[1].function.parameters",
            "uniqueItems",
        ),
        (
            json!({"tools": string_params}),
            "tools[1].function.parameters",
            "parameters",
        ),
        (
            json!({"tools": not_object}),
            "tools[1].function.parameters",
            "object",
        ),
        (
            json!({"tools": dup}),
            "tools[1].function.name",
            "get_weather",
        ),
        (
            json!({"tools": bad_name}),
            "tools[0].function.name",
            "get weather!",
        ),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}),
            "tool_choice",
            "get_stock",
        ),
        (json!({"tool_choice": "required"}), "tool_choice", "tools"),
        (
            json!({"tools": tools(), "tool_choice": "sometimes"}),
            "tool_choice",
            "sometimes",
        ),
        (
            json!({"chat_template_kwargs": {"enable_thinking": true}}),
            "chat_template_kwargs.enable_thinking",
            "think",
        ),
        (
            json!({"chat_template_kwargs": {"enable_thinking": "yes"}}),
            "chat_template_kwargs.enable_thinking",
            "boolean",
        ),
        (
            json!({"reasoning_effort": "high"}),
            "reasoning_effort",
            "think",
        ),
        (
            json!({"reasoning_effort": "extreme"}),
            "reasoning_effort",
            "extreme",
        ),
        (
            json!({"tools": tools(), "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "response_format",
            "tools",
        ),
    ];
    for (extra, param, needle) in cases {
        let r = post(
            &app,
            "/v1/chat/completions",
            &body(q.clone(), extra.clone()),
        )
        .await;
        let m = openai_400(&r, param);
        assert!(
            m.contains(needle),
            "{extra}: {m:?} does not mention {needle:?}"
        );
    }

    // An assistant turn whose call arguments are not JSON (or not an object).
    for (args, needle) in [("{\"city\": ", "not valid JSON"), ("[1, 2]", "object")] {
        let msgs = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}},
                {"id": "call_2", "type": "function",
                 "function": {"name": "get_weather", "arguments": args}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
        ]);
        let r = post(
            &app,
            "/v1/chat/completions",
            &body(msgs, json!({"tools": tools()})),
        )
        .await;
        let m = openai_400(&r, "messages[1].tool_calls[1].function.arguments");
        assert!(m.contains(needle), "{m}");
    }
}

#[tokio::test]
async fn bad_ollama_agent_fields_are_400s_naming_the_field() {
    let app = router();
    let mut bad_tools = tools();
    bad_tools[0]["function"]["parameters"] = json!({
        "type": "object",
        "properties": {"city": {"type": "array", "uniqueItems": true}}
    });
    let mut dup = tools();
    dup[1]["function"]["name"] = json!("get_weather");
    let cases: Vec<(Value, &str)> = vec![
        (json!({"format": 42}), "format"),
        (json!({"format": "yaml"}), "format"),
        (json!({"format": ["json"]}), "format"),
        (
            json!({"format": {"type": "array", "uniqueItems": true}}),
            "format",
        ),
        (
            json!({"format": {"type": "object", "properties": {"a": {"type": "string", "maxLength": -1}}}}),
            "format",
        ),
        (json!({"think": true}), "think"),
        (json!({"think": "high"}), "think"),
        (json!({"think": "extreme"}), "think"),
        (json!({"tools": bad_tools}), "tools[0].function.parameters"),
        (json!({"tools": dup}), "tools[1].function.name"),
        (json!({"tools": "get_weather"}), "tools"),
    ];
    for (extra, field) in cases {
        for route in ["/api/chat", "/api/generate"] {
            if route == "/api/generate" && extra.get("tools").is_some() {
                continue;
            }
            let mut b = json!({
                "model": MODEL, "stream": false, "options": {"num_predict": 4},
            });
            if route == "/api/chat" {
                b["messages"] = ask("Hi");
            } else {
                b["prompt"] = json!("Hi");
            }
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            let r = post(&app, route, &b).await;
            ollama_400(&r, field);
        }
    }
    // Malformed call arguments in an assistant turn (neither an object nor a JSON object
    // in a string).
    for args in [json!(5), json!("{\"city\": "), json!("[1, 2]")] {
        let b = json!({
            "model": MODEL, "stream": false, "options": {"num_predict": 4},
            "messages": [
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": args}}]}
            ]
        });
        let r = post(&app, "/api/chat", &b).await;
        ollama_400(&r, "messages[1].tool_calls[0].function.arguments");
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A constrained answer cut short is `length`, never calls

#[tokio::test]
async fn a_constrained_answer_cut_short_is_length_and_not_calls() {
    let app = router();
    let schema = json!({"type": "object", "properties": {
        "items": {"type": "array", "items": {"type": "string"}, "minItems": 20}},
        "required": ["items"], "additionalProperties": false});
    let rf = json!({"type": "json_schema", "json_schema": {"name": "list", "strict": true, "schema": schema}});
    let r = post(
        &app,
        "/v1/chat/completions",
        &body(
            ask("List fruits."),
            json!({"response_format": rf, "max_tokens": 5}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    let text = c["message"]["content"].as_str().unwrap();
    assert!(
        text.len() > 2 && "{\"items\": [".starts_with(text),
        "{text}"
    );

    for stream in [false, true] {
        for choice in [
            json!("required"),
            json!({"type": "function", "function": {"name": "get_weather"}}),
        ] {
            let r = post(
                &app,
                "/v1/chat/completions",
                &body(
                    ask("Weather in Paris?"),
                    json!({"tools": tools(), "tool_choice": choice, "max_tokens": 10, "stream": stream}),
                ),
            )
            .await;
            if stream {
                let s = reassemble(&r);
                assert_eq!(s.finish.as_deref(), Some("length"), "{}", r.text());
                assert!(s.calls.is_empty(), "{}", r.text());
                assert!(s.content.starts_with("{\"tool_calls\": ["), "{s:?}");
            } else {
                assert_eq!(r.status, StatusCode::OK, "{}", r.text());
                let v = r.json();
                let c = &v["choices"][0];
                assert_eq!(c["finish_reason"], "length", "{v}");
                assert!(c["message"].get("tool_calls").is_none(), "{v}");
                let text = c["message"]["content"].as_str().unwrap();
                assert!(text.starts_with("{\"tool_calls\": ["), "{v}");
            }
        }
    }

    // Ollama: `format` cut short is `length` too.
    let r = post(
        &app,
        "/api/chat",
        &json!({"model": MODEL, "stream": false, "messages": ask("List fruits."),
                "format": schema, "options": {"num_predict": 5, "seed": 1}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["done_reason"], "length", "{v}");
    assert!(v["message"].get("tool_calls").is_none(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// 3. SmolLM2 (Generic format): forced calls, streamed and not

#[tokio::test]
async fn smollm2_required_and_named_calls_stream_as_they_answer() {
    let app = router();
    let q = ask("What is the weather in Paris? Use the get_weather tool.");
    let variants = [
        json!({"tool_choice": "required"}),
        json!({"tool_choice": "required", "parallel_tool_calls": false}),
        json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
    ];
    for extra in variants {
        let mut extra = extra;
        extra["tools"] = tools();
        extra["max_tokens"] = json!(150);
        let plain = post(
            &app,
            "/v1/chat/completions",
            &body(q.clone(), extra.clone()),
        )
        .await;
        assert_eq!(plain.status, StatusCode::OK, "{}", plain.text());
        let v = plain.json();
        eprintln!("{extra}\n  -> {}", v["choices"][0]);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        let calls = message_calls(&v);
        check_calls(&calls);
        if extra["parallel_tool_calls"] == false {
            assert_eq!(calls.len(), 1, "{v}");
        }
        if extra["tool_choice"].is_object() {
            assert!(calls.iter().all(|(n, _)| n == "get_time"), "{v}");
        }

        extra["stream"] = json!(true);
        let r = post(
            &app,
            "/v1/chat/completions",
            &body(q.clone(), extra.clone()),
        )
        .await;
        let s = reassemble(&r);
        assert_eq!(s.finish.as_deref(), Some("tool_calls"), "{}", r.text());
        assert_eq!(s.content, "", "{}", r.text());
        let streamed: Vec<(String, String)> = s.calls.values().cloned().collect();
        assert_eq!(
            s.calls.keys().copied().collect::<Vec<_>>(),
            (0..streamed.len() as u64).collect::<Vec<_>>()
        );
        assert_eq!(streamed, calls, "the stream differs from the answer");
    }
}

#[tokio::test]
async fn smollm2_parallel_calls_follow_parallel_tool_calls() {
    // With parallel calls allowed the model makes two here, with `parallel_tool_calls:
    // false` exactly one.
    let app = router();
    let q = ask("What is the weather in Paris? Use the get_weather tool.");
    let mut counts = Vec::new();
    for parallel in [true, false] {
        let r = post(
            &app,
            "/v1/chat/completions",
            &body(
                q.clone(),
                json!({"tools": tools(), "tool_choice": "required",
                       "parallel_tool_calls": parallel, "max_tokens": 150}),
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.json();
        eprintln!("parallel {parallel}: {}", v["choices"][0]);
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        let calls = message_calls(&v);
        check_calls(&calls);
        counts.push(calls.len());
    }
    assert!(counts[0] >= 2, "{counts:?}");
    assert_eq!(counts[1], 1, "{counts:?}");
}

/// Ollama `tool_calls` of one answer object (`message.tool_calls[].function`).
fn ollama_calls(v: &Value) -> Vec<(String, Value)> {
    v["message"]["tool_calls"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let f = &c["function"];
                    assert!(f["arguments"].is_object(), "arguments are an object: {c}");
                    (
                        f["name"].as_str().unwrap().to_string(),
                        f["arguments"].clone(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn ollama_chat_with_tools_and_with_format() {
    let app = router();
    let base = json!({
        "model": MODEL,
        "messages": ask("What is the weather in Paris? Use the get_weather tool."),
        "tools": tools(),
        "options": {"seed": 3, "temperature": 0.0, "num_predict": 60},
    });
    let mut b = base.clone();
    b["stream"] = json!(false);
    let r = post(&app, "/api/chat", &b).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    eprintln!("ollama tools: {v}");
    assert_eq!(v["done"], true);
    assert_eq!(v["done_reason"], "stop", "{v}");
    let calls = ollama_calls(&v);
    assert!(!calls.is_empty(), "{v}");
    for (n, a) in &calls {
        check_args(n, a);
    }
    assert_eq!(v["message"]["content"], "", "{v}");

    let r = post(&app, "/api/chat", &base).await; // streams by default
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let lines = r.ndjson();
    let mut streamed = Vec::new();
    let mut content = String::new();
    for l in &lines {
        streamed.extend(ollama_calls(l));
        content.push_str(l["message"]["content"].as_str().unwrap_or(""));
    }
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true, "{}", r.text());
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(streamed, calls, "{}", r.text());
    assert_eq!(content, "");

    // `format` with a schema, non-streaming and streaming.
    let schema = json!({"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "London"]},
        "warm": {"type": "boolean"}}, "required": ["city", "warm"], "additionalProperties": false});
    let check = |text: &str| {
        let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 2, "{text}");
        assert!(
            ["Paris", "London"].contains(&o["city"].as_str().unwrap()),
            "{text}"
        );
        assert!(o["warm"].is_boolean(), "{text}");
    };
    let fb = json!({"model": MODEL, "messages": ask("Is Paris warm? Answer as JSON."),
                    "format": schema, "options": {"seed": 3, "num_predict": 40}});
    let mut b = fb.clone();
    b["stream"] = json!(false);
    let r = post(&app, "/api/chat", &b).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["done_reason"], "stop", "{v}");
    let plain = v["message"]["content"].as_str().unwrap().to_string();
    check(&plain);
    let r = post(&app, "/api/chat", &fb).await;
    let text: String = r
        .ndjson()
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(text, plain);

    // Both at once: Ollama has no `tool_choice` to switch the tools off, so this is a 400
    // naming `format`.
    let mut b = base.clone();
    b["format"] = schema;
    b["stream"] = json!(false);
    let r = post(&app, "/api/chat", &b).await;
    ollama_400(&r, "format");
}

// ---------------------------------------------------------------------------------------------
// 4 and 5. The tiny Qwen3 with the real Qwen3 template: Hermes calls, reasoning

/// The tiny random-weight Qwen3 checkpoint with `template` as its chat template and a context
/// long enough for the real templates' tool prompts.
fn qwen3_dir(template: &str) -> tempfile::TempDir {
    let src = repo().join("tests/fixtures/families/qwen3");
    let dir = tempfile::tempdir().unwrap();
    for f in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(2048);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    dir
}

const TINY: &str = "qwen3-tiny";

fn tiny_router(dir: &Path) -> Router {
    let spec = ModelSpec::new(TINY, dir.to_path_buf(), "cd".repeat(32), 1, "test").unwrap();
    app(AppState::new(
        vec![spec],
        ServerConfig {
            engine: EngineOptions {
                threads: 2,
                ..EngineOptions::default()
            },
            parallel: 1,
            queue: 4,
            ..ServerConfig::default()
        },
    ))
}

fn tiny_body(messages: Value, extra: Value) -> Value {
    let mut b = body(messages, extra);
    b["model"] = json!(TINY);
    b
}

#[tokio::test]
async fn hermes_calls_from_a_random_model_under_the_constraint() {
    let dir = qwen3_dir(&template_src(QWEN3));
    let app = tiny_router(dir.path());
    let q = ask("What is the weather in Paris?");
    for (extra, seed) in [
        (
            json!({"tool_choice": "required", "parallel_tool_calls": false}),
            1,
        ),
        (json!({"tool_choice": "required"}), 2),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
            3,
        ),
    ] {
        let mut extra = extra;
        extra["tools"] = tools();
        extra["seed"] = json!(seed);
        extra["max_tokens"] = json!(400);
        let r = post(
            &app,
            "/v1/chat/completions",
            &tiny_body(q.clone(), extra.clone()),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let v = r.json();
        eprintln!("tiny {extra}\n  -> {}", v["choices"][0]);
        let c = &v["choices"][0];
        assert_eq!(c["finish_reason"], "tool_calls", "{v}");
        // The constraint switched thinking off: no reasoning, no text around the calls.
        assert!(c["message"].get("reasoning_content").is_none(), "{v}");
        assert!(c["message"]["content"].is_null(), "{v}");
        let calls = message_calls(&v);
        check_calls(&calls);
        if extra["parallel_tool_calls"] == false {
            assert_eq!(calls.len(), 1);
        }
        if extra["tool_choice"].is_object() {
            assert!(calls.iter().all(|(n, _)| n == "get_weather"), "{v}");
        }

        extra["stream"] = json!(true);
        let r = post(&app, "/v1/chat/completions", &tiny_body(q.clone(), extra)).await;
        let s = reassemble(&r);
        assert_eq!(s.finish.as_deref(), Some("tool_calls"), "{}", r.text());
        assert_eq!((s.content.as_str(), s.reasoning.as_str()), ("", ""));
        assert_eq!(s.calls.values().cloned().collect::<Vec<_>>(), calls);
    }

    // Tools with `tool_choice: none` leave the answer free (and unparsed); thinking may be
    // asked for then, and is split off into reasoning_content when the model closes it.
    let r = post(
        &app,
        "/v1/chat/completions",
        &tiny_body(
            q.clone(),
            json!({"tools": tools(), "tool_choice": "none", "max_tokens": 8,
                   "chat_template_kwargs": {"enable_thinking": true}}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(r.json()["choices"][0]["message"]
        .get("tool_calls")
        .is_none());
    // Thinking and a constraint do not go together yet: a 400 naming the switch.
    let r = post(
        &app,
        "/v1/chat/completions",
        &tiny_body(
            q.clone(),
            json!({"tools": tools(), "tool_choice": "required", "reasoning_effort": "low"}),
        ),
    )
    .await;
    openai_400(&r, "reasoning_effort");
    // A multi-turn tool conversation renders through the real template.
    let r = post(
        &app,
        "/v1/chat/completions",
        &tiny_body(
            multi_turn_openai("call_abc123"),
            json!({"tools": tools(), "max_tokens": 4}),
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

/// The tiny Qwen3 loaded with `template_file` swapped in (as `LoadedModel` detects it).
fn tiny_model(template_file: &str, bos: &str, eos: &str) -> LoadedModel {
    let mut m = LoadedModel::load(&repo().join("tests/fixtures/families/qwen3")).unwrap();
    let src = template_src(template_file);
    let texts: Vec<String> = (0..m.tokenizer.vocab_size() as u32)
        .filter_map(|i| m.tokenizer.id_to_token(i).map(str::to_string))
        .collect();
    m.tool_format = ToolFormat::detect(Some(&src), texts.iter().map(String::as_str));
    m.reasoning = ReasoningFormat::detect(Some(&src), texts.iter().map(String::as_str));
    m.template = Some(ChatTemplate::new(&src, bos, eos).unwrap());
    m
}

fn qwen3_model() -> LoadedModel {
    let m = tiny_model(QWEN3, "<|endoftext|>", "<|im_end|>");
    assert_eq!(m.tool_format, ToolFormat::Hermes);
    assert_eq!(m.reasoning, ReasoningFormat::Think);
    m
}

fn input(think: Option<bool>) -> ChatInput {
    let mut i = ChatInput::plain(vec![ChatMessage::new("user", "Hello")]);
    i.think = think.map(|t| (t, "chat_template_kwargs.enable_thinking"));
    i
}

const EMPTY_THINK: &str = "<think>\n\n</think>\n\n";

#[test]
fn qwen3_thinking_switches_render_as_the_template_says() {
    let m = qwen3_model();
    let on = plan_chat(&m, input(Some(true)), TINY).unwrap();
    assert!(
        on.prompt.text().ends_with("<|im_start|>assistant\n"),
        "{:?}",
        on.prompt.text()
    );
    assert!(
        !on.prompt.text().contains("<think>"),
        "{:?}",
        on.prompt.text()
    );
    assert_eq!(on.shape.reasoning, Some(false));
    assert!(on.tool_constraint.is_none() && !on.keep_special);

    let none = plan_chat(&m, input(None), TINY).unwrap();
    assert_eq!(
        none.prompt.text(),
        on.prompt.text(),
        "Qwen3 thinks by default"
    );

    let off = plan_chat(&m, input(Some(false)), TINY).unwrap();
    assert!(
        off.prompt
            .text()
            .ends_with(&format!("<|im_start|>assistant\n{EMPTY_THINK}")),
        "{:?}",
        off.prompt.text()
    );
    assert_eq!(off.shape.reasoning, Some(false));

    // reasoning_effort goes to the template as a variable, with thinking on.
    let mut i = input(Some(true));
    i.kwargs.insert("reasoning_effort".into(), json!("low"));
    assert_eq!(
        plan_chat(&m, i, TINY).unwrap().prompt.text(),
        on.prompt.text()
    );

    // Constrained answers start at once: thinking is switched off...
    let mut structured = input(None);
    structured.structured = Some("response_format");
    let p = plan_chat(&m, structured, TINY).unwrap();
    assert!(
        p.prompt.text().ends_with(EMPTY_THINK),
        "{:?}",
        p.prompt.text()
    );
    assert!(p.tool_constraint.is_none());

    let mut calls = input(None);
    calls.tools = parse_tools(Some(&tools())).unwrap();
    calls.choice = ToolChoice::Required;
    let p = plan_chat(&m, calls.clone(), TINY).unwrap();
    assert!(
        p.prompt.text().ends_with(EMPTY_THINK),
        "{:?}",
        p.prompt.text()
    );
    assert!(
        p.prompt.text().contains("<tools>") && p.prompt.text().contains("\"get_weather\""),
        "{:?}",
        p.prompt.text()
    );
    assert!(p.tool_constraint.is_some() && p.keep_special);
    assert_eq!(p.shape.tools, Some(ToolFormat::Hermes));
    assert_eq!(p.shape.reasoning, Some(false));

    // ...even when asked off explicitly, and refused when asked on.
    calls.think = Some((false, "think"));
    assert!(plan_chat(&m, calls.clone(), TINY)
        .unwrap()
        .prompt
        .text()
        .ends_with(EMPTY_THINK));
    calls.think = Some((true, "think"));
    let e = plan_chat(&m, calls.clone(), TINY).err().expect("a 400");
    assert_eq!(e.param.as_deref(), Some("think"), "{e:?}");

    // tool_choice none: the tools are shown, nothing is constrained, thinking is the model's.
    calls.think = None;
    calls.choice = ToolChoice::None;
    let p = plan_chat(&m, calls, TINY).unwrap();
    assert!(p.tool_constraint.is_none() && p.shape.tools.is_none());
    assert!(
        p.prompt.text().ends_with("<|im_start|>assistant\n"),
        "{:?}",
        p.prompt.text()
    );
}

/// Every way of cutting `text` into three pieces (and one-character pieces), through a
/// fresh shaper.
fn every_chunking(shape: OutputShape, text: &str, mut check: impl FnMut(&Shaped, &str)) {
    let bounds: Vec<usize> = (0..=text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    let mut run = |pieces: Vec<&str>| {
        let mut s = Shaper::new(shape);
        let mut out = Shaped::default();
        for p in &pieces {
            out.add(s.push(p));
        }
        out.add(s.finish(true));
        check(&out, &format!("{pieces:?}"));
    };
    for (x, &a) in bounds.iter().enumerate() {
        for &b in &bounds[x..] {
            run(vec![&text[..a], &text[a..b], &text[b..]]);
        }
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    run(chars.iter().map(String::as_str).collect());
}

#[test]
fn the_shaper_splits_reasoning_content_and_calls_in_any_chunking() {
    let think = OutputShape {
        tools: None,
        reasoning: Some(false),
        harmony: false,
    };
    every_chunking(
        think,
        "<think>\nLet me see.\n</think>\n\nParis.",
        |s, how| {
            assert_eq!(s.reasoning, "Let me see.", "{how}");
            assert_eq!(s.content, "Paris.", "{how}");
            assert!(s.calls.is_empty());
        },
    );
    // A prompt that opened the reasoning: only `</think>` comes.
    let opened = OutputShape {
        tools: None,
        reasoning: Some(true),
        harmony: false,
    };
    every_chunking(opened, "hm </think>ok", |s, how| {
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("hm ", "ok"),
            "{how}"
        );
    });
    // No reasoning format: the tags are content.
    every_chunking(OutputShape::default(), "<think>x</think>y", |s, how| {
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("", "<think>x</think>y"),
            "{how}"
        );
    });
    // Reasoning, then Hermes calls.
    let hermes = OutputShape {
        tools: Some(ToolFormat::Hermes),
        reasoning: Some(false),
        harmony: false,
    };
    let text = "<think>\nweather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\"}}\n</tool_call>";
    every_chunking(hermes, text, |s, how| {
        assert_eq!(s.reasoning, "weather", "{how}");
        assert_eq!(s.content, "", "{how}");
        let names: Vec<&str> = s.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["get_weather", "get_time"], "{how}");
        check_args("get_weather", &s.calls[0].arguments);
        check_args("get_time", &s.calls[1].arguments);
    });
    // An unfinished call is content, not a call.
    let cut = &text[..text.len() - 20];
    let mut s = Shaper::new(hermes);
    let mut out = Shaped::default();
    out.add(s.push(cut));
    out.add(s.finish(true));
    assert_eq!(out.calls.len(), 1);
    assert_eq!(s.calls(), 1);
    assert!(out.content.starts_with("<tool_call>"), "{:?}", out.content);
    // The same answer cut by a limit (not complete): no call is presented, not even the
    // finished first one; the text from the first call on is content, as generated.
    for pieces_at in [1, 7, cut.len()] {
        let mut s = Shaper::new(hermes);
        let mut out = Shaped::default();
        let mut rest = cut;
        while !rest.is_empty() {
            let mut at = pieces_at.min(rest.len());
            while !rest.is_char_boundary(at) {
                at += 1;
            }
            out.add(s.push(&rest[..at]));
            rest = &rest[at..];
        }
        out.add(s.finish(false));
        assert!(out.calls.is_empty(), "{:?}", out.calls);
        assert_eq!(s.calls(), 0);
        assert_eq!(out.reasoning, "weather");
        let answer = cut.split_once("</think>\n\n").unwrap().1;
        assert_eq!(out.content, answer, "pieces of {pieces_at}");
    }
    // Pieces come in order.
    let mut s = Shaper::new(hermes);
    let mut pieces = s.push(text);
    pieces.extend(s.finish(true));
    assert!(matches!(pieces[0], Piece::Reasoning(_)), "{pieces:?}");
    assert!(matches!(pieces.last(), Some(Piece::Call(_))), "{pieces:?}");
}

// ---------------------------------------------------------------------------------------------
// Harmony (gpt-oss): plan_chat with a minimal harmony template, and the Shaper

const HARMONY: &str = "flowrt-harmony-minimal.jinja";

fn harmony_model() -> LoadedModel {
    let m = tiny_model(HARMONY, "<|startoftext|>", "<|return|>");
    assert_eq!(m.tool_format, ToolFormat::Harmony);
    assert_eq!(m.reasoning, ReasoningFormat::Harmony);
    m
}

#[test]
fn harmony_plans_render_efforts_and_refuse_what_has_no_grammar() {
    let m = harmony_model();
    let p = plan_chat(&m, input(None), TINY).unwrap();
    let text = p.prompt.text();
    assert!(text.contains("Reasoning: medium"), "{text:?}");
    assert!(
        text.ends_with("<|start|>user<|message|>Hello<|end|><|start|>assistant"),
        "{text:?}"
    );
    assert!(p.shape.harmony && p.shape.reasoning.is_none() && p.shape.tools.is_none());
    assert!(p.keep_special, "harmony's markers must reach the parser");
    assert!(p.shape.may_reason());

    // Efforts: given, mapped (none / minimal / thinking off: low), or refused.
    for (think, effort, want) in [
        (Some((true, "think")), Some("high"), "Reasoning: high"),
        (None, Some("low"), "Reasoning: low"),
        (None, Some("minimal"), "Reasoning: low"),
        (
            Some((false, "reasoning_effort")),
            Some("none"),
            "Reasoning: low",
        ),
        (Some((false, "thinking")), None, "Reasoning: low"),
        (Some((true, "think")), None, "Reasoning: medium"),
    ] {
        let mut i = input(None);
        i.think = think;
        if let Some(e) = effort {
            i.kwargs.insert("reasoning_effort".into(), json!(e));
        }
        let p = plan_chat(&m, i, TINY).unwrap();
        assert!(
            p.prompt.text().contains(want),
            "{think:?} {effort:?}: {:?}",
            p.prompt.text()
        );
    }
    let mut i = input(None);
    i.kwargs.insert("reasoning_effort".into(), json!("extreme"));
    let e = plan_chat(&m, i, TINY).err().expect("a 400");
    assert_eq!(e.param.as_deref(), Some("reasoning_effort"), "{e:?}");

    // Tools: auto renders them and parses calls, unconstrained, with thinking on.
    let mut calls = input(Some(true));
    calls.tools = parse_tools(Some(&tools())).unwrap();
    let p = plan_chat(&m, calls.clone(), TINY).unwrap();
    assert!(
        p.prompt.text().contains("# Functions\n- get_weather: "),
        "{:?}",
        p.prompt.text()
    );
    assert!(p.tool_constraint.is_none() && p.keep_special);
    assert_eq!(p.shape.tools, Some(ToolFormat::Harmony));
    // Forced calls and structured output have no harmony grammar yet: 400s naming the field.
    for choice in [ToolChoice::Required, ToolChoice::Named("get_time".into())] {
        calls.choice = choice;
        let e = plan_chat(&m, calls.clone(), TINY).err().expect("a 400");
        assert_eq!(e.param.as_deref(), Some("tool_choice"), "{e:?}");
    }
    let mut structured = input(None);
    structured.structured = Some("response_format");
    let e = plan_chat(&m, structured, TINY).err().expect("a 400");
    assert_eq!(e.param.as_deref(), Some("response_format"), "{e:?}");

    // A tool conversation renders: the call from `functions.NAME`, the result back to it.
    let mut conv = input(None);
    conv.tools = parse_tools(Some(&tools())).unwrap();
    conv.messages = multi_turn_messages("call_1");
    let p = plan_chat(&m, conv, TINY).unwrap();
    let text = p.prompt.text();
    assert!(
        text.contains(
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        ) && text.contains(
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
        ),
        "{text:?}"
    );
}

fn harmony_shape(tools: bool) -> OutputShape {
    OutputShape {
        tools: tools.then_some(ToolFormat::Harmony),
        reasoning: None,
        harmony: true,
    }
}

#[test]
fn the_shaper_reads_harmony_channels_in_any_chunking() {
    let answer = "<|channel|>analysis<|message|>User wants weather.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.";
    every_chunking(harmony_shape(false), answer, |s, how| {
        assert_eq!(s.reasoning, "User wants weather.", "{how}");
        assert_eq!(s.content, "It is sunny.", "{how}");
        assert!(s.calls.is_empty(), "{how}");
    });
    let call = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"celsius\"}";
    every_chunking(harmony_shape(true), call, |s, how| {
        assert_eq!(s.reasoning, "Need weather.", "{how}");
        assert_eq!(s.content, "", "{how}");
        assert_eq!(s.calls.len(), 1, "{how}");
        assert_eq!(s.calls[0].name, "get_weather");
        check_args("get_weather", &s.calls[0].arguments);
    });
    // Without tools a call is not presented: its text is content.
    let mut s = Shaper::new(harmony_shape(false));
    let mut out = Shaped::default();
    out.add(s.push(call));
    out.add(s.finish(true));
    assert!(out.calls.is_empty());
    assert!(
        out.content
            .starts_with("<|start|>assistant<|channel|>commentary to=functions.get_weather"),
        "{:?}",
        out.content
    );
    // Cut by a limit after the call's arguments closed: content, not a call.
    let mut s = Shaper::new(harmony_shape(true));
    let mut out = Shaped::default();
    out.add(s.push(call));
    out.add(s.finish(false));
    assert!(out.calls.is_empty() && s.calls() == 0);
    assert_eq!(out.reasoning, "Need weather.");
    assert!(
        out.content
            .starts_with("<|start|>assistant<|channel|>commentary"),
        "{:?}",
        out.content
    );
    // Reasoning streams before the answer is over.
    let mut s = Shaper::new(harmony_shape(true));
    let first = s.push("<|channel|>analysis<|message|>Hmm");
    assert_eq!(first, [Piece::Reasoning("Hmm".into())]);
}

// ---------------------------------------------------------------------------------------------
// 6. Multi-turn tool conversations

fn multi_turn_openai(id: &str) -> Value {
    json!([
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}
        ]},
        {"role": "tool", "tool_call_id": id, "content": "18 degrees, sunny"}
    ])
}

fn multi_turn_messages(id: &str) -> Vec<ChatMessage> {
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(vec![ToolCall {
        id: Some(id.to_string()),
        kind: "function".into(),
        function: FunctionCall {
            name: "get_weather".into(),
            arguments: json!({"city": "Paris", "unit": "celsius"}),
        },
    }]);
    let mut result = ChatMessage::new("tool", "18 degrees, sunny");
    result.tool_call_id = Some(id.to_string());
    result.name = Some("get_weather".into());
    vec![
        ChatMessage::new("system", "You are a weather bot."),
        ChatMessage::new("user", "Weather in Paris?"),
        call,
        result,
    ]
}

#[tokio::test]
async fn smollm2_renders_tool_turns_in_the_generic_format() {
    let app = router();
    for extra in [
        json!({"tools": tools()}),
        json!({"tools": tools(), "tool_choice": "none"}),
        json!({}),
    ] {
        let mut extra = extra;
        extra["max_tokens"] = json!(4);
        let r = post(
            &app,
            "/v1/chat/completions",
            &body(multi_turn_openai("call_1"), extra.clone()),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{extra}: {}", r.text());
    }
    // Ollama's shape: arguments as an object, results with `tool_name`.
    let r = post(
        &app,
        "/api/chat",
        &json!({"model": MODEL, "stream": false, "tools": tools(), "options": {"num_predict": 4},
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                    {"role": "tool", "tool_name": "get_weather", "content": "18 degrees"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // What SmolLM2 is shown: the tools in the system message, the call as the Generic JSON,
    // the result as a user message.
    let m = LoadedModel::load(&smollm2()).unwrap();
    assert_eq!(m.tool_format, ToolFormat::Generic);
    let mut i = ChatInput::plain(multi_turn_messages("call_1"));
    i.tools = parse_tools(Some(&tools())).unwrap();
    let p = plan_chat(&m, i, MODEL).unwrap();
    assert!(
        p.prompt
            .text()
            .contains("You are a weather bot.\n\nYou can call functions"),
        "{}",
        p.prompt.text()
    );
    assert!(
        p.prompt.text().contains("{\"tool_calls\":[{\"arguments\":{\"city\":\"Paris\",\"unit\":\"celsius\"},\"name\":\"get_weather\"}]}")
            || p.prompt.text().contains("{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"unit\":\"celsius\"}}]}"),
        "{}",
        p.prompt.text()
    );
    assert!(
        p.prompt.text().contains("Tool results:\n"),
        "{}",
        p.prompt.text()
    );
    assert!(
        p.prompt.text().contains("18 degrees, sunny"),
        "{}",
        p.prompt.text()
    );
    assert_eq!(p.shape.tools, Some(ToolFormat::Generic));
}

#[test]
fn real_templates_render_tool_turns() {
    let cases = [
        (
            QWEN3,
            "<|endoftext|>",
            "<|im_end|>",
            ToolFormat::Hermes,
            "call_abc123",
        ),
        (
            LLAMA31,
            "<|begin_of_text|>",
            "<|eot_id|>",
            ToolFormat::Llama3Json,
            "call_abc123",
        ),
        // Mistral's template wants 9-character ids (what flowrt gives its own calls).
        (MISTRAL, "<s>", "</s>", ToolFormat::Mistral, "aB3dE6gH9"),
    ];
    for (file, bos, eos, format, id) in cases {
        let m = Arc::new(tiny_model(file, bos, eos));
        assert_eq!(m.tool_format, format, "{file}");
        for choice in [ToolChoice::Auto, ToolChoice::None, ToolChoice::Required] {
            let mut i = ChatInput::plain(multi_turn_messages(id));
            i.tools = parse_tools(Some(&tools())).unwrap();
            i.choice = choice.clone();
            let p = plan_chat(&m, i, "tiny").unwrap_or_else(|e| panic!("{file} {choice:?}: {e:?}"));
            assert!(
                p.prompt.text().contains("18 degrees, sunny"),
                "{file}: {}",
                p.prompt.text()
            );
            assert!(
                p.prompt.text().contains("get_weather"),
                "{file}: {}",
                p.prompt.text()
            );
            assert!(
                p.prompt.text().contains("\"city\": \"Paris\""),
                "{file}: {}",
                p.prompt.text()
            );
            assert_eq!(
                p.tool_constraint.is_some(),
                choice != ToolChoice::None,
                "{file}"
            );
            assert_eq!(
                p.shape.tools,
                (choice != ToolChoice::None).then_some(format),
                "{file}"
            );
        }
    }
}
