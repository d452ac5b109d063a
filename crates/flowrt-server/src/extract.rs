//! Reading JSON request bodies: size-limited, and every failure a 400/413 in the API's own
//! error shape naming the field at fault (axum's `Json` answers in plain text).

use axum::body::Body;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use crate::error::{clip, ApiError, ErrorKind};
use crate::AppState;

/// A JSON body of type `T`, read with the server's body size limit.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        check_content_type(req.headers())?;
        let limit = state.config.max_body_bytes;
        let too_large = || {
            ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!("the request body is larger than the server's limit of {limit} bytes"),
            )
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        let body: Body = req.into_body();
        let read = Limited::new(body, limit).collect();
        let read = match state.config.body_timeout {
            Some(t) => match tokio::time::timeout(t, read).await {
                Ok(r) => r,
                Err(_) => {
                    return Err(ApiError::new(
                        ErrorKind::RequestTimeout,
                        format!(
                            "the request body did not arrive within the server's limit of {} s (--body-timeout)",
                            t.as_secs_f64()
                        ),
                    ))
                }
            },
            None => read.await,
        };
        let bytes = match read {
            Ok(c) => c.to_bytes(),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return Err(too_large()),
            Err(_) => return Err(ApiError::invalid("the request body could not be read")),
        };
        parse_json(&bytes).map(ApiJson)
    }
}

/// A JSON body must say so: `Content-Type: application/json` (parameters such as `charset`
/// allowed, and `application/*+json`). Refusing the rest keeps a web page from posting to
/// the server with a "simple" cross-site request (`text/plain`, forms, no type), which a
/// browser sends without asking the server first.
fn check_content_type(headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let essence = given.as_deref().map(|v| {
        v.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase()
    });
    let ok = essence.as_deref().is_some_and(|m| {
        m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
    });
    if ok {
        return Ok(());
    }
    let got = match &given {
        Some(v) => format!("got `{}`", clip(v, 100)),
        None => "the header is missing".to_string(),
    };
    Err(ApiError::new(
        ErrorKind::UnsupportedMediaType,
        format!("the `Content-Type` header must be `application/json` for this route ({got})"),
    )
    .with_param("Content-Type"))
}

/// Parse `bytes` as `T`; errors name the JSON path of the bad field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid(
            "the request body is empty; send a JSON object",
        ));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = match serde_path_to_error::deserialize(&mut de) {
        Ok(v) => v,
        Err(e) => {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let msg = clip(&inner.to_string(), 300);
            return Err(if path.is_empty() || path == "." {
                ApiError::invalid(format!(
                    "the request body is not valid JSON for this route: {msg}"
                ))
            } else {
                ApiError::invalid_param(path.clone(), format!("invalid value for `{path}`: {msg}"))
            });
        }
    };
    de.end()
        .map_err(|e| ApiError::invalid(format!("trailing data after the JSON body: {e}")))?;
    Ok(value)
}
