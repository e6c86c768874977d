//! RedisBloom's commands, and the gate's own, on the gate's namespaces: the Redis key is the namespace.
//!
//! Answers are RedisBloom's wherever that keeps the gate's guarantees: `BF.EXISTS` is `0` only where gRPC
//! would answer `ABSENT` (the filter, a live tombstone, and on a replica only under its read lease); an
//! `ADD` is acknowledged under the same rule as gRPC's `Add`. Where the models differ (namespaces are
//! configured, capacity and error rate too, keys expire by windows) the table in docs/resp.md says what a
//! RedisBloom user sees instead.

use bytes::Bytes;

use super::reply::{Outcome, Protocol, Refusal, Replies};
use super::Port;
use crate::core::answer::{Answer, Basis};
use crate::core::gate::GateError;
use crate::core::keys::PackedKeys;
use crate::core::namespace::{AbsenceReport, NewKeys, RecordOutcome};
use crate::core::tombstones::AbsenceKind;

/// The namespace a command names: UTF-8, `""` meaning `default` (as in gRPC).
pub fn namespace(key: &[u8]) -> Result<String, Refusal> {
    let mut name = std::str::from_utf8(key)
        .map_err(|_| Refusal::err("a namespace name must be UTF-8"))?
        .to_string();
    crate::grpc::resolve_namespace(&mut name);
    Ok(name)
}

/// The RESP error for a refused call: retryable ones as Redis's `TRYAGAIN`, the rest as `ERR`.
pub fn refusal(error: GateError) -> Refusal {
    let kind = match error {
        GateError::Unavailable(_) => "TRYAGAIN",
        _ => "ERR",
    };
    Refusal {
        kind,
        message: match error {
            GateError::UnknownNamespace(name) => format!(
                "namespace {name:?} is not configured: the gate's namespaces are [namespaces.NAME] tables of \
                 its configuration, not created by BF.RESERVE or BF.ADD"
            ),
            other => other.to_string(),
        },
    }
}

/// `BF.EXISTS` answers for `keys`, one lookup pass (a pipelined run of them lands here).
pub fn exists_many<K: AsRef<[u8]>>(
    port: &Port,
    namespace: &str,
    keys: &[K],
) -> Result<Vec<bool>, Refusal> {
    let mut lookups = Vec::with_capacity(keys.len());
    port.gate
        .batch_may_exist(namespace, keys, &mut lookups)
        .map_err(refusal)?;
    Ok(lookups
        .iter()
        .map(|l| l.answer == Answer::MayExist)
        .collect())
}

/// `BF.EXISTS namespace item`: 1 = may exist, 0 = definitely absent (`true`/`false` in RESP3, as
/// RedisBloom answers there).
pub fn exists(port: &Port, namespace: &str, key: &[u8], replies: &mut Replies<'_>) -> Outcome {
    let (lookup, _) = port.gate.may_exist(namespace, key).map_err(refusal)?;
    replies.boolean(lookup.answer == Answer::MayExist);
    Ok(())
}

/// `BF.MEXISTS namespace item ...`.
pub fn mexists(port: &Port, namespace: &str, keys: &[Bytes], replies: &mut Replies<'_>) -> Outcome {
    let answers = exists_many(port, namespace, keys)?;
    replies.array(answers.len());
    for may_exist in answers {
        replies.boolean(may_exist);
    }
    Ok(())
}

/// `BF.ADD namespace item` (one integer) and `BF.MADD namespace item ...` (an array): 1 for an item the
/// filter answered absent for just before the `Add` applied (and not earlier in it), as RedisBloom answers
/// 1 for an item not yet present; 0 for one that could already exist. Decided where `Add`s are ordered
/// ([`Added::new`](crate::core::namespace::Added::new)), so of concurrent `BF.ADD`s of one new item exactly
/// one gets 1: a lookup before the `Add` let 8 concurrent callers each see it absent (more than one 1 in 64
/// of 300 rounds). All items go in one `Add`, under one seq.
pub async fn add(
    port: &Port,
    namespace: &str,
    keys: &[Bytes],
    as_array: bool,
    replies: &mut Replies<'_>,
) -> Outcome {
    let new = add_keys(port, namespace, keys).await.map_err(refusal)?;
    if as_array {
        replies.array(new.len());
        new.iter().for_each(|new| replies.boolean(*new));
    } else {
        replies.boolean(new[0]);
    }
    Ok(())
}

/// What a pipelined run of `BF.ADD`s and `BF.MADD`s came to as one `Add`.
pub enum AddRun {
    /// Whether each item, in order, was new (the first of equal items only).
    Added(Vec<bool>),
    /// An item is invalid: nothing was added; each command must run alone.
    Invalid,
    /// Refused as each command alone would have been.
    Refused(Refusal),
}

/// The items of a run of `BF.ADD`s and `BF.MADD`s (each command's, in order) added as one `Add`.
pub async fn add_run(port: &Port, namespace: &str, commands: &[&[Bytes]]) -> AddRun {
    let keys: Vec<Bytes> = commands
        .iter()
        .flat_map(|items| items.iter().cloned())
        .collect();
    match add_keys(port, namespace, &keys).await {
        Err(GateError::InvalidArgument(_)) => AddRun::Invalid,
        Err(error) => AddRun::Refused(refusal(error)),
        Ok(new) => AddRun::Added(new),
    }
}

/// Adds `keys` as one `Add`: whether each was new.
async fn add_keys(port: &Port, namespace: &str, keys: &[Bytes]) -> Result<Vec<bool>, GateError> {
    let added = port
        .writes
        .add(namespace, PackedKeys::pack(keys), NewKeys::Report)
        .await?;
    let mut new = vec![false; keys.len()];
    for position in added.new.unwrap_or_default() {
        new[position as usize] = true;
    }
    Ok(new)
}

/// `BF.INSERT namespace [CAPACITY n] [ERROR rate] [EXPANSION n] [NOCREATE] [NONSCALING] ITEMS item ...`:
/// `BF.MADD` of the items. The creation options are checked as RedisBloom 2.6 checks them, with its
/// replies (`Bad capacity`, `Bad argument received`, ...), and then left to the namespace's configuration,
/// as RedisBloom ignores them for a filter that exists.
pub async fn insert(
    port: &Port,
    namespace: &str,
    args: &[Bytes],
    replies: &mut Replies<'_>,
) -> Outcome {
    let wrong_arity = || Refusal::err("wrong number of arguments for 'bf.insert' command");
    let mut options = args.iter();
    let (mut nocreate, mut rate, mut capacity, mut expansion) = (false, 0.01, 100, 2);
    let items = loop {
        let option = options.next().ok_or_else(wrong_arity)?;
        match option.to_ascii_uppercase().as_slice() {
            b"ITEMS" => break options.as_slice(),
            b"NOCREATE" => nocreate = true,
            b"NONSCALING" => {}
            b"CAPACITY" => {
                let given = options.next().ok_or_else(wrong_arity)?;
                capacity = parse_integer(given).ok_or_else(|| Refusal::bare("Bad capacity"))?;
            }
            b"EXPANSION" => {
                let given = options.next().ok_or_else(wrong_arity)?;
                expansion = parse_integer(given).ok_or_else(|| Refusal::bare("Bad expansion"))?;
            }
            b"ERROR" => {
                let given = options.next().ok_or_else(wrong_arity)?;
                rate = parse_rate(given).ok_or_else(|| Refusal::bare("Bad error rate"))?;
            }
            _ => return Err(Refusal::bare("Unknown argument received")),
        }
    };
    if items.is_empty() {
        return Err(wrong_arity());
    }
    if !(rate > 0.0 && rate < 1.0) || capacity < 1 || expansion < 1 {
        return Err(Refusal::bare("Bad argument received"));
    }
    if nocreate && port.gate.namespace(namespace).is_err() {
        return Err(Refusal::err("not found"));
    }
    add(port, namespace, items, true, replies).await
}

/// `BF.RESERVE namespace error_rate capacity [EXPANSION n] [NONSCALING]`: a configured namespace exists
/// already (`item exists`, RedisBloom's answer for a key that exists); any other is refused with how to
/// configure it. Its arguments are checked first, in RedisBloom 2.6's order and with its replies; like it,
/// words other than `EXPANSION n` and `NONSCALING` are passed over.
pub fn reserve(port: &Port, namespace: &str, args: &[Bytes]) -> Outcome {
    if args.len() > 5 {
        return Err(Refusal::err(
            "wrong number of arguments for 'bf.reserve' command",
        ));
    }
    let rate = parse_rate(&args[0]).ok_or_else(|| Refusal::err("bad error rate"))?;
    if !(rate > 0.0 && rate < 1.0) {
        return Err(Refusal::err("(0 < error rate range < 1) "));
    }
    let capacity = parse_integer(&args[1]).ok_or_else(|| Refusal::err("bad capacity"))?;
    if capacity <= 0 {
        return Err(Refusal::err("(capacity should be larger than 0)"));
    }
    let named = |word: &str| {
        args.iter()
            .position(|a| a.eq_ignore_ascii_case(word.as_bytes()))
    };
    let nonscaling = named("NONSCALING").is_some();
    if let Some(at) = named("EXPANSION") {
        let value = args
            .get(at + 1)
            .ok_or_else(|| Refusal::err("no expansion"))?;
        if nonscaling {
            return Err(Refusal::bare("Nonscaling filters cannot expand"));
        }
        let expansion = parse_integer(value).ok_or_else(|| Refusal::err("bad expansion"))?;
        if expansion < 1 {
            return Err(Refusal::err("expansion should be greater or equal to 1"));
        }
    }
    port.gate.namespace(namespace).map_err(refusal)?;
    Err(Refusal::err("item exists"))
}

/// An integer argument, as Redis parses one (`None`: not one).
fn parse_integer(value: &Bytes) -> Option<i64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// An error rate argument, as Redis parses a double (`None`: not one; NaN is not one either).
fn parse_rate(value: &Bytes) -> Option<f64> {
    let rate: f64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    (!rate.is_nan()).then_some(rate)
}

/// `BF.INFO namespace [CAPACITY | SIZE | FILTERS | ITEMS | EXPANSION]`: RedisBloom's fields from the
/// namespace's configuration and filter (filters = live layers across windows; items = the estimated
/// distinct keys they hold; no expansion rate, as for a non-scaling filter: growth is by configuration).
pub fn info(port: &Port, namespace: &str, field: &[Bytes], replies: &mut Replies<'_>) -> Outcome {
    let configured = port.gate.namespace(namespace).map_err(refusal)?;
    let (stats, capacity) = (
        configured.stats(port.gate.read_time()),
        configured.settings().expected_keys,
    );
    let fields: [(&str, &str, Option<u64>); 5] = [
        ("CAPACITY", "Capacity", Some(capacity)),
        ("SIZE", "Size", Some(stats.filter.bytes)),
        (
            "FILTERS",
            "Number of filters",
            Some(stats.filter.layers as u64),
        ),
        ("ITEMS", "Number of items inserted", Some(stats.filter.keys)),
        ("EXPANSION", "Expansion rate", None),
    ];
    let value = |replies: &mut Replies<'_>, value: Option<u64>| match value {
        Some(n) => replies.integer(n as i64),
        None => replies.null(),
    };
    match field {
        [] => {
            replies.map(fields.len());
            for (_, label, n) in fields {
                replies.simple(label);
                value(replies, n);
            }
        }
        [name] => {
            let (_, label, n) = fields
                .iter()
                .find(|(key, _, _)| name.eq_ignore_ascii_case(key.as_bytes()))
                .ok_or_else(|| Refusal::bare("Invalid information value"))?;
            // One value; in RESP3 a map of one, named, as RedisBloom answers there.
            if replies.protocol == Protocol::Resp3 {
                replies.map(1);
                replies.simple(label);
            } else {
                replies.array(1);
            }
            value(replies, *n);
        }
        _ => {
            return Err(Refusal::err(
                "wrong number of arguments for 'bf.info' command",
            ))
        }
    }
    Ok(())
}

/// `BF.CARD namespace`: the estimated distinct items in the live windows.
pub fn card(port: &Port, namespace: &str, replies: &mut Replies<'_>) -> Outcome {
    let stats = port
        .gate
        .namespace(namespace)
        .map_err(refusal)?
        .stats(port.gate.read_time());
    replies.integer(stats.filter.keys as i64);
    Ok(())
}

/// `GATE.LOOKUP namespace item`: `[answer, basis, observed_seq]`, what gRPC's `MayExist` returns
/// (`MAY_EXIST`/`ABSENT`, `FILTER`/`TOMBSTONE`/`WARMING`), for the read path that records absences.
pub fn lookup(port: &Port, namespace: &str, key: &[u8], replies: &mut Replies<'_>) -> Outcome {
    let (lookup, observed_seq) = port.gate.may_exist(namespace, key).map_err(refusal)?;
    replies.array(3);
    replies.bulk(match lookup.answer {
        Answer::MayExist => b"MAY_EXIST",
        Answer::Absent => b"ABSENT",
    });
    replies.bulk(match lookup.basis {
        Basis::Filter => b"FILTER".as_slice(),
        Basis::Tombstone => b"TOMBSTONE",
        Basis::Warming => b"WARMING",
    });
    replies.integer(observed_seq as i64);
    Ok(())
}

/// `GATE.ABSENT namespace item [MISSING | DELETED] [SEQ observed_seq] [TTL seconds]`: `RecordAbsent`,
/// answered `[outcome, seq, expires_in_ms]` (`RECORDED`, `REDUNDANT`, `SUPERSEDED`, `THROTTLED`).
pub async fn absent(
    port: &Port,
    namespace: &str,
    args: &[Bytes],
    replies: &mut Replies<'_>,
) -> Outcome {
    let mut report = AbsenceReport {
        key: args[0].clone(),
        kind: AbsenceKind::Missing,
        observed_seq: 0,
        ttl_seconds: 0,
    };
    let mut options = args[1..].iter();
    while let Some(option) = options.next() {
        let number = |value: Option<&Bytes>, what: &str| {
            value
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .ok_or_else(|| Refusal::err(format!("{what} needs a non-negative integer")))
        };
        match option.to_ascii_uppercase().as_slice() {
            b"MISSING" => report.kind = AbsenceKind::Missing,
            b"DELETED" => report.kind = AbsenceKind::Deleted,
            b"SEQ" => report.observed_seq = number(options.next(), "SEQ")?,
            b"TTL" => {
                let seconds = number(options.next(), "TTL")?;
                report.ttl_seconds = u32::try_from(seconds).map_err(|_| {
                    Refusal::err(format!("TTL {seconds} is past the limit of {} seconds", u32::MAX))
                })?;
            }
            _ => {
                return Err(Refusal::err(format!(
                    "syntax error: unknown GATE.ABSENT option '{}' (MISSING, DELETED, SEQ n, TTL seconds)",
                    String::from_utf8_lossy(option)
                )))
            }
        }
    }
    let recorded = port
        .writes
        .record_absent(namespace, report)
        .await
        .map_err(refusal)?;
    replies.array(3);
    replies.bulk(match recorded.outcome {
        RecordOutcome::Recorded => b"RECORDED".as_slice(),
        RecordOutcome::Redundant => b"REDUNDANT",
        RecordOutcome::Superseded => b"SUPERSEDED",
        RecordOutcome::Throttled => b"THROTTLED",
    });
    replies.integer(recorded.seq as i64);
    replies.integer(recorded.expires_in_ms as i64);
    Ok(())
}
