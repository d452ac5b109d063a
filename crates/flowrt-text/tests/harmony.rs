//! The harmony format (gpt-oss): detection, the parser (whole and streamed at every split
//! point, malformed output, a property test that streaming equals whole), the end-of-generation
//! tokens of a harmony vocabulary, and rendering with a minimal harmony template
//! (tests/fixtures/text/templates/flowrt-harmony-minimal.jinja).

mod common;

use common::*;
use flowrt_text::harmony::{detect, HarmonyDelta, HarmonyError, HarmonyParse, HarmonyParser};
use flowrt_text::tools::ToolDelta;
use flowrt_text::{
    parse_harmony, ChatMessage, ChatTemplate, FunctionCall, ReasoningFormat, RenderOptions,
    Tokenizer, ToolCall, ToolFormat, ToolStreamParser,
};
use serde_json::{json, Map, Value};

fn harmony_template_source() -> String {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/text/templates/flowrt-harmony-minimal.jinja");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Feed `text` in the pieces that `cuts` (byte offsets, ascending, on char boundaries) make.
fn streamed(text: &str, cuts: &[usize], calls: bool, complete: bool) -> HarmonyParse {
    let mut p = HarmonyParser::new(calls);
    let mut deltas = Vec::new();
    let mut from = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        deltas.extend(p.push(&text[from..c]));
        from = c;
    }
    let (rest, err) = p.finish(complete);
    deltas.extend(rest);
    HarmonyParse::from_deltas(deltas, err)
}

/// Every split of `text` into two and into three pieces gives what the whole text gives.
fn check_every_split(text: &str, calls: bool) -> HarmonyParse {
    let whole = parse_harmony(text, calls);
    let bounds: Vec<usize> = (1..text.len())
        .filter(|&i| text.is_char_boundary(i))
        .collect();
    for &i in &bounds {
        assert_eq!(
            streamed(text, &[i], calls, true),
            whole,
            "split at {i}: {text:?}"
        );
        for &j in bounds.iter().filter(|&&j| j > i) {
            assert_eq!(
                streamed(text, &[i, j], calls, true),
                whole,
                "split at {i}, {j}: {text:?}"
            );
        }
    }
    let every: Vec<usize> = bounds.clone();
    assert_eq!(
        streamed(text, &every, calls, true),
        whole,
        "byte by byte: {text:?}"
    );
    whole
}

fn call(name: &str, args: Value) -> flowrt_text::ParsedCall {
    flowrt_text::ParsedCall {
        name: name.into(),
        arguments: args,
        id: None,
    }
}

const REASON_THEN_ANSWER: &str = "<|channel|>analysis<|message|>User greets. Reply <b>kindly</b>.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?";

const CALL_AFTER_CHANNEL: &str = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}";

const CALL_BEFORE_CHANNEL: &str =
    " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Zürich\"}";

#[test]
fn detection_is_from_the_template_or_the_vocabulary() {
    let src = harmony_template_source();
    let none: [&str; 0] = [];
    assert!(detect(Some(&src), none));
    assert_eq!(ToolFormat::detect(Some(&src), none), ToolFormat::Harmony);
    assert_eq!(
        ReasoningFormat::detect(Some(&src), none),
        ReasoningFormat::Harmony
    );
    assert!(ReasoningFormat::Harmony.supports_thinking());
    assert_eq!(ToolFormat::Harmony.name(), "harmony");
    assert_eq!(ReasoningFormat::Harmony.name(), "harmony");
    // Vocabulary only when there is no template.
    let vocab = ["a", "<|channel|>", "<|message|>", "<|return|>", "<|call|>"];
    assert!(detect(None, vocab));
    assert_eq!(ToolFormat::detect(None, vocab), ToolFormat::Harmony);
    assert!(!detect(None, ["<|channel|>", "<|message|>", "<|end|>"]));
    // A ChatML template in a harmony vocabulary is not harmony; a template that mentions only
    // one of the markers is not either.
    let chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    assert!(!detect(Some(chatml), vocab));
    assert!(!detect(Some("{{ '<|channel|>' }}"), vocab));
    assert_eq!(ToolFormat::detect(Some(chatml), vocab), ToolFormat::Generic);
    assert_eq!(
        ReasoningFormat::detect(Some(chatml), vocab),
        ReasoningFormat::None
    );
}

#[test]
fn analysis_is_reasoning_and_final_is_content() {
    let p = check_every_split(REASON_THEN_ANSWER, false);
    assert_eq!(p.reasoning, "User greets. Reply <b>kindly</b>.");
    assert_eq!(p.content, "Hello! How can I help?");
    assert!(p.calls.is_empty());
    assert_eq!(p.error, None);
    // With <|return|> written out (an output that keeps it), the same.
    let q = check_every_split(&format!("{REASON_THEN_ANSWER}<|return|>"), false);
    assert_eq!(q, p);
}

#[test]
fn a_message_to_a_function_is_a_call_wherever_the_recipient_is() {
    let p = check_every_split(CALL_AFTER_CHANNEL, true);
    assert_eq!(p.reasoning, "Need the weather.");
    assert_eq!(p.content, "");
    assert_eq!(
        p.calls,
        [call("get_weather", json!({"city": "Paris", "unit": "c"}))]
    );
    assert_eq!(p.error, None);
    let q = check_every_split(&format!("{CALL_AFTER_CHANNEL}<|call|>"), true);
    assert_eq!(q, p);

    let p = check_every_split(CALL_BEFORE_CHANNEL, true);
    assert_eq!(p.calls, [call("get_weather", json!({"city": "Zürich"}))]);
    assert_eq!((p.reasoning.as_str(), p.content.as_str()), ("", ""));
    assert_eq!(p.error, None);

    // `<|start|>assistant to=...` (the form the templates render) and an empty body.
    let text = "<|channel|>analysis<|message|>ok<|end|><|start|>assistant to=functions.now<|channel|>commentary <|constrain|>json<|message|><|call|>";
    let p = check_every_split(text, true);
    assert_eq!(p.calls, [call("now", json!({}))]);
}

#[test]
fn commentary_without_a_recipient_is_content() {
    let text = "<|channel|>analysis<|message|>Plan.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me look that up. <|end|><|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{\"q\": \"x\"}";
    let p = check_every_split(text, true);
    assert_eq!(p.reasoning, "Plan.");
    assert_eq!(p.content, "Let me look that up. ");
    assert_eq!(p.calls, [call("search", json!({"q": "x"}))]);
    // A preamble and a final answer: both content, in order.
    let text =
        "<|channel|>commentary<|message|>A<|end|><|start|>assistant<|channel|>final<|message|>B";
    assert_eq!(check_every_split(text, false).content, "AB");
}

#[test]
fn reasoning_and_content_stream_before_the_message_ends() {
    let mut p = HarmonyParser::new(false);
    assert_eq!(p.push("<|channel|>anal"), []);
    assert_eq!(
        p.push("ysis<|message|>Thinking"),
        [HarmonyDelta::Reasoning("Thinking".into())]
    );
    // A possible marker is held back until decided.
    assert_eq!(
        p.push(" hard<|e"),
        [HarmonyDelta::Reasoning(" hard".into())]
    );
    assert_eq!(
        p.push("nd|><|start|>assistant<|channel|>final<|message|>An"),
        [HarmonyDelta::Content("An".into())]
    );
    assert_eq!(p.push("swer <"), [HarmonyDelta::Content("swer ".into())]);
    assert_eq!(p.push("3"), [HarmonyDelta::Content("<3".into())]);
    assert_eq!(p.finish(true), (vec![], None));
}

#[test]
fn malformed_output_is_content_with_a_typed_error() {
    // Unknown channel: the message, from its start, and the rest are content.
    let text =
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>secret<|message|>x";
    let p = check_every_split(text, true);
    assert_eq!(p.reasoning, "hm");
    assert_eq!(p.content, "<|start|>assistant<|channel|>secret<|message|>x");
    assert!(
        matches!(p.error, Some(HarmonyError::UnknownChannel { index: 1, ref channel }) if channel == "secret")
    );

    // Arguments that are not JSON, or not an object.
    let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": ";
    let p = check_every_split(text, true);
    assert!(p.calls.is_empty());
    assert_eq!(p.content, text);
    assert!(matches!(
        p.error,
        Some(HarmonyError::BadJson { index: 0, .. })
    ));
    let text = "<|channel|>commentary to=functions.f<|message|>[1, 2]";
    let p = check_every_split(text, true);
    assert_eq!(
        (p.content.as_str(), p.error.clone()),
        (text, Some(HarmonyError::NotObject { index: 0 }))
    );

    // A recipient that is not a function, and a call when no tools were offered.
    let text = "<|channel|>commentary to=browser.search<|message|>{}";
    let p = check_every_split(text, true);
    assert_eq!(p.content, text);
    assert!(matches!(p.error, Some(HarmonyError::BadRecipient { .. })));
    let text = "<|channel|>commentary to=functions.f<|message|>{}";
    let p = check_every_split(text, false);
    assert_eq!(p.content, text);
    assert!(matches!(p.error, Some(HarmonyError::UnexpectedCall { ref name, .. }) if name == "f"));

    // The output ends inside a header.
    let text = "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>fin";
    let p = check_every_split(text, false);
    assert_eq!(
        (p.reasoning.as_str(), p.content.as_str()),
        ("r", "<|start|>assistant<|channel|>fin")
    );
    assert_eq!(p.error, Some(HarmonyError::Unterminated { index: 1 }));

    // Plain text where a header should be (a model that does not write harmony).
    let text = "Just an answer, no channels at all <|end|> and more";
    let p = check_every_split(text, false);
    assert_eq!(p.content, text);
    assert!(matches!(
        p.error,
        Some(HarmonyError::BadHeader { index: 0, .. })
    ));
    let long = "x".repeat(600);
    let p = check_every_split(&long, false);
    assert_eq!(p.content, long);
    assert!(matches!(p.error, Some(HarmonyError::BadHeader { .. })));

    // Text between messages that starts none.
    let text = "<|channel|>final<|message|>a<|end|>oops";
    let p = check_every_split(text, false);
    assert_eq!(p.content, "aoops");
    assert_eq!(p.error, Some(HarmonyError::Stray { index: 1 }));

    // Another role than the assistant's, and a header with no channel.
    let p = check_every_split(
        "<|channel|>final<|message|>a<|end|><|start|>user<|message|>b",
        false,
    );
    assert!(matches!(
        p.error,
        Some(HarmonyError::BadHeader { index: 1, .. })
    ));
    assert_eq!(p.content, "a<|start|>user<|message|>b");
}

#[test]
fn a_call_cut_short_is_content() {
    let text = "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\": 1}";
    let p = streamed(text, &[20], true, false);
    assert!(p.calls.is_empty());
    assert_eq!(p.content, text);
    assert_eq!(p.error, Some(HarmonyError::Unterminated { index: 0 }));
    let mut q = HarmonyParser::new(true);
    q.push("<|channel|>analysis<|message|>x<|end|><|start|>assistant");
    assert_eq!(q.first_call_offset(), None);
    q.push(" to=functions.f<|channel|>commentary<|message|>{}");
    assert_eq!(q.first_call_offset(), Some(38));
}

/// A small deterministic generator (xorshift) for the property test.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Random outputs built from harmony's pieces (well-formed messages, and marker fragments,
/// stray text and non-ASCII text that break the format): fed in random pieces they give what
/// they give whole, and the parser never panics. Well-formed ones give exactly their parts.
#[test]
fn property_streaming_equals_whole() {
    let texts = [
        "", "a", "héllo ", "<", "<|", "|>", "{}", "x <|e", "\n", "日本",
    ];
    let fragments = [
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "assistant",
        "<|call|>",
        "<|return|>",
        "<|constrain|>",
        "json",
        " to=functions.f",
        "analysis",
        "final",
        "commentary",
        "{\"k\": 1}",
        "oops",
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..3000 {
        let mut text = String::new();
        let (mut want_r, mut want_c, mut want_calls) = (String::new(), String::new(), Vec::new());
        let well_formed = case % 2 == 0;
        let n = 1 + rng.next() % 4;
        for k in 0..n {
            if well_formed {
                let body = format!("{}{}", rng.pick(&texts), rng.pick(&texts)).replace('<', "(");
                let head = if k == 0 {
                    ""
                } else {
                    "<|end|><|start|>assistant"
                };
                match rng.next() % 3 {
                    0 => {
                        text += &format!("{head}<|channel|>analysis<|message|>{body}");
                        want_r += &body;
                    }
                    1 => {
                        text += &format!("{head}<|channel|>final<|message|>{body}");
                        want_c += &body;
                    }
                    _ => {
                        text += &format!(
                            "{head}<|channel|>commentary to=functions.g{k} <|constrain|>json<|message|>{{\"n\": {k}}}"
                        );
                        want_calls.push(call(&format!("g{k}"), json!({"n": k})));
                    }
                }
            } else {
                for _ in 0..1 + rng.next() % 6 {
                    text += if rng.next().is_multiple_of(2) {
                        rng.pick(&fragments)
                    } else {
                        rng.pick(&texts)
                    };
                }
            }
        }
        let whole = parse_harmony(&text, true);
        if well_formed {
            assert_eq!(whole.error, None, "{text:?}");
            assert_eq!(
                (&whole.reasoning, &whole.content, &whole.calls),
                (&want_r, &want_c, &want_calls),
                "{text:?}"
            );
        }
        for _ in 0..4 {
            let mut cuts: Vec<usize> = (0..rng.next() % 8)
                .map(|_| (rng.next() as usize) % (text.len() + 1))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            cuts.sort_unstable();
            assert_eq!(
                streamed(&text, &cuts, true, true),
                whole,
                "cuts {cuts:?} of {text:?}"
            );
        }
    }
}

/// The tool parser of the other formats passes harmony through as content.
#[test]
fn the_plain_tool_parser_leaves_harmony_alone() {
    let mut p = ToolStreamParser::new(ToolFormat::Harmony);
    let d = p.push(CALL_AFTER_CHANNEL);
    assert_eq!(d, [ToolDelta::Content(CALL_AFTER_CHANNEL.into())]);
    assert_eq!(p.finish(), (vec![], None));
}

/// In a harmony vocabulary `<|return|>` and `<|call|>` end the generation and `<|end|>` does
/// not, also where the file names `<|end|>` as its end-of-turn token.
#[test]
fn harmony_turn_ends_are_the_end_of_generation_tokens() {
    let fx = fixture("bpe_ties.json");
    let mut v = gguf_vocab(&fx["vocab"]);
    let base = v.tokens.len() as u32;
    let marks = [
        "<|start|>",
        "<|channel|>",
        "<|message|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
    ];
    for m in marks {
        v.tokens.push(m.to_string());
        v.token_types
            .as_mut()
            .unwrap()
            .push(flowrt_text::token_type::CONTROL);
    }
    let id = |m: &str| base + marks.iter().position(|x| *x == m).unwrap() as u32;
    v.eos = Some(id("<|return|>"));
    v.eot = Some(id("<|end|>"));
    let t = Tokenizer::from_vocab(&v).unwrap();
    assert!(t.is_eog(id("<|return|>")));
    assert!(t.is_eog(id("<|call|>")));
    assert!(!t.is_eog(id("<|end|>")));
    assert!(!t.is_eog(id("<|start|>")));
    // Without <|call|> the vocabulary is not harmony: <|end|> stays an end of generation.
    let mut w = gguf_vocab(&fx["vocab"]);
    w.tokens.push("<|end|>".to_string());
    w.token_types
        .as_mut()
        .unwrap()
        .push(flowrt_text::token_type::CONTROL);
    let t = Tokenizer::from_vocab(&w).unwrap();
    assert!(t.is_eog(base));
}

fn rendered(messages: &[ChatMessage], tools: Option<&[Value]>, effort: Option<&str>) -> String {
    let t = ChatTemplate::new(&harmony_template_source(), "<|startoftext|>", "<|return|>").unwrap();
    let mut kwargs = Map::new();
    if let Some(e) = effort {
        kwargs.insert("reasoning_effort".into(), json!(e));
    }
    t.render_with(
        messages,
        &RenderOptions {
            add_generation_prompt: true,
            tools,
            kwargs: Some(&kwargs),
        },
    )
    .unwrap()
}

#[test]
fn the_harmony_template_renders_every_role() {
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
    ];
    let mut asst = ChatMessage {
        role: "assistant".into(),
        reasoning_content: Some("Need the weather.".into()),
        tool_calls: Some(vec![ToolCall {
            id: Some("call_1".into()),
            kind: "function".into(),
            function: FunctionCall {
                name: "get_weather".into(),
                arguments: json!({"city": "Paris"}),
            },
        }]),
        ..Default::default()
    };
    asst.content = None;
    let mut result = ChatMessage::new("tool", "{\"temp\": 21}");
    result.tool_call_id = Some("call_1".into());
    let messages = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Weather in Paris?"),
        asst,
        result,
        ChatMessage::new("assistant", "21 degrees."),
        ChatMessage::new("user", "Thanks"),
    ];
    let got = rendered(&messages, Some(&tools), Some("high"));
    let want = concat!(
        "<|start|>system<|message|>Reasoning: high\n\n# Valid channels: analysis, commentary, final. Function calls go to the commentary channel.<|end|>",
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n# Functions\n- get_weather: {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}\n<|end|>",
        "<|start|>user<|message|>Weather in Paris?<|end|>",
        "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"temp\\\": 21}\"<|end|>",
        "<|start|>assistant<|channel|>final<|message|>21 degrees.<|end|>",
        "<|start|>user<|message|>Thanks<|end|>",
        "<|start|>assistant",
    );
    assert_eq!(got, want);
    // Without tools or a system message, and the default effort.
    let got = rendered(&[ChatMessage::new("user", "Hi")], None, None);
    assert_eq!(
        got,
        "<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, final.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"
    );
    // What the model writes after that prompt reads back as the turn it rendered.
    let p = parse_harmony(
        "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
        true,
    );
    assert_eq!(p.reasoning, "Need the weather.");
    assert_eq!(p.calls, [call("get_weather", json!({"city": "Paris"}))]);
}
