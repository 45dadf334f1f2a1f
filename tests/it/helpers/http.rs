//! Plain HTTP/1.1 over loopback: the admin port's JSON calls ([`http_request`], [`http_get`]),
//! and [`Req`], a client that sees what a browser or curl would see through Envoy (status,
//! every header in order, duplicates kept, body), optionally from another loopback address
//! (`127.0.0.2`, ...), so per-client limits see distinct clients. Every request sends
//! `Connection: close` and is bounded by [`TIMEOUT`].

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Longest any request of the helpers waits for its whole response.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// One request with a JSON body; returns (status, body).
pub fn http_request(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    let req = Req::new(method, path)
        .header("Content-Type", "application/json")
        .body(body);
    let resp = req.send_blocking(addr).expect("HTTP request");
    (resp.status, resp.body)
}

/// `GET path`; returns (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path, "")
}

/// An HTTP/1.1 request.
#[derive(Clone, Debug)]
pub struct Req {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: String,
    from: Option<IpAddr>,
}

/// What the client got.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Every header in the order received; names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Req {
    pub fn new(method: &str, path: &str) -> Req {
        Req {
            method: method.into(),
            path: path.into(),
            headers: Vec::new(),
            body: String::new(),
            from: None,
        }
    }

    pub fn get(path: &str) -> Req {
        Req::new("GET", path)
    }

    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: &str) -> Req {
        self.body = body.into();
        self
    }

    /// Connects from this local (loopback) address instead of the kernel's choice.
    pub fn from(mut self, ip: &str) -> Req {
        self.from = Some(ip.parse().expect("a local IP address"));
        self
    }

    fn text(&self, addr: SocketAddr) -> String {
        let mut text = format!(
            "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n",
            self.method, self.path
        );
        for (name, value) in &self.headers {
            text.push_str(&format!("{name}: {value}\r\n"));
        }
        text.push_str(&format!("Content-Length: {}\r\n\r\n", self.body.len()));
        text.push_str(&self.body);
        text
    }

    /// Sends the request and reads the response; any failure (refused, reset, timed out,
    /// unparsable) is an error. Takes the request by value, so the future owns it.
    pub async fn try_send(self, addr: SocketAddr) -> std::io::Result<HttpResponse> {
        let exchange = async {
            let socket = match addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            if let Some(ip) = self.from {
                socket.bind(SocketAddr::new(ip, 0))?;
            }
            let mut stream = socket.connect(addr).await?;
            stream.write_all(self.text(addr).as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            parse_response(&raw)
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no response"))?
    }

    /// [`Req::try_send`], panicking on failure.
    pub async fn send(self, addr: SocketAddr) -> HttpResponse {
        let what = format!("{} {}", self.method, self.path);
        self.try_send(addr)
            .await
            .unwrap_or_else(|e| panic!("{what} to {addr}: {e}"))
    }

    /// The same exchange without an async runtime (admin ports, readiness polls).
    pub fn send_blocking(&self, addr: SocketAddr) -> std::io::Result<HttpResponse> {
        assert!(
            self.from.is_none(),
            "send_blocking uses the kernel's address"
        );
        let mut stream = std::net::TcpStream::connect_timeout(&addr, TIMEOUT)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.write_all(self.text(addr).as_bytes())?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        parse_response(&raw)
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned())
}

fn parse_response(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| invalid("no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

/// The payload of a chunked body (no trailers expected).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

impl HttpResponse {
    /// Every value of header `name` (case-insensitive), in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The value of header `name`, which must appear at most once (a duplicated header is a
    /// test failure: a client would not know which to believe).
    pub fn header(&self, name: &str) -> Option<&str> {
        let all = self.all(name);
        assert!(
            all.len() <= 1,
            "header {name} appears {} times: {self:?}",
            all.len()
        );
        all.first().copied()
    }

    /// Every header name, once each, in order of first appearance.
    pub fn names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for (n, _) in &self.headers {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
        names
    }
}
