//! Chat templates against transformers' apply_chat_template (tests/fixtures/text/smollm2_chat.json).

mod common;

use common::*;
use flowrt_text::{ChatMessage, ChatTemplate, GgufVocab, TextError};

fn messages(v: &serde_json::Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(str_of(m, "role"), str_of(m, "content")))
        .collect()
}

#[test]
fn renders_match_transformers() {
    let fx = fixture("smollm2_chat.json");
    let (bos, eos) = (str_of(&fx, "bos_token"), str_of(&fx, "eos_token"));
    let cases = fx["cases"].as_array().unwrap();
    let mut failures = Vec::new();
    for case in cases {
        let name = format!(
            "{} / {} / add_generation_prompt={}",
            str_of(case, "template"),
            str_of(case, "name"),
            case["add_generation_prompt"]
        );
        let source = str_of(&fx["templates"], str_of(case, "template"));
        let tmpl = ChatTemplate::new(source, bos, eos).unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = tmpl.render(
            &messages(&case["messages"]),
            case["add_generation_prompt"].as_bool().unwrap(),
        );
        match (case.get("expected"), got) {
            (Some(want), Ok(got)) if want.as_str() == Some(got.as_str()) => {}
            (Some(want), got) => failures.push(format!("{name}:\n  want {want}\n  got  {got:?}")),
            (None, Err(TextError::TemplateRender(e))) => {
                let msg = str_of(case, "error");
                if !e.to_string().contains(msg) {
                    failures.push(format!("{name}: error {e} does not mention {msg:?}"));
                }
            }
            (None, got) => failures.push(format!(
                "{name}: want error {:?}, got {got:?}",
                case["error"]
            )),
        }
    }
    eprintln!(
        "{}/{} renders match",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "{} mismatches, first:\n{}",
        failures.len(),
        failures[0]
    );
}

#[test]
fn template_comes_from_the_gguf() {
    let v = smollm2_vocab();
    let fx = fixture("smollm2_chat.json");
    let tmpl = ChatTemplate::from_vocab(&v)
        .unwrap()
        .expect("SmolLM2 has a chat template");
    let conv = [ChatMessage::new("user", "Hello!")];
    let want = fx["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            str_of(c, "template") == "smollm2"
                && str_of(c, "name") == "single_user"
                && c["add_generation_prompt"] == true
        })
        .unwrap();
    assert_eq!(tmpl.render(&conv, true).unwrap(), str_of(want, "expected"));
}

#[test]
fn no_template_is_none_not_a_substitute() {
    let v = GgufVocab {
        model: "gpt2".into(),
        tokens: vec!["a".into()],
        ..Default::default()
    };
    assert!(ChatTemplate::from_vocab(&v).unwrap().is_none());
}

#[test]
fn strftime_now_formats_local_time() {
    let t = ChatTemplate::new(
        "{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%d %B %Y') }}",
        "",
        "",
    )
    .unwrap();
    let before = chrono::Local::now();
    let got = t.render(&[], false).unwrap();
    let after = chrono::Local::now();
    let fmt = |d: chrono::DateTime<chrono::Local>| {
        format!("{}|{}", d.format("%Y-%m-%d"), d.format("%d %B %Y"))
    };
    assert!(got == fmt(before) || got == fmt(after), "{got}");
    assert!(ChatTemplate::new("{{ strftime_now('%Q') }}", "", "")
        .unwrap()
        .render(&[], false)
        .is_err());
}

#[test]
fn runaway_template_runs_out_of_fuel() {
    let t = ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let err = t.render(&[], false).unwrap_err();
    assert!(err.to_string().contains("fuel"), "{err}");
}

#[test]
fn a_template_that_writes_too_much_is_stopped_with_an_error() {
    // 100,000 copies of a 2 KB message: 200 MB of prompt from a few instructions per loop,
    // well within the fuel; the output limit ends it with its own error.
    let t = ChatTemplate::new(
        "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    let msgs = [ChatMessage::new("user", "x".repeat(2048))];
    let err = t.render(&msgs, false).unwrap_err();
    assert!(matches!(err, TextError::TemplateTooLong { .. }), "{err}");
    assert!(err.to_string().contains("bytes"), "{err}");
    // Just under the limit renders.
    let n = flowrt_text::MAX_RENDERED_BYTES / 2048;
    let t = ChatTemplate::new(
        &format!("{{% for i in range({n}) %}}{{{{ messages[0].content }}}}{{% endfor %}}"),
        "",
        "",
    )
    .unwrap();
    assert_eq!(t.render(&msgs, false).unwrap().len(), n * 2048);
}

#[test]
fn a_template_that_runs_too_long_is_stopped_with_an_error() {
    // Each iteration is a few instructions but serialises (or rewrites) a 60 KB message:
    // minutes of work within the fuel. The render's clock stops it.
    let msgs = [ChatMessage::new("user", "x".repeat(60_000))];
    for body in [
        "{% set x = messages|tojson %}",
        "{% set x = messages[0].content.replace('x', 'yy') %}",
    ] {
        let t = ChatTemplate::new(
            &format!("{{% for i in range(100000) %}}{body}{{% endfor %}}done"),
            "",
            "",
        )
        .unwrap();
        let t0 = std::time::Instant::now();
        let err = t.render(&msgs, false).unwrap_err();
        let took = t0.elapsed();
        assert!(
            matches!(err, TextError::TemplateTimeout { .. }),
            "{body}: {err}"
        );
        assert!(
            took < flowrt_text::RENDER_TIME_LIMIT + std::time::Duration::from_secs(3),
            "{body}: stopped after {took:?}"
        );
    }
    // The same loop over a short message finishes well within the limit.
    let t = ChatTemplate::new(
        "{% for i in range(1000) %}{% set x = messages|tojson %}{% endfor %}done",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "hi")], false).unwrap(),
        "done"
    );
}

#[test]
fn tojson_refuses_huge_lists_and_separators() {
    let render = |src: &str| {
        ChatTemplate::new(src, "", "")
            .unwrap()
            .render(&[], false)
            .map_err(|e| e.to_string())
    };
    // A lazily repeated list claims a billion items: refused before collecting them.
    let err = render("{{ (['x'] * 1000000000)|tojson }}").unwrap_err();
    assert!(err.contains("items"), "{err}");
    let err = render("{{ [1, 2]|tojson(indent='x' * 1000) }}").unwrap_err();
    assert!(err.contains("indent"), "{err}");
    let err = render("{{ [1, 2]|tojson(separators=[',' * 1000, ':']) }}").unwrap_err();
    assert!(err.contains("separator"), "{err}");
    assert_eq!(
        render("{{ [1, 2]|tojson(indent=2) }}").unwrap(),
        "[\n  1,\n  2\n]"
    );
}

#[test]
fn runaway_recursion_in_a_template_is_an_error() {
    let t = ChatTemplate::new(
        "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "",
        "",
    )
    .unwrap();
    let err = t.render(&[], false).unwrap_err();
    assert!(err.to_string().contains("recursion"), "{err}");
}

#[test]
fn syntax_errors_are_reported_at_construction() {
    let err = ChatTemplate::new("{% for m in messages %}", "", "").unwrap_err();
    assert!(matches!(err, TextError::TemplateSyntax(_)), "{err}");
}
