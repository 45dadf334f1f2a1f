//! A RESP2 reply read with a cap on its bytes: what a sentinel answers is not trusted with
//! sluice's memory.
//!
//! Why a reader of our own: redis-rs reads a whole reply into memory before anyone can look at
//! it, so a sentinel (or anything listening where a sentinel should be) that answers with
//! millions of entries costs that many allocations. Here every length a reply announces is
//! checked against the bytes left of the cap before anything is allocated or read for it, so a
//! reply over the cap is refused after reading at most the cap, and costs at most about the cap
//! in memory. Arrays nest at most [`MAX_DEPTH`] levels (the replies asked for are flat), which
//! bounds the work per byte and the stack.

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// Levels of arrays a reply may nest (a sentinel's `SENTINEL MASTER` answer has one).
pub(super) const MAX_DEPTH: usize = 4;

/// The smallest encoding of one array element (`+\r\n`): an array announcing more elements than
/// the bytes left could hold is refused before its vector is allocated.
const MIN_ELEMENT_BYTES: usize = 3;

/// One RESP2 value, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

/// Why a reply was not read.
#[derive(Debug, thiserror::Error)]
pub(super) enum ReadError {
    /// The reply (or the length it announced) goes past the cap, in bytes.
    #[error("the reply is longer than {0} bytes")]
    TooLarge(usize),
    #[error("the reply nests arrays deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("the reply is not RESP2 ({0})")]
    Malformed(&'static str),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Reads the next reply of `reader`, refusing it once it takes more than `cap` bytes.
pub(super) async fn read<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    cap: usize,
) -> Result<Reply, ReadError> {
    let mut left = cap;
    // The arrays being read, outermost first: their elements so far and how many they announced.
    let mut open: Vec<(Vec<Reply>, usize)> = Vec::new();
    loop {
        let line = read_line(reader, &mut left, cap).await?;
        let (&kind, rest) = line
            .split_first()
            .ok_or(ReadError::Malformed("an empty line"))?;
        let mut value = match kind {
            b'+' => Reply::Status(String::from_utf8_lossy(rest).into_owned()),
            b'-' => Reply::Error(String::from_utf8_lossy(rest).into_owned()),
            b':' => Reply::Integer(number(rest)?),
            b'$' => match usize::try_from(number(rest)?) {
                Err(_) => Reply::Nil,
                Ok(len) => {
                    let with_end = len.checked_add(2).filter(|n| *n <= left);
                    let with_end = with_end.ok_or(ReadError::TooLarge(cap))?;
                    let mut data = vec![0; with_end];
                    reader.read_exact(&mut data).await?;
                    left -= with_end;
                    if data.split_off(len) != b"\r\n" {
                        return Err(ReadError::Malformed("a bulk string without its CRLF"));
                    }
                    Reply::Bulk(data)
                }
            },
            b'*' => match usize::try_from(number(rest)?) {
                Err(_) => Reply::Nil,
                Ok(0) => Reply::Array(Vec::new()),
                Ok(len) => {
                    if open.len() >= MAX_DEPTH {
                        return Err(ReadError::TooDeep);
                    }
                    if len > left / MIN_ELEMENT_BYTES {
                        return Err(ReadError::TooLarge(cap));
                    }
                    open.push((Vec::with_capacity(len), len));
                    continue;
                }
            },
            _ => return Err(ReadError::Malformed("an unknown type byte")),
        };
        // Close every array this value completes.
        loop {
            let Some((elements, len)) = open.last_mut() else {
                return Ok(value);
            };
            elements.push(value);
            if elements.len() < *len {
                break;
            }
            let (elements, _) = open.pop().ok_or(ReadError::Malformed("unbalanced"))?;
            value = Reply::Array(elements);
        }
    }
}

/// The next line without its CRLF, counted against `left`.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    left: &mut usize,
    cap: usize,
) -> Result<Vec<u8>, ReadError> {
    let mut line = Vec::new();
    let read = (&mut *reader)
        .take(*left as u64)
        .read_until(b'\n', &mut line)
        .await?;
    if !line.ends_with(b"\n") {
        if read == *left {
            return Err(ReadError::TooLarge(cap));
        }
        return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
    }
    *left -= read;
    line.truncate(line.len() - 1);
    if line.pop() != Some(b'\r') {
        return Err(ReadError::Malformed("a line without its CR"));
    }
    Ok(line)
}

fn number(digits: &[u8]) -> Result<i64, ReadError> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(ReadError::Malformed(
            "a length or integer that is not a number",
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8], cap: usize) -> Result<Reply, ReadError> {
        let mut reader = bytes;
        read(&mut reader, cap).await
    }

    fn bulk(s: &str) -> Reply {
        Reply::Bulk(s.as_bytes().to_vec())
    }

    #[tokio::test]
    async fn every_resp2_type_is_read_and_replies_follow_each_other() {
        let wire = b"+OK\r\n-ERR No such master with that name\r\n:-42\r\n$-1\r\n*-1\r\n*0\r\n\
                     *3\r\n$2\r\nip\r\n*2\r\n$0\r\n\r\n:7\r\n$4\r\na\r\nb\r\n";
        let mut reader = &wire[..];
        let mut replies = Vec::new();
        while !reader.is_empty() {
            replies.push(read(&mut reader, 1024).await.expect("a reply"));
        }
        assert_eq!(
            replies,
            [
                Reply::Status("OK".into()),
                Reply::Error("ERR No such master with that name".into()),
                Reply::Integer(-42),
                Reply::Nil,
                Reply::Nil,
                Reply::Array(Vec::new()),
                Reply::Array(vec![
                    bulk("ip"),
                    Reply::Array(vec![bulk(""), Reply::Integer(7)]),
                    bulk("a\r\nb"),
                ]),
            ]
        );
    }

    #[tokio::test]
    async fn a_reply_over_the_cap_is_refused_by_what_it_announces() {
        // Exactly at the cap is read; one byte less is not.
        let wire = b"*2\r\n$2\r\nip\r\n$4\r\nport\r\n";
        assert!(parse(wire, wire.len()).await.is_ok());
        assert!(matches!(
            parse(wire, wire.len() - 1).await,
            Err(ReadError::TooLarge(cap)) if cap == wire.len() - 1
        ));
        // Announced lengths are refused before anything is read or allocated for them.
        for announced in [
            &b"$1000000000\r\n"[..],
            b"*200000\r\n",
            b"*9223372036854775807\r\n",
        ] {
            let err = parse(announced, 64 * 1024).await.expect_err("over the cap");
            assert!(matches!(err, ReadError::TooLarge(65536)), "{err}");
            assert_eq!(err.to_string(), "the reply is longer than 65536 bytes");
        }
        // A line that never ends stops at the cap.
        let endless = vec![b'+'; 100_000];
        assert!(matches!(
            parse(&endless, 1000).await,
            Err(ReadError::TooLarge(1000))
        ));
        // Many small elements, each within the cap, add up.
        let mut many = b"*20000\r\n".to_vec();
        for _ in 0..20_000 {
            many.extend_from_slice(b"$5\r\nfield\r\n");
        }
        assert!(matches!(
            parse(&many, 64 * 1024).await,
            Err(ReadError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn nesting_and_malformed_replies_are_refused() {
        let deep = b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n";
        assert!(matches!(parse(deep, 1024).await, Err(ReadError::TooDeep)));
        assert!(
            parse(&deep[4..], 1024).await.is_ok(),
            "four levels are read"
        );
        for (wire, why) in [
            (&b"HTTP/1.1 400 Bad Request\r\n"[..], "unknown type"),
            (b"$3\r\nabcde\r\n", "without its CRLF"),
            (b":12x\r\n", "not a number"),
            (b"+OK\n", "without its CR"),
            (b"\r\n", "empty line"),
        ] {
            let err = parse(wire, 1024).await.expect_err("malformed").to_string();
            assert!(err.contains(why), "{err}");
        }
        let cut = parse(b"*2\r\n+OK\r\n", 1024).await.expect_err("cut short");
        assert!(
            matches!(cut, ReadError::Io(ref e) if e.kind() == std::io::ErrorKind::UnexpectedEof)
        );
    }
}
