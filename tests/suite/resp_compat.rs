//! The RESP port's replies, byte for byte, for every `BF.*` command and argument shape a RedisBloom user
//! sends (and `AUTH` without tokens, `PING`, `SELECT`): pinned here, and compared with RedisBloom's where it is available. Each case says whether
//! RedisBloom answers the same bytes or, where the gate means to differ (namespaces are configured, not
//! created; a filter of windows has no expansion rate; its size is its own), what RedisBloom 2.6.28 answers
//! instead and why — the table in docs/resp.md, checked.
//!
//! With `EXISTENCE_GATE_REDISBLOOM_MODULE` naming a RedisBloom module (`redisbloom.so`) and Debian's
//! `redis-server` installed, the same requests go to a Redis with that module, whose replies must be the
//! ones pinned here for it; without, the gate's replies alone are checked.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::procs;

/// The gate's namespace, and the filter RedisBloom is given to match it.
const NAMESPACES: &str = "[namespaces.users]\nexpected_keys = 10000\n";
const RESERVE: &str = "BF.RESERVE users 0.01 10000";
/// The request that switches a connection to RESP3.
const RESP3: &str = "HELLO 3";
/// What the gate answers for a namespace it was not configured with, where RedisBloom sees no key.
const NOT_CONFIGURED: &[u8] =
    b"-ERR namespace \"nope\" is not configured: the gate's namespaces are \
    [namespaces.NAME] tables of its configuration, not created by BF.RESERVE or BF.ADD\r\n";

/// One request (arguments split at spaces; `HELLO 3` switches both sides to RESP3), the gate's reply, and
/// RedisBloom's where it differs, with why.
struct Case {
    request: &'static str,
    gate: &'static [u8],
    redisbloom: Option<(&'static [u8], &'static str)>,
}

const fn same(request: &'static str, gate: &'static [u8]) -> Case {
    Case {
        request,
        gate,
        redisbloom: None,
    }
}

const fn differs(
    request: &'static str,
    gate: &'static [u8],
    redisbloom: &'static [u8],
    why: &'static str,
) -> Case {
    Case {
        request,
        gate,
        redisbloom: Some((redisbloom, why)),
    }
}

const UNCONFIGURED: &str =
    "namespaces are configured: a gate cannot answer 0 (absent) for one it does not hold";
const WINDOWS: &str =
    "the gate's filter is its own layout, and grows by its configuration, not by an expansion rate";

const CASES: &[Case] = &[
    same("BF.ADD users a", b":1\r\n"),
    same("BF.ADD users a", b":0\r\n"),
    same("BF.MADD users b a c", b"*3\r\n:1\r\n:0\r\n:1\r\n"),
    same("BF.EXISTS users a", b":1\r\n"),
    same("BF.EXISTS users zz", b":0\r\n"),
    same("BF.MEXISTS users a zz b", b"*3\r\n:1\r\n:0\r\n:1\r\n"),
    same("BF.INSERT users ITEMS d a", b"*2\r\n:1\r\n:0\r\n"),
    same("BF.INSERT users CAPACITY 1000 ERROR 0.01 ITEMS e", b"*1\r\n:1\r\n"),
    same("BF.INSERT users NOCREATE ITEMS f", b"*1\r\n:1\r\n"),
    same("BF.INSERT users EXPANSION 2 ITEMS g", b"*1\r\n:1\r\n"),
    same("BF.INSERT users NONSCALING ITEMS h", b"*1\r\n:1\r\n"),
    same("BF.INSERT nope NOCREATE ITEMS k", b"-ERR not found\r\n"),
    // Options checked as RedisBloom checks them, with its replies.
    same("BF.INSERT users CAPACITY x ITEMS a", b"-Bad capacity\r\n"),
    same("BF.INSERT users CAPACITY 0 ITEMS a", b"-Bad argument received\r\n"),
    same("BF.INSERT users ERROR x ITEMS a", b"-Bad error rate\r\n"),
    same("BF.INSERT users ERROR 2 ITEMS a", b"-Bad argument received\r\n"),
    same("BF.INSERT users EXPANSION x ITEMS a", b"-Bad expansion\r\n"),
    same("BF.INSERT users EXPANSION 0 ITEMS a", b"-Bad argument received\r\n"),
    same("BF.INSERT users BOGUS ITEMS a", b"-Unknown argument received\r\n"),
    same(
        "BF.INSERT users CAPACITY 100",
        b"-ERR wrong number of arguments for 'bf.insert' command\r\n",
    ),
    same(
        "BF.INSERT users ERROR",
        b"-ERR wrong number of arguments for 'bf.insert' command\r\n",
    ),
    same(
        "BF.INSERT users ITEMS",
        b"-ERR wrong number of arguments for 'bf.insert' command\r\n",
    ),
    same("BF.RESERVE users 0.01 1000", b"-ERR item exists\r\n"),
    same("BF.RESERVE x abc 1000", b"-ERR bad error rate\r\n"),
    same("BF.RESERVE x nan 100", b"-ERR bad error rate\r\n"),
    same("BF.RESERVE x 2 1000", b"-ERR (0 < error rate range < 1) \r\n"),
    same("BF.RESERVE x 0 1000", b"-ERR (0 < error rate range < 1) \r\n"),
    same("BF.RESERVE x 0.01 abc", b"-ERR bad capacity\r\n"),
    same(
        "BF.RESERVE x 0.01 0",
        b"-ERR (capacity should be larger than 0)\r\n",
    ),
    same(
        "BF.RESERVE x 0.01 -5",
        b"-ERR (capacity should be larger than 0)\r\n",
    ),
    same("BF.RESERVE x 0.01 1000 EXPANSION", b"-ERR no expansion\r\n"),
    same("BF.RESERVE x 0.01 1000 EXPANSION abc", b"-ERR bad expansion\r\n"),
    same(
        "BF.RESERVE x 0.01 1000 EXPANSION 0",
        b"-ERR expansion should be greater or equal to 1\r\n",
    ),
    same(
        "BF.RESERVE x 0.01 1000 NONSCALING EXPANSION 2",
        b"-Nonscaling filters cannot expand\r\n",
    ),
    same(
        "BF.RESERVE x 0.01 1000 EXPANSION 2 NONSCALING x",
        b"-ERR wrong number of arguments for 'bf.reserve' command\r\n",
    ),
    differs(
        "BF.RESERVE x 0.01 1000 SCALE",
        b"-ERR namespace \"x\" is not configured: the gate's namespaces are [namespaces.NAME] tables of \
          its configuration, not created by BF.RESERVE or BF.ADD\r\n",
        b"+OK\r\n",
        UNCONFIGURED,
    ),
    same(
        "BF.ADD users",
        b"-ERR wrong number of arguments for 'bf.add' command\r\n",
    ),
    same(
        "BF.ADD users a b",
        b"-ERR wrong number of arguments for 'bf.add' command\r\n",
    ),
    same(
        "BF.MADD users",
        b"-ERR wrong number of arguments for 'bf.madd' command\r\n",
    ),
    same(
        "BF.EXISTS users",
        b"-ERR wrong number of arguments for 'bf.exists' command\r\n",
    ),
    same(
        "BF.MEXISTS users",
        b"-ERR wrong number of arguments for 'bf.mexists' command\r\n",
    ),
    differs("BF.EXISTS nope k", NOT_CONFIGURED, b":0\r\n", UNCONFIGURED),
    differs(
        "BF.MEXISTS nope k j",
        NOT_CONFIGURED,
        b"*2\r\n:0\r\n:0\r\n",
        UNCONFIGURED,
    ),
    differs("BF.CARD nope", NOT_CONFIGURED, b":0\r\n", UNCONFIGURED),
    differs("BF.INFO nope", NOT_CONFIGURED, b"-ERR not found\r\n", UNCONFIGURED),
    same("BF.CARD users", b":8\r\n"),
    differs(
        "BF.INFO users",
        b"*10\r\n+Capacity\r\n:10000\r\n+Size\r\n:12416\r\n+Number of filters\r\n:1\r\n\
          +Number of items inserted\r\n:8\r\n+Expansion rate\r\n$-1\r\n",
        b"*10\r\n+Capacity\r\n:10000\r\n+Size\r\n:13888\r\n+Number of filters\r\n:1\r\n\
          +Number of items inserted\r\n:8\r\n+Expansion rate\r\n:2\r\n",
        WINDOWS,
    ),
    same("BF.INFO users CAPACITY", b"*1\r\n:10000\r\n"),
    same("BF.INFO users FILTERS", b"*1\r\n:1\r\n"),
    same("BF.INFO users ITEMS", b"*1\r\n:8\r\n"),
    differs(
        "BF.INFO users SIZE",
        b"*1\r\n:12416\r\n",
        b"*1\r\n:13888\r\n",
        WINDOWS,
    ),
    differs(
        "BF.INFO users EXPANSION",
        b"*1\r\n$-1\r\n",
        b"*1\r\n:2\r\n",
        WINDOWS,
    ),
    same("BF.INFO users BOGUS", b"-Invalid information value\r\n"),
    // No tokens configured, as a Redis without passwords: its `default` user takes any password.
    same(
        "AUTH x",
        b"-ERR AUTH <password> called without any password configured for the default user. Are you sure \
          your configuration is correct?\r\n",
    ),
    same(
        "AUTH someone x",
        b"-WRONGPASS invalid username-password pair or user is disabled.\r\n",
    ),
    same("AUTH default x", b"+OK\r\n"),
    same("PING", b"+PONG\r\n"),
    same("PING x", b"$1\r\nx\r\n"),
    same(
        "PING x y",
        b"-ERR wrong number of arguments for 'ping' command\r\n",
    ),
    same("SELECT 0", b"+OK\r\n"),
    // RESP3: booleans, maps (one named value for a single BF.INFO field). `HELLO`'s own reply describes
    // the server, so it is not compared.
    same(RESP3, b""),
    same("BF.EXISTS users a", b"#t\r\n"),
    same("BF.MEXISTS users a zz", b"*2\r\n#t\r\n#f\r\n"),
    same("BF.ADD users q", b"#t\r\n"),
    same("BF.INFO users CAPACITY", b"%1\r\n+Capacity\r\n:10000\r\n"),
    same("BF.INFO users ITEMS", b"%1\r\n+Number of items inserted\r\n:9\r\n"),
    differs(
        "BF.INFO users EXPANSION",
        b"%1\r\n+Expansion rate\r\n_\r\n",
        b"%1\r\n+Expansion rate\r\n:2\r\n",
        WINDOWS,
    ),
    same("BF.CARD users", b":9\r\n"),
];

#[tokio::test]
async fn every_bf_command_shape_answers_as_pinned_and_as_redisbloom_does() {
    let gate = super::resp::start_resp(NAMESPACES, |_| {}).await;
    let mut gate = TcpStream::connect(gate.resp_addr.unwrap()).await.unwrap();
    let redis = match procs::redisbloom_module() {
        Ok(module) => {
            let module = module.to_string_lossy().into_owned();
            procs::start_redis_with(&["--loadmodule", &module])
        }
        Err(why) => {
            eprintln!("{why}: the gate's replies alone are checked");
            None
        }
    };
    let mut redisbloom = match &redis {
        Some(server) => {
            let mut stream = TcpStream::connect(server.addr).await.unwrap();
            assert_eq!(request(&mut stream, RESERVE).await, b"+OK\r\n");
            Some(stream)
        }
        None => None,
    };
    for case in CASES {
        let answered = request(&mut gate, case.request).await;
        if case.request == RESP3 {
            assert!(answered.starts_with(b"%"), "{answered:?}");
        } else {
            assert_eq!(
                String::from_utf8_lossy(&answered),
                String::from_utf8_lossy(case.gate),
                "the gate's reply to {}",
                case.request
            );
        }
        let Some(redisbloom) = &mut redisbloom else {
            continue;
        };
        let theirs = request(redisbloom, case.request).await;
        let expected = case.redisbloom.map_or(case.gate, |(theirs, _)| theirs);
        if case.request != RESP3 {
            assert_eq!(
                String::from_utf8_lossy(&theirs),
                String::from_utf8_lossy(expected),
                "RedisBloom's reply to {} ({})",
                case.request,
                case.redisbloom
                    .map_or("the same as the gate's", |(_, why)| why)
            );
        }
    }
}

/// Sends `request` (arguments split at spaces) as a RESP array and reads one whole reply.
async fn request(stream: &mut TcpStream, request: &str) -> Vec<u8> {
    let args: Vec<&str> = request.split(' ').collect();
    let mut encoded = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        encoded.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    stream.write_all(&encoded).await.unwrap();
    let mut reply = Vec::new();
    while reply_length(&reply).is_none() {
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("a reply within 10 s")
            .unwrap();
        assert!(n > 0, "the server closed the connection after {request}");
        reply.extend_from_slice(&chunk[..n]);
    }
    reply
}

/// The length of the whole RESP2/RESP3 reply at the start of `buffer`, once it is all there.
fn reply_length(buffer: &[u8]) -> Option<usize> {
    let line_end = buffer.windows(2).position(|w| w == b"\r\n")?;
    let count = || {
        std::str::from_utf8(&buffer[1..line_end])
            .ok()?
            .parse::<i64>()
            .ok()
    };
    let mut at = line_end + 2;
    match buffer.first()? {
        b'$' | b'=' | b'!' => {
            let length = count()?;
            if length >= 0 {
                at += usize::try_from(length).ok()? + 2;
            }
            (buffer.len() >= at).then_some(at)
        }
        kind @ (b'*' | b'~' | b'>' | b'%') => {
            let elements =
                usize::try_from(count()?.max(0)).ok()? * if *kind == b'%' { 2 } else { 1 };
            for _ in 0..elements {
                at += reply_length(&buffer[at..])?;
            }
            Some(at)
        }
        _ => Some(at),
    }
}
