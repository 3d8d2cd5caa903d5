//! Accepting and serving connections (HTTP/1.1 over hyper) within limits: at most
//! `max_connections` open at once (one more is answered 503 and closed at once, so sockets
//! never pile up), a deadline for each request's headers that also bounds how long a
//! kept-alive connection may idle, a cap on the header size; and on shutdown, no new
//! connections while the open ones finish their answers.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::config::MAX_HEADER_BYTES;

/// The limits of [`accept`].
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
}

/// The open connections, and the signal that tells them to finish.
pub struct Connections {
    slots: Arc<Semaphore>,
    max: usize,
    stop: watch::Sender<bool>,
}

impl Connections {
    pub fn new(max: usize) -> Connections {
        let max = max.clamp(1, u32::MAX as usize);
        Connections {
            slots: Arc::new(Semaphore::new(max)),
            max,
            stop: watch::channel(false).0,
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.max - self.slots.available_permits()
    }

    /// Tells every connection to close once its current answer is complete (idle ones close
    /// at once), then waits for them, at most `timeout`. Whether all closed.
    pub async fn finish(&self, timeout: Duration) -> bool {
        self.stop.send_replace(true);
        let all = self.slots.acquire_many(self.max as u32);
        tokio::time::timeout(timeout, all).await.is_ok()
    }
}

/// The answer to a connection beyond the limit.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 132\r\n\r\n{\"error\":{\"message\":\"too many open connections; retry later\",\"type\":\"server_overloaded\",\"param\":null,\"code\":\"too_many_connections\"}}";

/// Accepts connections until `until` resolves, serving each with `router`.
pub async fn accept(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    connections: &Connections,
    until: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(until);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors or a connection reset before it was accepted: wait a
                // moment rather than spin.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = &mut until => break,
        };
        let Ok(slot) = Arc::clone(&connections.slots).try_acquire_owned() else {
            refuse(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let mut stop = connections.stop.subscribe();
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            let stopping = async move {
                let _ = stop.wait_for(|&s| s).await;
            };
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
}

/// Answers 503 if the socket takes it at once, and closes it.
fn refuse(stream: TcpStream) {
    let _ = stream.try_write(BUSY);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_answer_is_well_formed() {
        let text = std::str::from_utf8(BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(body.len(), length);
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
