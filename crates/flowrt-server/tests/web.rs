//! The chat page at `/`: served to browsers (and the probe text kept for everything else),
//! its assets with the right content types, nothing loaded from another host, the page and
//! its files free of the API key while the API keeps it, and `/v1/models` saying which
//! models can chat. The page's behaviour in a browser is `crates/flowrt-cli/tests/web.rs`.

mod common;

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use common::*;
use flowrt_server::{app, AppState, ModelSpec, ServerConfig};

const BROWSER_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn get_with(uri: &str, accept: Option<&str>, key: Option<&str>) -> Request<Body> {
    let mut b = Request::builder().method(Method::GET).uri(uri);
    if let Some(a) = accept {
        b = b.header(header::ACCEPT, a);
    }
    if let Some(k) = key {
        b = b.header(header::AUTHORIZATION, format!("Bearer {k}"));
    }
    b.body(Body::empty()).unwrap()
}

fn content_type(r: &Reply) -> &str {
    r.headers[header::CONTENT_TYPE].to_str().unwrap()
}

/// Every `src="…"` and `href="…"` value of an HTML text.
fn links(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            let end = rest.find('"').unwrap();
            out.push(rest[..end].to_string());
        }
    }
    out
}

#[tokio::test]
async fn a_browser_gets_the_page_other_clients_the_probe_text() {
    let app = router();
    let page = send(&app, get_with("/", Some(BROWSER_ACCEPT), None)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(content_type(&page), "text/html; charset=utf-8");
    assert!(page.text().contains("<title>flowrt chat</title>"));
    let csp = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"));
    assert_eq!(page.headers[header::VARY], "accept");

    for accept in [None, Some("*/*"), Some("application/json")] {
        let probe = send(&app, get_with("/", accept, None)).await;
        assert_eq!(probe.status, StatusCode::OK, "{accept:?}");
        assert!(content_type(&probe).starts_with("text/plain"), "{accept:?}");
        assert_eq!(probe.text(), "flowrt is running (Ollama is running)");
        assert_eq!(probe.headers[header::VARY], "accept");
    }
}

#[tokio::test]
async fn the_assets_are_served_with_their_content_types_and_load_nothing_from_elsewhere() {
    let app = router();
    let page = send(&app, get_with("/", Some(BROWSER_ACCEPT), None))
        .await
        .text();
    let links = links(&page);
    assert!(links.contains(&"/ui/app.js".to_string()), "{links:?}");
    assert!(links.contains(&"/ui/style.css".to_string()), "{links:?}");
    for l in &links {
        // Same-origin paths or inline data only: no other host, no protocol-relative URL.
        assert!(
            (l.starts_with('/') && !l.starts_with("//")) || l.starts_with("data:"),
            "the page links outside the server: {l}"
        );
    }
    let mut bodies = vec![page];
    for (path, ty) in [
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/style.css", "text/css; charset=utf-8"),
    ] {
        let r = get(&app, path).await;
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(content_type(&r), ty, "{path}");
        assert_eq!(r.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        bodies.push(r.text());
    }
    for b in &bodies {
        for scheme in ["http://", "https://", "//cdn", "@import"] {
            assert!(!b.contains(scheme), "an asset names `{scheme}`");
        }
    }
    assert_eq!(get(&app, "/ui/nope.js").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_page_loads_without_the_api_key_and_the_api_still_needs_it() {
    let app = app(state_with(ServerConfig {
        api_key: Some("s3cret".into()),
        ..config()
    }));
    for uri in ["/ui/app.js", "/ui/style.css"] {
        assert_eq!(
            send(&app, get_with(uri, None, None)).await.status,
            StatusCode::OK
        );
    }
    let page = send(&app, get_with("/", Some(BROWSER_ACCEPT), None)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.text().contains("/ui/app.js"));
    // The probe answer and the API keep needing the key.
    for (uri, accept) in [("/", None), ("/v1/models", Some(BROWSER_ACCEPT))] {
        let r = send(&app, get_with(uri, accept, None)).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{uri}");
    }
    let r = send(&app, get_with("/v1/models", None, Some("s3cret"))).await;
    assert_eq!(r.status, StatusCode::OK);
    // Only GET and HEAD of the page's files are free.
    let post = Request::builder()
        .method(Method::POST)
        .uri("/ui/app.js")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&app, post).await.status, StatusCode::UNAUTHORIZED);
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// The page offers for chat only models `/v1/models` says generate.
#[tokio::test]
async fn models_say_whether_they_generate() {
    let spec =
        |id: &str, rel: &str| ModelSpec::new(id, fixture(rel), "cd".repeat(32), 1, "test").unwrap();
    let app = app(AppState::new(
        vec![
            spec("tiny-bert:test", "embed/tiny-bert"),
            spec("qwen3:chat", "families/qwen3"),
        ],
        config(),
    ));
    let models = get(&app, "/v1/models").await.json();
    let generates = |id: &str| {
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id)
            .unwrap()["generates"]
            .clone()
    };
    assert_eq!(generates("tiny-bert:test"), false);
    assert_eq!(generates("qwen3:chat"), true);
}
