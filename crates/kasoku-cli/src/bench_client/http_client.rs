//! A minimal blocking HTTP/1.1 client over `std::net` for `bench-client`: one request per
//! connection, plain `http://` only, bodies read incrementally (chunked or sized), so that a
//! Server-Sent Events stream can be timed line by line as it arrives.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// `http://host:port/prefix`, split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for none).
    pub base: String,
}

impl Url {
    pub fn parse(url: &str) -> Result<Url> {
        let Some(rest) = url.strip_prefix("http://") else {
            bail!("{url}: only http:// URLs are supported");
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().with_context(|| format!("{url}: bad port"))?),
            None => (authority, 80),
        };
        if host.is_empty() {
            bail!("{url}: no host");
        }
        let base = path.trim_end_matches('/');
        let base = base
            .strip_suffix("v1")
            .unwrap_or(base)
            .trim_end_matches('/');
        Ok(Url {
            host: host.to_string(),
            port,
            base: if base.is_empty() {
                String::new()
            } else {
                format!("/{base}")
            },
        })
    }
}

/// A response whose body is read as it arrives.
pub struct Response {
    pub status: u16,
    pub body: Box<dyn BufRead>,
}

impl Response {
    pub fn text(mut self) -> Result<String> {
        let mut s = String::new();
        self.body.read_to_string(&mut s)?;
        Ok(s)
    }
}

/// Sends one request (`Connection: close`).
pub fn request(
    url: &Url,
    method: &str,
    path: &str,
    body: Option<&str>,
    api_key: Option<&str>,
    timeout: Duration,
) -> Result<Response> {
    let stream = TcpStream::connect((url.host.as_str(), url.port))
        .with_context(|| format!("connecting to {}:{}", url.host, url.port))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_nodelay(true)?;
    let mut head = format!(
        "{method} {}{path} HTTP/1.1\r\nHost: {}:{}\r\nAccept: */*\r\nConnection: close\r\n",
        url.base, url.host, url.port
    );
    if let Some(key) = api_key {
        head.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    head.push_str("\r\n");
    let mut writer = stream.try_clone()?;
    writer.write_all(head.as_bytes())?;
    if let Some(b) = body {
        writer.write_all(b.as_bytes())?;
    }
    writer.flush()?;

    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("bad status line {line:?}"))?;
    let (mut chunked, mut length) = (false, None);
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 || line.trim_end().is_empty() {
            break;
        }
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.eq_ignore_ascii_case("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = value.parse::<u64>().ok();
        }
    }
    let body: Box<dyn BufRead> = if chunked {
        Box::new(BufReader::new(Chunked {
            inner: reader,
            left: 0,
            done: false,
        }))
    } else if let Some(n) = length {
        Box::new(BufReader::new(reader.take(n)))
    } else {
        Box::new(reader)
    };
    Ok(Response { status, body })
}

/// Decodes `Transfer-Encoding: chunked`.
struct Chunked<R: BufRead> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            // The CRLF that ends the previous chunk comes first (empty line).
            while line.trim().is_empty() {
                line.clear();
                if self.inner.read_line(&mut line)? == 0 {
                    self.done = true;
                    return Ok(0);
                }
            }
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(size, 16).map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size")
            })?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let n = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..n])?;
        if n == 0 {
            self.done = true;
        }
        self.left -= n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.base.as_str()),
            ("127.0.0.1", 8080, "")
        );
        let u = Url::parse("http://localhost:9/v1/").unwrap();
        assert_eq!((u.port, u.base.as_str()), (9, ""));
        let u = Url::parse("http://h/api/v1").unwrap();
        assert_eq!((u.port, u.base.as_str()), (80, "/api"));
        assert!(Url::parse("https://x").is_err());
    }

    #[test]
    fn chunked_bodies_are_decoded() {
        let raw = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n";
        let mut r = Chunked {
            inner: &raw[..],
            left: 0,
            done: false,
        };
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello, world");
    }
}
