//! A streamed answer as Server-Sent Events in some API's shape: a formatter turns each worker
//! event into the text to send. Dropping the body (client gone) drops the receiver, which
//! stops the worker at its next token.

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::pool::Event;

/// Turns events into SSE text.
pub trait Format: Send + 'static {
    /// The text for one event; `None` is the channel closing without an end.
    fn event(&mut self, event: Option<Event>) -> String;
    /// Whether the stream is over (after an end or an error).
    fn finished(&self) -> bool;
}

/// One `event:`/`data:` record.
pub fn record(event: &str, data: &serde_json::Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// The streaming response: `first`, then what `rx` brings, through `format`.
pub fn response(first: Event, rx: UnboundedReceiver<Event>, format: impl Format) -> Response {
    let state = (Some(first), rx, format);
    let chunks =
        futures_util::stream::unfold(state, |(mut first, mut rx, mut format)| async move {
            if format.finished() {
                return None;
            }
            let event = match first.take() {
                Some(e) => Some(e),
                None => rx.recv().await,
            };
            let text = format.event(event);
            Some((Ok::<_, Infallible>(Bytes::from(text)), (first, rx, format)))
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| ApiError::internal("building the response").into_response())
}
