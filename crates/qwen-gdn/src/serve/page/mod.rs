//! The chat page at `/`: static files (files/) compiled into the binary and served with a
//! Content-Security-Policy that lets the page load and connect to this server only, so nothing
//! it shows can pull in or send to another origin. The page itself needs no key (it holds no
//! secret); it talks to the OpenAI chat endpoint, which does, with the key the user types into
//! it (kept in the browser's localStorage).

mod assets;

use assets::Asset;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// Everything from this server, nothing from anywhere else; no inline script or style (the
/// page has none), no plugins, no framing, no form posts.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; manifest-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's routes: `/` and every file it loads. Stateless, so any router can take them.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    assets::ALL
        .iter()
        .fold(Router::new(), |router, asset: &'static Asset| {
            router.route(asset.path, get(move || async move { respond(asset) }))
        })
}

fn respond(asset: &Asset) -> Response {
    (
        [
            (header::CONTENT_TYPE, asset.content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            // A new binary may serve new files under the same names.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        asset.body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::{to_bytes, Body};
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    async fn get(path: &str) -> Response {
        routes::<()>()
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    #[test]
    fn every_file_has_its_type_and_the_policy() {
        runtime().block_on(async {
            for asset in assets::ALL {
                let response = get(asset.path).await;
                assert_eq!(response.status(), StatusCode::OK, "{}", asset.path);
                let headers = response.headers();
                assert_eq!(headers[header::CONTENT_TYPE], asset.content_type);
                assert_eq!(
                    headers[header::CONTENT_SECURITY_POLICY],
                    CONTENT_SECURITY_POLICY
                );
                assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
                let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
                assert_eq!(body, asset.body.as_bytes(), "{}", asset.path);
            }
            let index = get("/").await;
            assert!(index.headers()[header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/html"));
            assert_eq!(get("/page/nope.js").await.status(), StatusCode::NOT_FOUND);
        });
    }

    #[test]
    fn the_policy_names_no_other_origin() {
        for directive in CONTENT_SECURITY_POLICY.split(';') {
            for source in directive.split_whitespace().skip(1) {
                assert!(
                    source == "'self'" || source == "'none'",
                    "{directive}: {source}"
                );
            }
        }
    }
}
