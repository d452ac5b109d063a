//! Tool-call format detection, parsing (whole and streamed), the Generic prompt, and
//! reasoning separation, on the real templates of tests/fixtures/text/templates/ with the
//! conversations of tests/fixtures/text/tool_templates.json.

mod common;

use common::*;
use flowrt_text::reasoning::{prompt_ends_in_reasoning, split_reasoning, ReasoningDelta};
use flowrt_text::tools::{generic_messages, ToolDelta, ToolParseError};
use flowrt_text::{
    parse_tool_calls, ChatMessage, ChatTemplate, ReasoningFormat, ReasoningSplitter, RenderOptions,
    ToolFormat, ToolParse, ToolStreamParser,
};
use serde_json::{Map, Value};

fn template_source(fx: &Value, name: &str) -> String {
    let file = str_of(&fx["templates"][name], "file");
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/text")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn compile(fx: &Value, name: &str) -> ChatTemplate {
    let t = &fx["templates"][name];
    ChatTemplate::new(
        &template_source(fx, name),
        str_of(t, "bos_token"),
        str_of(t, "eos_token"),
    )
    .unwrap()
}

fn conversation(fx: &Value, name: &str) -> Vec<ChatMessage> {
    serde_json::from_value(fx["conversations"][name]["messages"].clone()).unwrap()
}

fn tools(fx: &Value) -> Vec<Value> {
    fx["tools"].as_array().unwrap().clone()
}

fn template_names(fx: &Value) -> Vec<String> {
    fx["templates"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect()
}

/// The kwargs the goldens use for a template (Llama's fixed date).
fn kwargs_for(name: &str) -> Map<String, Value> {
    let mut m = Map::new();
    if name.contains("Llama-3") {
        m.insert("date_string".into(), "14 Mar 2025".into());
    }
    m
}

fn smollm2_template() -> ChatTemplate {
    let fx = fixture("smollm2_chat.json");
    ChatTemplate::new(
        str_of(&fx["templates"], "smollm2"),
        str_of(&fx, "bos_token"),
        str_of(&fx, "eos_token"),
    )
    .unwrap()
}

#[test]
fn detects_formats_of_real_templates() {
    let fx = fixture("tool_templates.json");
    let none: [&str; 0] = [];
    for name in template_names(&fx) {
        let src = template_source(&fx, &name);
        let want = if name.starts_with("Qwen") || name.starts_with("NousResearch") {
            ToolFormat::Hermes
        } else if name.starts_with("meta-llama") {
            ToolFormat::Llama3Json
        } else if name.starts_with("mistralai") {
            ToolFormat::Mistral
        } else {
            ToolFormat::Generic // DeepSeek-R1 distill: its own call syntax is not supported
        };
        assert_eq!(ToolFormat::detect(Some(&src), none), want, "{name}");
        let think = name.starts_with("Qwen-Qwen3") || name.starts_with("deepseek");
        assert_eq!(
            ReasoningFormat::detect(Some(&src), none).supports_thinking(),
            think,
            "{name}"
        );
    }
    let smol = fixture("smollm2_chat.json");
    let smol_src = str_of(&smol["templates"], "smollm2");
    assert_eq!(
        ToolFormat::detect(Some(smol_src), ["<|im_start|>", "<|im_end|>"]),
        ToolFormat::Generic
    );
    assert_eq!(ToolFormat::detect(None, none), ToolFormat::Generic);
    assert_eq!(
        ReasoningFormat::detect(Some(smol_src), none),
        ReasoningFormat::None
    );
    assert!(ReasoningFormat::None.require_thinking().is_err());
    // The vocabulary alone: both tags as tokens.
    assert_eq!(
        ReasoningFormat::detect(Some(smol_src), ["<think>", "x", "</think>"]),
        ReasoningFormat::Think
    );
    assert_eq!(
        ReasoningFormat::detect(None, ["<think>"]),
        ReasoningFormat::None
    );
    // `"parameters"` calls with the python tag only in the vocabulary.
    assert_eq!(
        ToolFormat::detect(Some("{{ '\"parameters\": ' }}"), ["<|python_tag|>"]),
        ToolFormat::Llama3Json
    );
}

/// Feed `text` to a stream parser in pieces of `size` characters; the deltas, merged.
fn stream_parse(format: ToolFormat, text: &str, size: usize) -> ToolParse {
    let mut p = ToolStreamParser::new(format);
    let chars: Vec<char> = text.chars().collect();
    let mut deltas = Vec::new();
    for piece in chars.chunks(size) {
        deltas.extend(p.push(&piece.iter().collect::<String>()));
    }
    let (rest, error) = p.finish();
    deltas.extend(rest);
    ToolParse::from_deltas(deltas, error)
}

fn assert_stream_matches(format: ToolFormat, text: &str) -> ToolParse {
    let whole = parse_tool_calls(format, text);
    for size in [1, 2, 3, 5, 7, 13, 1000] {
        assert_eq!(
            stream_parse(format, text, size),
            whole,
            "{format:?} in pieces of {size}: {text:?}"
        );
    }
    whole
}

/// The text a template renders for message `k` (an assistant turn), without its end-of-turn
/// marker: the render of `messages[..=k]` minus the prompt `messages[..k]` with a generation
/// prompt. Also returns that prompt.
fn assistant_part(
    t: &ChatTemplate,
    name: &str,
    messages: &[ChatMessage],
    k: usize,
    tools: &[Value],
) -> Option<(String, String)> {
    let kw = kwargs_for(name);
    let opts = |add| RenderOptions {
        add_generation_prompt: add,
        tools: Some(tools),
        kwargs: Some(&kw),
    };
    let prompt = t.render_with(&messages[..k], &opts(true)).ok()?;
    let full = t.render_with(&messages[..=k], &opts(false)).ok()?;
    // Mistral puts the system message into the *last* user turn, so its prompt is not a
    // prefix of the longer render: cut after the last `[/INST]` instead.
    let part = match full.strip_prefix(&prompt) {
        Some(p) => p,
        None if name.starts_with("mistralai") => {
            let at = full.rfind("[/INST]").unwrap() + "[/INST]".len();
            &full[at..]
        }
        None => panic!("{name}: the prompt is not a prefix of the full render"),
    };
    let mut part = part.to_string();
    for end in ["<|im_end|>\n", "<|eot_id|>", "</s>"] {
        if let Some(p) = part.strip_suffix(end) {
            part = p.to_string();
            break;
        }
    }
    Some((prompt, part))
}

#[test]
fn rendered_tool_calls_parse_back() {
    let fx = fixture("tool_templates.json");
    let tools = tools(&fx);
    let mut checked = 0;
    for name in template_names(&fx) {
        let src = template_source(&fx, &name);
        let format = ToolFormat::detect(Some(&src), std::iter::empty());
        if format == ToolFormat::Generic {
            continue;
        }
        let t = compile(&fx, &name);
        for conv in ["one_call", "one_call_with_text", "parallel_calls"] {
            let messages = conversation(&fx, conv);
            let k = messages
                .iter()
                .position(|m| m.tool_calls.is_some())
                .unwrap();
            let Some((prompt, part)) = assistant_part(&t, &name, &messages, k, &tools) else {
                // Llama 3 refuses parallel calls (a golden error case).
                assert!(
                    name.contains("Llama") && conv == "parallel_calls",
                    "{name} {conv}"
                );
                continue;
            };
            let (_, content) = split_reasoning(prompt_ends_in_reasoning(&prompt), &part);
            let parsed = assert_stream_matches(format, &content);
            let want = messages[k].tool_calls.as_ref().unwrap();
            assert_eq!(parsed.error, None, "{name} {conv}: {part:?}");
            assert_eq!(parsed.calls.len(), want.len(), "{name} {conv}: {part:?}");
            for (got, want) in parsed.calls.iter().zip(want) {
                assert_eq!(got.name, want.function.name, "{name} {conv}");
                assert_eq!(got.arguments, want.function.arguments, "{name} {conv}");
                if format == ToolFormat::Mistral {
                    assert_eq!(got.id, want.id, "{name} {conv}");
                }
            }
            let text = messages[k].text();
            if part.contains(text) {
                assert_eq!(parsed.content, text, "{name} {conv}: {part:?}");
            }
            checked += 1;
        }
    }
    eprintln!("{checked} rendered assistant turns parsed back");
    assert!(checked >= 14, "{checked}");
}

#[test]
fn stream_holds_back_marker_prefixes_only() {
    let mut p = ToolStreamParser::new(ToolFormat::Hermes);
    assert_eq!(
        p.push("Let me look. <tool_"),
        vec![ToolDelta::Content("Let me look.".into())]
    );
    // Not a marker after all: the held text is content.
    assert_eq!(
        p.push("box> done"),
        vec![ToolDelta::Content(" <tool_box> done".into())]
    );
    let mut p = ToolStreamParser::new(ToolFormat::Llama3Json);
    assert_eq!(p.push("  <|python"), vec![]);
    assert_eq!(
        p.push("_tag|>{\"name\": \"f\", \"parameters\": {}}"),
        vec![]
    );
    let (deltas, err) = p.finish();
    assert_eq!(err, None);
    assert!(matches!(&deltas[..], [ToolDelta::Call(c)] if c.name == "f"));
    let mut p = ToolStreamParser::new(ToolFormat::Generic);
    assert_eq!(
        p.push("Plain answer"),
        vec![ToolDelta::Content("Plain answer".into())]
    );
}

#[test]
fn malformed_calls_are_kept_as_content_with_an_error() {
    let cases = [
        (
            ToolFormat::Hermes,
            "Hi\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {oops}}\n</tool_call>",
            1,
        ),
        (ToolFormat::Hermes, "x <tool_call>\n{\"name\": \"b\", \"argu", 0),
        (ToolFormat::Hermes, "<tool_call>[1, 2]</tool_call>", 0),
        (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": 3}]", 0),
        (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": \"f\", \"argu", 0),
        (ToolFormat::Mistral, "[TOOL_CALLS]{\"name\": \"f\"}", 0),
        (ToolFormat::Llama3Json, "<|python_tag|>{\"name\": \"f\", ", 0),
        (ToolFormat::Llama3Json, "<|python_tag|>{\"nome\": \"f\"}", 0),
        (ToolFormat::Llama3Json, "{\"name\": \"f\", \"parameters\": [", 0),
        (ToolFormat::Generic, "{\"tool_calls\": [{\"arguments\": {}}]}", 0),
        (ToolFormat::Generic, "{\"tool_calls\": [", 0),
        (ToolFormat::Generic, "{\"answer\": 1}", 0),
    ];
    for (format, text, calls) in cases {
        let p = assert_stream_matches(format, text);
        assert!(p.error.is_some(), "{format:?} {text:?}: {p:?}");
        assert_eq!(p.calls.len(), calls, "{format:?} {text:?}");
        // Nothing is dropped: every non-space character of the text that is not in a parsed
        // call is in the content.
        let strip = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert!(
            strip(text).ends_with(&strip(p.content.trim_start_matches("Hi"))),
            "{format:?} {text:?}: {p:?}"
        );
    }
    // Plain JSON content is not an error for Llama3Json and plain text is not for Generic.
    let p = parse_tool_calls(ToolFormat::Llama3Json, "{\"answer\": 42}");
    assert_eq!((p.error, p.content.as_str()), (None, "{\"answer\": 42}"));
    let p = parse_tool_calls(ToolFormat::Generic, "no json here");
    assert_eq!((p.error, p.content.as_str()), (None, "no json here"));
    assert!(matches!(
        parse_tool_calls(ToolFormat::Hermes, "<tool_call>").error,
        Some(ToolParseError::Unterminated { index: 0 })
    ));
}

#[test]
fn hostile_inputs_do_not_panic() {
    let texts = [
        "",
        "\u{0}",
        "<tool_call></tool_call></tool_call><tool_call>",
        "[TOOL_CALLS][TOOL_CALLS]]]]",
        "{{{{{{{{{{{{",
        "é<tool_callé>ü</tool_call>",
        "<|python_tag|><|python_tag|>",
        "\u{feff}{\"tool_calls\": {}}",
        "<think><think></think></think>",
    ];
    let deep = "[".repeat(10_000);
    for format in [
        ToolFormat::Hermes,
        ToolFormat::Llama3Json,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ] {
        for t in texts.iter().copied().chain([deep.as_str()]) {
            let _ = assert_stream_matches(format, t);
            let _ = assert_stream_matches(format, &format!("[TOOL_CALLS]{t}"));
            let _ = assert_stream_matches(format, &format!("<tool_call>{t}"));
        }
    }
    for t in texts {
        let _ = split_reasoning(true, t);
        let _ = split_reasoning(false, t);
    }
}

#[test]
fn generic_prompt_makes_a_tool_conversation_work_on_smollm2() {
    let fx = fixture("tool_templates.json");
    let tools = tools(&fx);
    let messages = conversation(&fx, "parallel_calls");
    let rewritten = generic_messages(&messages, &tools);
    // The system message gained the tools; the two tool results became one user message.
    assert_eq!(rewritten.len(), messages.len() - 1);
    assert_eq!(rewritten[0].role, "system");
    let sys = rewritten[0].text();
    assert!(sys.starts_with(messages[0].text()));
    for tool in &tools {
        let f = &tool["function"];
        assert!(sys.contains(f["name"].as_str().unwrap()));
        assert!(sys.contains(f["description"].as_str().unwrap()));
        assert!(sys.contains(&f["parameters"].to_string()));
    }
    assert!(rewritten
        .iter()
        .all(|m| m.role != "tool" && m.tool_calls.is_none()));
    let results = rewritten
        .iter()
        .find(|m| m.text().starts_with("Tool results:"))
        .unwrap();
    assert_eq!(results.role, "user");
    for m in messages.iter().filter(|m| m.role == "tool") {
        assert!(results.text().contains(m.tool_call_id.as_deref().unwrap()));
    }
    // Earlier assistant turns are written in the answer format and parse back.
    let k = messages
        .iter()
        .position(|m| m.tool_calls.is_some())
        .unwrap();
    let back = parse_tool_calls(ToolFormat::Generic, rewritten[k].text());
    let want = messages[k].tool_calls.as_ref().unwrap();
    assert_eq!(back.error, None);
    assert_eq!(
        back.calls
            .iter()
            .map(|c| (&c.name, &c.arguments))
            .collect::<Vec<_>>(),
        want.iter()
            .map(|c| (&c.function.name, &c.function.arguments))
            .collect::<Vec<_>>()
    );
    let answer = rewritten
        .iter()
        .rev()
        .find(|m| m.role == "assistant")
        .unwrap();
    let back = parse_tool_calls(ToolFormat::Generic, answer.text());
    assert_eq!(back.content, messages[k + 3].text());
    // SmolLM2's template renders it (no tool support of its own).
    let rendered = smollm2_template().render(&rewritten, true).unwrap();
    assert!(rendered.contains("search_flights"));
    assert!(rendered.ends_with("<|im_start|>assistant\n"));
    // Without a system message, one is added.
    let first_user = &messages[1..2];
    let r = generic_messages(first_user, &tools);
    assert_eq!((r.len(), r[0].role.as_str()), (2, "system"));
    // Without tools nothing changes.
    assert_eq!(
        generic_messages(&messages[..2], &[]),
        messages[..2].to_vec()
    );
}

fn stream_split(in_reasoning: bool, text: &str, size: usize) -> (String, String) {
    let mut s = ReasoningSplitter::new(in_reasoning);
    let chars: Vec<char> = text.chars().collect();
    let mut deltas = Vec::new();
    for piece in chars.chunks(size) {
        deltas.extend(s.push(&piece.iter().collect::<String>()));
    }
    deltas.extend(s.finish());
    let (mut r, mut c) = (String::new(), String::new());
    for d in deltas {
        match d {
            ReasoningDelta::Reasoning(x) => r.push_str(&x),
            ReasoningDelta::Content(x) => c.push_str(&x),
        }
    }
    (r, c)
}

#[test]
fn reasoning_with_the_real_qwen3_and_deepseek_templates() {
    let fx = fixture("tool_templates.json");
    let qwen3 = compile(&fx, "Qwen-Qwen3-0.6B");
    let deepseek = compile(&fx, "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
    let question = conversation(&fx, "reasoning_history");
    let thinking = |on: bool| {
        let mut m = Map::new();
        m.insert("enable_thinking".into(), Value::Bool(on));
        m
    };
    let render = |t: &ChatTemplate, kw: Option<&Map<String, Value>>| {
        t.render_with(
            &question,
            &RenderOptions {
                add_generation_prompt: true,
                tools: None,
                kwargs: kw,
            },
        )
        .unwrap()
    };
    // Qwen3 lets the model open <think>; with enable_thinking=false the prompt closes it.
    let on = render(&qwen3, Some(&thinking(true)));
    let off = render(&qwen3, Some(&thinking(false)));
    assert!(!prompt_ends_in_reasoning(&on));
    assert!(off.ends_with("</think>\n\n") && !prompt_ends_in_reasoning(&off));
    // DeepSeek-R1 opens it in the prompt.
    let ds = render(&deepseek, None);
    assert!(prompt_ends_in_reasoning(&ds));

    // Qwen3's render of an assistant turn with reasoning splits back into the same parts.
    let messages = conversation(&fx, "reasoning_last_assistant");
    let opts = |add| RenderOptions {
        add_generation_prompt: add,
        tools: None,
        kwargs: None,
    };
    let prompt = qwen3.render_with(&messages[..1], &opts(true)).unwrap();
    let full = qwen3.render_with(&messages, &opts(false)).unwrap();
    let part = full
        .strip_prefix(&prompt)
        .unwrap()
        .strip_suffix("<|im_end|>\n")
        .unwrap();
    let want_r = messages[1]
        .reasoning_content
        .as_deref()
        .unwrap()
        .trim_matches('\n');
    let (r, c) = split_reasoning(prompt_ends_in_reasoning(&prompt), part);
    assert_eq!(
        (r.as_deref(), c.as_str()),
        (Some(want_r), messages[1].text())
    );
    for size in [1, 2, 3, 4, 7, 100] {
        assert_eq!(
            stream_split(false, part, size),
            (want_r.to_string(), c.clone()),
            "pieces of {size}"
        );
    }
    // The same answer after DeepSeek's prompt: no <think> in the output.
    let after_open = part.strip_prefix("<think>").unwrap();
    for size in [1, 3, 100] {
        assert_eq!(
            stream_split(true, after_open, size),
            (want_r.to_string(), c.clone())
        );
    }
    // No reasoning block: all content, reasoning None.
    assert_eq!(split_reasoning(false, "\n4"), (None, "\n4".to_string()));
    // A partial tag is held back, then released as what it turned out to be.
    let mut s = ReasoningSplitter::new(true);
    assert_eq!(
        s.push("a </thi"),
        vec![ReasoningDelta::Reasoning("a ".into())]
    );
    assert_eq!(
        s.push("nk>\n\nb"),
        vec![ReasoningDelta::Content("b".into())]
    );
    let mut s = ReasoningSplitter::new(true);
    assert_eq!(
        s.push("a </thi"),
        vec![ReasoningDelta::Reasoning("a ".into())]
    );
    assert_eq!(
        s.push("s"),
        vec![ReasoningDelta::Reasoning("</this".into())]
    );
    // Truncated inside the reasoning: it stays reasoning.
    assert_eq!(
        split_reasoning(false, "<think>\nhalf a thou"),
        (Some("half a thou".to_string()), String::new())
    );
}
