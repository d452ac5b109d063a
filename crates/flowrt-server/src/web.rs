//! The web chat page: `GET /` with `Accept: text/html` answers the page, any other `GET /`
//! keeps the plain-text probe answer Ollama clients look for. The page and its assets are
//! compiled into the binary (no CDN, works offline) and load without the API key; the API
//! calls the page makes send the key the user types (`Authorization: Bearer`).

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::AppState;

/// One file the page needs.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const PAGE: Asset = Asset {
    path: "/",
    content_type: "text/html; charset=utf-8",
    body: include_str!("web/index.html"),
};

/// Served under `/ui/`, named by the page.
const ASSETS: &[Asset] = &[
    Asset {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("web/app.js"),
    },
    Asset {
        path: "/ui/style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("web/style.css"),
    },
];

/// The page may load and talk to nothing but this server.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The asset routes (the page itself is [`root`]).
pub(crate) fn routes() -> Router<AppState> {
    ASSETS.iter().fold(Router::new(), |r, a| {
        r.route(a.path, get(move || async move { serve(a) }))
    })
}

/// `GET /`: the chat page for a browser, the probe text for everything else.
pub(crate) async fn root(headers: HeaderMap) -> Response {
    let mut resp = if accepts_html(&headers) {
        serve(&PAGE)
    } else {
        // Ollama clients probe `/` for this text.
        "flowrt is running (Ollama is running)".into_response()
    };
    resp.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("accept"));
    resp
}

/// Whether a request may go without the API key: the page and its assets, which hold no
/// data (the probe answer at `/` still needs the key, as before the page existed).
pub(crate) fn is_public(req: &Request) -> bool {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return false;
    }
    match req.uri().path() {
        "/" => accepts_html(req.headers()),
        p => ASSETS.iter().any(|a| a.path == p),
    }
}

fn accepts_html(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/html"))
}

fn serve(a: &Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, a.content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, CSP),
        ],
        a.body,
    )
        .into_response()
}
