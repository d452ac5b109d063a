//! `StopMatcher` against a whole-text reference, over random texts, stop strings and
//! chunkings.

use flowrt_sample::StopMatcher;
use proptest::prelude::*;

/// The reference: text before the earliest occurrence of any (non-empty) stop string.
fn reference<'a>(text: &'a str, stops: &[String]) -> (&'a str, bool) {
    match stops
        .iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| text.find(s.as_str()))
        .min()
    {
        Some(at) => (&text[..at], true),
        None => (text, false),
    }
}

/// Feeds `pieces` through a matcher; returns everything emitted and whether it stopped.
/// Also checks that nothing is emitted once a stop has been reported.
fn stream(stops: &[String], pieces: &[&str]) -> (String, bool) {
    let mut m = StopMatcher::new(stops.to_vec());
    let mut shown = String::new();
    let mut stopped = false;
    for p in pieces {
        let r = m.push(p);
        if stopped {
            assert_eq!(r.emit, "", "emitted text after the stop");
            assert!(r.stopped);
            continue;
        }
        shown.push_str(r.emit);
        stopped = r.stopped;
    }
    if !stopped {
        let r = m.finish();
        shown.push_str(r.emit);
        stopped = r.stopped;
    }
    assert_eq!(m.is_stopped(), stopped);
    (shown, stopped)
}

/// Splits `text` at char boundaries into pieces of the given char lengths (cycled).
fn chunk<'a>(text: &'a str, lens: &[usize]) -> Vec<&'a str> {
    let bounds: Vec<usize> = text
        .char_indices()
        .map(|(i, _)| i)
        .chain([text.len()])
        .collect();
    let mut pieces = Vec::new();
    let (mut at, mut k) = (0, 0);
    while at < bounds.len() - 1 {
        let n = lens[k % lens.len()];
        let end = (at + n).min(bounds.len() - 1);
        pieces.push(&text[bounds[at]..bounds[end]]); // n may be 0: empty pieces too
        at = end;
        k += 1;
        if k > 10 * bounds.len() + 10 {
            break; // all-zero lengths
        }
    }
    if at < bounds.len() - 1 {
        pieces.push(&text[bounds[at]..]);
    }
    pieces
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn emitted_text_is_text_before_first_stop(
        text in "[abé]{0,40}",
        stops in prop::collection::vec("[abé]{0,4}", 0..4),
        lens in prop::collection::vec(0usize..7, 1..8),
    ) {
        let pieces = chunk(&text, &lens);
        prop_assert_eq!(pieces.concat(), text.clone());
        let (want, want_stop) = reference(&text, &stops);
        let (got, got_stop) = stream(&stops, &pieces);
        prop_assert_eq!(got, want);
        prop_assert_eq!(got_stop, want_stop);
    }
}

#[test]
fn holds_back_only_what_could_start_a_stop() {
    let mut m = StopMatcher::new(vec!["</s>".into()]);
    assert_eq!(m.push("hello").emit, "hello");
    assert_eq!(m.push(" wor<").emit, " wor");
    assert_eq!(m.push("/").emit, "");
    let r = m.push("x>");
    assert_eq!((r.emit, r.stopped), ("</x>", false));
    let r = m.push("ok</");
    assert_eq!((r.emit, r.stopped), ("ok", false));
    let r = m.push("s>tail");
    assert_eq!((r.emit, r.stopped), ("", true));
    assert_eq!(m.matched_stop(), Some("</s>"));
    assert_eq!(m.push("more").emit, "");
}

#[test]
fn waits_for_an_earlier_longer_stop_before_stopping_at_a_later_one() {
    // "bc" completes first, but "abcd" starts earlier; the stream must wait to see
    // whether "abcd" completes.
    let stops: Vec<String> = vec!["bc".into(), "abcd".into()];
    assert_eq!(stream(&stops, &["x", "abc", "d"]), ("x".into(), true));
    assert_eq!(stream(&stops, &["x", "abc", "e"]), ("xa".into(), true));
    assert_eq!(stream(&stops, &["x", "abc"]), ("xa".into(), true)); // decided at finish
}

#[test]
fn finish_flushes_a_held_back_prefix() {
    let mut m = StopMatcher::new(vec!["STOP".into()]);
    assert_eq!(m.push("go ST").emit, "go ");
    let r = m.finish();
    assert_eq!((r.emit, r.stopped), ("ST", false));
}

#[test]
fn multibyte_stop_strings() {
    let stops: Vec<String> = vec!["é€".into()];
    assert_eq!(stream(&stops, &["aé", "é", "€b"]), ("aé".into(), true));
    assert_eq!(stream(&stops, &["aé", "x€"]), ("aéx€".into(), false));
}

#[test]
fn no_stops_passes_everything_through() {
    let mut m = StopMatcher::new(vec![String::new()]);
    assert!(m.stops().is_empty());
    assert_eq!(m.push("abc").emit, "abc");
    assert_eq!(m.finish().emit, "");
}
