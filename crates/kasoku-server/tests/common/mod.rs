//! Helpers for driving `kasoku_server` as a library in tests: a server on an ephemeral
//! loopback port, served from a thread and stopped on drop, and a raw HTTP/1.1 client over
//! `std::net` (raw so that tests can also send what no well-behaved client would).

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::Duration;

use kasoku::engine::LoadedModel;
use kasoku_server::{Server, ServerConfig, ServerError, ShutdownHandle};

/// `tests/fixtures/<rel>` at the repository root.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// A server serving on a thread, stopped (and joined) on drop.
pub struct Running {
    pub addr: SocketAddr,
    pub id: String,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<Result<(), ServerError>>>,
}

impl Running {
    /// The tiny llama fixture with one session and no prefix cache, under `config`.
    pub fn tiny(config: ServerConfig) -> Running {
        Running::start(
            "llama/tiny/model-f32.gguf",
            ServerConfig {
                sessions: Some(1),
                prefix_cache: None,
                model_id: Some("tiny".into()),
                ..config
            },
        )
    }

    pub fn start(model: &str, config: ServerConfig) -> Running {
        Running::start_path(&fixture(model), config)
    }

    /// [`Running::start`] on a model anywhere (a real one from the cache).
    pub fn start_path(model: &std::path::Path, config: ServerConfig) -> Running {
        let model = LoadedModel::load(model).expect("load the model");
        Running::serve(Server::new(model, config).expect("build the server"))
    }

    /// Serves `server` on an ephemeral loopback port.
    pub fn serve(server: Server) -> Running {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let id = server.model_id().to_string();
        let handle = server.shutdown_handle();
        let thread = Some(std::thread::spawn(move || server.serve(listener)));
        Running {
            addr,
            id,
            handle,
            thread,
        }
    }

    /// Stops the server and returns what `serve` returned.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.handle.shutdown();
        self.thread.take().unwrap().join().expect("serve panicked")
    }

    /// Asks the server to stop without waiting for it.
    pub fn ask_to_stop(&self) {
        self.handle.shutdown();
    }

    /// Sends a request (with `Host` naming the server) and reads the whole answer.
    pub fn request(&self, method: &str, path: &str, body: Option<&str>) -> Response {
        let content_type = body.map(|_| ("Content-Type", "application/json"));
        self.send(
            method,
            path,
            &content_type.into_iter().collect::<Vec<_>>(),
            body,
        )
    }

    /// Sends a request with `headers` (a `Host` naming the server unless they give one).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Response {
        let mut head = format!("{method} {path} HTTP/1.1\r\n");
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        if let Some(b) = body {
            head.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        head.push_str("Connection: close\r\n\r\n");
        self.raw(&format!("{head}{}", body.unwrap_or("")))
    }

    /// A metric's value from /metrics (`None` when the server does not answer 200).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let r = self.request("GET", "/metrics", None);
        if r.status != 200 {
            return None;
        }
        r.body
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
    }

    /// Sends `bytes` as they are and reads the answer until the server closes.
    pub fn raw(&self, bytes: &str) -> Response {
        let mut stream = self.connect();
        stream.write_all(bytes.as_bytes()).unwrap();
        read_response(&mut stream)
    }

    pub fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(self.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        stream
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A parsed answer.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a Server-Sent Events body.
    pub fn events(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

/// Reads one answer until the server closes the connection (requests say `Connection: close`).
pub fn read_response(stream: &mut TcpStream) -> Response {
    let mut bytes = Vec::new();
    let _ = stream.read_to_end(&mut bytes);
    parse_response(&bytes)
}

pub fn parse_response(bytes: &[u8]) -> Response {
    let text = String::from_utf8_lossy(bytes);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer: {text:?}"));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    Response {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}
