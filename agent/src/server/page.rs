//! `GET /ui`: the session page. One static document (embedded, no build step) that draws the
//! next request in the window by part with the headroom tiers (`/v1/session/context`), the
//! compaction timeline with scores and archived keys (`/v1/session`, `timeline`), recalls a
//! key it shows (`/v1/recall/KEY`) and asks where a text went (`?why=`). The page holds no
//! data: everything it shows comes from those routes, which ask for the session's token, so a
//! caller without it gets the page's sign-in box and nothing else. `kubectl cairn open`
//! serves it through a port-forward that adds the token, and answers the page's fleet list
//! (`v1/fleet`, absent here: the agent knows only its own session) itself.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const PAGE: &str = include_str!("page.html");

/// The page allows its own inline script and style and requests to its own origin only;
/// everything from the session is inserted as text, never as markup.
const POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                      connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                      frame-ancestors 'none'";

pub(super) async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}
