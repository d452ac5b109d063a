//! Chat templates rendered in memory-capped workers (`flowrt_text::sandbox`), as every
//! `flowrt` command renders them: the same prompts as in-process rendering, and the hostile
//! templates that in-process bounds cannot stop (memory built by operators alone, slow
//! operators that never read the clock) stopped with a clear error, the parent's memory
//! untouched and the next render served by a fresh worker.
//!
//! One test: the sandbox is installed once per process, and the in-process half must run
//! before it is.

use std::path::Path;
use std::time::{Duration, Instant};

use flowrt_text::{sandbox, ChatMessage, ChatTemplate, RenderOptions, TextError};
use serde_json::Value;

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/text")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

/// Every case of the real-template fixture (tools, tool calls, reasoning, kwargs, expected
/// errors), rendered with the current renderer: the prompt, or the error's text.
fn render_all(fx: &Value) -> Vec<Result<String, String>> {
    let tools: Vec<Value> = fx["tools"].as_array().unwrap().clone();
    let mut out = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let tname = text(case, "template");
        let t = &fx["templates"][&tname];
        let source = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/text")
                .join(text(t, "file")),
        )
        .unwrap();
        let tmpl = ChatTemplate::new(&source, &text(t, "bos_token"), &text(t, "eos_token"))
            .unwrap_or_else(|e| panic!("{tname}: {e}"));
        let conv = &fx["conversations"][text(case, "conversation")];
        let messages: Vec<ChatMessage> = serde_json::from_value(conv["messages"].clone()).unwrap();
        let got = tmpl.render_with(
            &messages,
            &RenderOptions {
                add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                tools: (conv["tools"] == true).then_some(tools.as_slice()),
                kwargs: case["kwargs"].as_object(),
            },
        );
        out.push(got.map_err(|e| e.to_string()));
    }
    out
}

fn render(source: &str) -> Result<String, TextError> {
    ChatTemplate::new(source, "<s>", "</s>")
        .unwrap()
        .render(&[ChatMessage::new("user", "hi")], true)
}

#[test]
fn templates_render_in_memory_capped_workers() {
    let fx = fixture("tool_templates.json");
    assert!(!sandbox::installed());
    let local = render_all(&fx);

    sandbox::install(env!("CARGO_BIN_EXE_flowrt")).unwrap();
    assert!(sandbox::installed());
    let remote = render_all(&fx);
    assert_eq!(local.len(), remote.len());
    let mut errors = 0;
    for (i, (l, r)) in local.iter().zip(&remote).enumerate() {
        match (l, r) {
            (Ok(l), Ok(r)) => assert_eq!(l, r, "case {i}: the prompt differs"),
            (Err(l), Err(r)) => {
                errors += 1;
                assert!(r.starts_with(l.as_str()), "case {i}: {l:?} became {r:?}")
            }
            _ => panic!("case {i}: in-process {l:?}, in a worker {r:?}"),
        }
    }
    eprintln!(
        "{} renders equal in-process and in workers ({errors} of them errors)",
        local.len()
    );
    assert!(errors > 0, "the fixture's expected errors went missing");

    // Doubling a string thirty-odd times: a few dozen instructions, gigabytes of memory.
    let before = flowrt_testkit::peak_rss_kib("self");
    let t0 = Instant::now();
    let err = render(
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    )
    .unwrap_err();
    let took = t0.elapsed();
    eprintln!("doubling: {err} after {took:?}");
    assert!(
        matches!(err, TextError::TemplateMemory { limit } if limit == sandbox::MAX_RENDER_MEMORY),
        "{err:?}"
    );
    assert!(err.to_string().contains("1024 MiB"), "{err}");
    let grew = flowrt_testkit::peak_rss_kib("self").saturating_sub(before);
    assert!(
        grew < 64 << 10,
        "the parent's peak RSS grew by {grew} KiB: the render ran in-process"
    );

    // The next render gets a fresh worker.
    assert_eq!(render("{{ messages[0].content }}!").unwrap(), "hi!");

    // Operators alone never read the render clock: copying a 50 MB string a thousand times
    // stays within the fuel and the memory cap, and only the parent's deadline stops it.
    let t0 = Instant::now();
    let err = render(
        "{% set s = 'x' * 50000000 %}{% for i in range(1000) %}{% set t = s ~ 'y' %}{% endfor %}done",
    )
    .unwrap_err();
    let took = t0.elapsed();
    eprintln!("slow operators: {err} after {took:?}");
    assert!(matches!(err, TextError::TemplateTimeout { .. }), "{err:?}");
    assert!(took < Duration::from_secs(30), "{took:?}");

    // Errors keep their kind and message across the process boundary.
    let err = render("{{ raise_exception('no system message here') }}").unwrap_err();
    assert!(err.to_string().contains("no system message here"), "{err}");
    let err =
        render("{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}")
            .unwrap_err();
    assert!(err.to_string().contains("fuel"), "{err}");

    // Renders from several threads at once, each answered with its own prompt.
    let handles: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let t = ChatTemplate::new("{{ messages[0].content }}", "", "").unwrap();
                for j in 0..20 {
                    let msg = format!("thread {i} message {j}");
                    let got = t.render(&[ChatMessage::new("user", &msg)], false).unwrap();
                    assert_eq!(got, msg);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
