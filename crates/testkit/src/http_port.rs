//! Plain HTTP/1.1 `GET`s of the gate's HTTP port (`/metrics`, `/readyz`, `/healthz`) and of nats-server's
//! monitoring port: one request per connection, read to its end, so a test sees exactly what a scraper would.

use existence_gate::server::RunningServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on the HTTP port: (status code, body).
pub async fn http_get(server: &RunningServer, path: &str) -> (u16, String) {
    try_http_get(server.http_addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// `GET path` on the HTTP port at `addr`: (status code, body), or why no response came (the port is closed,
/// or the connection closed before a status line).
pub async fn try_http_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("no status line in {response:?}"),
            )
        })?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let chunked = head
        .lines()
        .any(|line| line.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// The body a `Transfer-Encoding: chunked` response carries in `chunks` (as Go's servers, nats-server's
/// monitoring among them, send a body of unknown length).
fn dechunk(mut chunks: &str) -> String {
    let mut body = String::new();
    while let Some((size, rest)) = chunks.split_once("\r\n") {
        let size =
            usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16).unwrap_or(0);
        if size == 0 || rest.len() < size {
            break;
        }
        body.push_str(&rest[..size]);
        chunks = rest[size..].strip_prefix("\r\n").unwrap_or(&rest[size..]);
    }
    body
}
