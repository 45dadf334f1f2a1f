//! Asking one sentinel where the primary is: a connection of its own (TLS and `AUTH` as the
//! setting says), `SENTINEL MASTER <name>`, and its answer read within [`MAX_REPLY_BYTES`].
//!
//! Why not redis-rs here: its sentinel client asks `SENTINEL MASTERS` (every master the
//! sentinel monitors) and reads any reply whole, so the lookup's memory was whatever the
//! sentinel chose to send. `SENTINEL MASTER <name>` is one master's fields (about 40 short
//! values, under 1 KB), and [`reply::read`] refuses an answer past the cap before buffering it.
//! The connection lives for one lookup: lookups happen only when a connection to the primary
//! is (re)made.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::reply::{self, ReadError, Reply};

/// Bytes of one sentinel reply read at most. A `SENTINEL MASTER` answer is under 1 KB (its
/// fields are fixed); the cap leaves room for versions that add fields, and bounds what a
/// sentinel can make sluice hold.
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

/// Characters of a sentinel's error reply quoted in sluice's own error.
const QUOTED_ERROR_CHARS: usize = 200;

/// A sentinel, as the setting names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// How every sentinel is reached: TLS or not, and the sentinels' own credentials.
pub(super) struct Access {
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub connect_timeout: Duration,
}

/// What a sentinel said of the master.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// The address of the primary, which the sentinel does not flag down.
    Primary { host: String, port: u16 },
    /// It does not know the master, or flags it down (`s_down`, `o_down`).
    NoPrimary,
}

/// Asks `sentinel` where the primary of `master` is. The error says what went wrong with this
/// sentinel (the caller names it).
pub(super) async fn ask(
    sentinel: &Endpoint,
    access: &Access,
    master: &str,
) -> Result<Answer, String> {
    let connect = TcpStream::connect((sentinel.host.as_str(), sentinel.port));
    let tcp = tokio::time::timeout(access.connect_timeout, connect)
        .await
        .map_err(|_| {
            format!(
                "no connection within {} ms",
                access.connect_timeout.as_millis()
            )
        })?
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let request = request(access, master);
    match &access.tls {
        None => exchange(tcp, &request, access.password.is_some()).await,
        Some(config) => {
            let name = ServerName::try_from(sentinel.host.clone())
                .map_err(|e| format!("not a TLS server name: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::clone(config))
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            exchange(tls, &request, access.password.is_some()).await
        }
    }
}

/// `AUTH` (when the sentinels have a password) and `SENTINEL MASTER <master>`, pipelined.
fn request(access: &Access, master: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(password) = &access.password {
        match &access.user {
            Some(user) => command(&mut out, &["AUTH", user, password]),
            None => command(&mut out, &["AUTH", password]),
        }
    }
    command(&mut out, &["SENTINEL", "MASTER", master]);
    out
}

fn command(out: &mut Vec<u8>, args: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    request: &[u8],
    auth: bool,
) -> Result<Answer, String> {
    let mut stream = BufReader::new(stream);
    stream.write_all(request).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    if auth {
        match next(&mut stream, "AUTH").await? {
            Reply::Status(_) => {}
            Reply::Error(e) => return Err(format!("AUTH refused: {}", quoted(&e))),
            other => return Err(format!("AUTH answered {}", shape(&other))),
        }
    }
    answer(next(&mut stream, "SENTINEL MASTER").await?)
}

/// The reply to `command`, read within [`MAX_REPLY_BYTES`].
async fn next<R: tokio::io::AsyncBufRead + Unpin>(
    stream: &mut R,
    command: &str,
) -> Result<Reply, String> {
    reply::read(stream, MAX_REPLY_BYTES)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge(cap) => format!(
                "its reply to {command} is longer than {cap} bytes, the most sluice reads of a \
                 sentinel's reply"
            ),
            other => format!("reading its reply to {command}: {other}"),
        })
}

/// The answer a `SENTINEL MASTER` reply gives.
fn answer(reply: Reply) -> Result<Answer, String> {
    let fields = match reply {
        Reply::Array(fields) => fields,
        // What a sentinel answers for a master it does not monitor.
        Reply::Error(e) if e.starts_with("ERR No such master") => return Ok(Answer::NoPrimary),
        Reply::Error(e) if e.starts_with("NOAUTH") => {
            return Err(format!(
                "SENTINEL MASTER answered {} (the sentinels have a password: give \
                 --redis-sentinel-password-file)",
                quoted(&e)
            ));
        }
        Reply::Error(e) => {
            return Err(format!(
                "SENTINEL MASTER answered {} (is it a sentinel?)",
                quoted(&e)
            ));
        }
        other => return Err(format!("SENTINEL MASTER answered {}", shape(&other))),
    };
    let field = |name: &str| {
        fields.chunks(2).find_map(|pair| match pair {
            [Reply::Bulk(key), Reply::Bulk(value)] if key == name.as_bytes() => {
                Some(String::from_utf8_lossy(value).into_owned())
            }
            _ => None,
        })
    };
    let (Some(host), Some(port), Some(flags)) = (field("ip"), field("port"), field("flags")) else {
        return Err("SENTINEL MASTER answered without the master's ip, port and flags".into());
    };
    let port = port
        .parse()
        .map_err(|_| format!("SENTINEL MASTER answered port {}", quoted(&port)))?;
    let flags: Vec<&str> = flags.split(',').collect();
    if !flags.contains(&"master") || flags.contains(&"s_down") || flags.contains(&"o_down") {
        return Ok(Answer::NoPrimary);
    }
    Ok(Answer::Primary { host, port })
}

/// `text` cut to [`QUOTED_ERROR_CHARS`], quoted.
fn quoted(text: &str) -> String {
    match text.char_indices().nth(QUOTED_ERROR_CHARS) {
        Some((at, _)) => format!("{:?}~", &text[..at]),
        None => format!("{text:?}"),
    }
}

fn shape(reply: &Reply) -> &'static str {
    match reply {
        Reply::Status(_) => "a status",
        Reply::Error(_) => "an error",
        Reply::Integer(_) => "an integer",
        Reply::Bulk(_) => "a string",
        Reply::Nil => "nil",
        Reply::Array(_) => "an array",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master(flags: &str) -> Reply {
        let bulk = |s: &str| Reply::Bulk(s.as_bytes().to_vec());
        Reply::Array(
            [
                "name", "mymaster", "ip", "10.0.0.7", "port", "6380", "runid", "x", "flags", flags,
            ]
            .iter()
            .map(|s| bulk(s))
            .collect(),
        )
    }

    #[test]
    fn a_master_flagged_down_or_unknown_names_no_primary() {
        assert_eq!(
            answer(master("master")),
            Ok(Answer::Primary {
                host: "10.0.0.7".into(),
                port: 6380
            })
        );
        for flags in [
            "master,s_down",
            "master,o_down,failover_in_progress",
            "slave",
        ] {
            assert_eq!(answer(master(flags)), Ok(Answer::NoPrimary), "{flags}");
        }
        let unknown = Reply::Error("ERR No such master with that name".into());
        assert_eq!(answer(unknown), Ok(Answer::NoPrimary));
    }

    #[test]
    fn other_answers_are_errors_that_quote_little() {
        let plain = Reply::Error(
            "ERR unknown command 'SENTINEL', with args beginning with: 'MASTER' 'm'".into(),
        );
        let err = answer(plain).expect_err("not a sentinel");
        assert!(err.contains("unknown command 'SENTINEL'") && err.contains("is it a sentinel?"));
        let locked = Reply::Error("NOAUTH Authentication required.".into());
        let err = answer(locked).expect_err("no password");
        assert!(err.contains("NOAUTH") && err.contains("--redis-sentinel-password-file"));
        let long = Reply::Error("E".repeat(10_000));
        assert!(answer(long).expect_err("error").len() < 300);
        assert!(
            answer(Reply::Integer(1))
                .expect_err("integer")
                .contains("an integer")
        );
        let fieldless = Reply::Array(vec![Reply::Bulk(b"name".to_vec())]);
        assert!(
            answer(fieldless)
                .expect_err("no fields")
                .contains("ip, port and flags")
        );
    }

    #[test]
    fn the_request_authenticates_first_when_the_sentinels_have_a_password() {
        let access = |user: Option<&str>, password: Option<&str>| Access {
            tls: None,
            user: user.map(str::to_owned),
            password: password.map(str::to_owned),
            connect_timeout: Duration::from_secs(1),
        };
        let ask = b"*3\r\n$8\r\nSENTINEL\r\n$6\r\nMASTER\r\n$1\r\nm\r\n";
        assert_eq!(request(&access(None, None), "m"), ask);
        assert_eq!(request(&access(Some("u"), None), "m"), ask);
        let mut with_user = b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$2\r\npw\r\n".to_vec();
        with_user.extend_from_slice(ask);
        assert_eq!(request(&access(Some("u"), Some("pw")), "m"), with_user);
        let mut without = b"*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n".to_vec();
        without.extend_from_slice(ask);
        assert_eq!(request(&access(None, Some("pw")), "m"), without);
        assert_eq!(
            Endpoint {
                host: "::1".into(),
                port: 1
            }
            .to_string(),
            "[::1]:1"
        );
    }
}
