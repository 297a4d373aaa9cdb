//! The web console: one page, embedded in the binary (no separate build,
//! no Node at run time), that reads the same API with the same token.

use axum::http::header;
use axum::response::IntoResponse;

/// The page, its script and its styles.
pub const PAGE: &str = include_str!("console/index.html");
pub const SCRIPT: &str = include_str!("console/console.js");
pub const STYLES: &str = include_str!("console/console.css");

pub async fn page() -> impl IntoResponse {
    served("text/html; charset=utf-8", PAGE)
}

pub async fn script() -> impl IntoResponse {
    served("text/javascript; charset=utf-8", SCRIPT)
}

pub async fn styles() -> impl IntoResponse {
    served("text/css; charset=utf-8", STYLES)
}

/// Only the page's own script and styles run; it talks to this server
/// only, and no other site may frame it.
fn served(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                 img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        body,
    )
}
