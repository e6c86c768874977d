//! The `requests` target: what a client can send, as a little program of typed calls and protobuf-encoded
//! requests against a gate, each answer checked against what validation and the contract promise.

use bytes::Bytes;
use existence_gate::core::answer::{Answer, Basis};
use existence_gate::core::config::GateConfig;
use existence_gate::core::gate::{Gate, GateError};
use existence_gate::core::namespace::{AbsenceReport, Rebuild, RecordOutcome};
use existence_gate::core::tombstones::AbsenceKind;
use existence_gate::proto;
use prost::Message;

use crate::shared::{exercise, new_gate, parsed, CONFIG, EDGE_CONFIG, START_MS};

/// The tokens whose digests [`CONFIG`] lists, and one it does not.
const TOKENS: [&str; 3] = ["reader-token", "writer-token", "admin-token"];

/// Namespace names the request check picks from before making up its own.
const NAMES: [&str; 7] = ["", "default", "users", "e", "Default", "nope", "users\0"];

/// Reads `data` as a little program of requests against a fresh gate: typed calls with made-up namespaces,
/// keys, kinds, seqs and TTLs, and raw protobuf bytes decoded into the request messages as the gRPC layer
/// does, then passed to the same calls. Checks that validation refuses exactly what breaks the limits, and
/// that answers keep their promises (an added key answers `MAY_EXIST`; a recorded absence answers `ABSENT`).
pub fn requests(data: &[u8]) {
    let mut input = Input(data);
    let config_text = if input.u8() % 4 == 3 {
        EDGE_CONFIG
    } else {
        CONFIG
    };
    let config = parsed(config_text);
    let (gate, clock) = new_gate(config_text);
    let mut rebuild: Option<(String, Rebuild)> = None;
    for _ in 0..64 {
        if input.is_empty() {
            break;
        }
        match input.u8() % 17 {
            0 => {
                let namespace = input.namespace();
                let key = input.bytes(80);
                check_may_exist(&gate, &namespace, key);
            }
            1 => {
                let namespace = input.namespace();
                let keys = input.keys();
                check_batch(&gate, &namespace, &keys);
            }
            2 => {
                let namespace = input.namespace();
                let keys = input.keys();
                check_add(&gate, &namespace, keys);
            }
            3 => {
                let namespace = input.namespace();
                let key = Bytes::copy_from_slice(input.bytes(80));
                let kind = input.u32() as i32;
                let observed_seq = input.seq();
                let ttl_seconds = input.u32();
                check_record_absent(
                    &gate,
                    &config,
                    &namespace,
                    key,
                    kind,
                    observed_seq,
                    ttl_seconds,
                );
            }
            4 => {
                let namespace = input.namespace();
                let after_seq = input.seq();
                check_subscribe(&gate, &namespace, after_seq);
            }
            5 => clock.advance(u64::from(input.u32())),
            6 => {
                clock.set(START_MS.saturating_sub(u64::from(input.u32())) + u64::from(input.u16()))
            }
            7 => {
                if let Ok(request) =
                    proto::MayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_may_exist(&gate, &request.namespace, &request.key);
                }
            }
            8 => {
                if let Ok(request) =
                    proto::BatchMayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_batch(&gate, &request.namespace, &request.keys);
                }
            }
            9 => {
                if let Ok(request) = proto::AddRequest::decode(input.bytes(512)).map(|mut r| {
                    resolve_namespace(&mut r.namespace);
                    r
                }) {
                    check_add(&gate, &request.namespace, request.keys);
                }
            }
            10 => {
                if let Ok(request) =
                    proto::RecordAbsentRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_record_absent(
                        &gate,
                        &config,
                        &request.namespace,
                        request.key,
                        request.kind,
                        request.observed_seq,
                        request.ttl_seconds,
                    );
                }
            }
            11 => {
                if let Ok(request) = proto::SubscribeInvalidationsRequest::decode(input.bytes(512))
                    .map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_subscribe(&gate, &request.namespace, request.after_seq);
                }
            }
            12 => {
                let finish = input.u8() % 3 == 0;
                if let Ok(request) = proto::RebuildRequest::decode(input.bytes(512)).map(|mut r| {
                    resolve_namespace(&mut r.namespace);
                    r
                }) {
                    check_rebuild(&gate, &mut rebuild, request, finish);
                }
            }
            13 => {
                if let Ok(request) =
                    proto::BatchMayExistRequest::decode(input.bytes(512)).map(|mut r| {
                        resolve_namespace(&mut r.namespace);
                        r
                    })
                {
                    check_batch_request(&gate, request);
                }
            }
            14 => {
                let max_keys = usize::from(input.u8());
                let _ = check_unpack(input.bytes(512), max_keys);
            }
            15 => {
                let header = input.authorization();
                let role = input.u8();
                let namespace = input.namespace();
                check_authorization(&config, header.as_deref(), role, &namespace);
            }
            _ => {
                gate.maintain();
                let _ = gate.stats();
                gate.export_gauges();
            }
        }
    }
    if let Some((_, rebuild)) = rebuild {
        let _ = rebuild.finish();
    }
    exercise(&gate);
}

/// What the gRPC layer does to every request's namespace before anything else sees it.
fn resolve_namespace(namespace: &mut String) {
    existence_gate::service::grpc::resolve_namespace(namespace);
}

/// `BatchMayExist` as the gRPC layer serves it: `keys`, or `packed_keys` unpacked, never both.
fn check_batch_request(gate: &Gate, request: proto::BatchMayExistRequest) {
    if request.packed_keys.is_empty() {
        return check_batch(gate, &request.namespace, &request.keys);
    }
    if !request.keys.is_empty() {
        return;
    }
    let max = gate.limits().max_batch_keys;
    if let Ok(keys) = check_unpack(&request.packed_keys, max) {
        let keys: Vec<Bytes> = keys.into_iter().map(Bytes::copy_from_slice).collect();
        check_batch(gate, &request.namespace, &keys);
    }
}

/// `request_keys::unpack_keys`: what it returns lies within the input, in order, and within the limit.
fn check_unpack(packed: &[u8], max_keys: usize) -> Result<Vec<&[u8]>, ()> {
    match existence_gate::service::request_keys::unpack_keys(packed, max_keys) {
        Ok(keys) => {
            assert!(keys.len() <= max_keys, "more keys than the limit");
            let mut rest = packed;
            for key in &keys {
                let length = prost::encoding::decode_varint(&mut rest).expect("a length");
                assert_eq!(length as usize, key.len());
                assert_eq!(
                    &rest[..key.len()],
                    *key,
                    "a key is not where its length says"
                );
                rest = &rest[key.len()..];
            }
            assert!(rest.is_empty(), "bytes left over after the last key");
            Ok(keys)
        }
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            Err(())
        }
    }
}

/// Bearer tokens: a check passes only for a configured token with the role on the namespace.
fn check_authorization(config: &GateConfig, header: Option<&str>, role: u8, namespace: &str) {
    use existence_gate::service::auth::{Authorizer, Role, Scope};
    let authorizer = Authorizer::new(&config.tokens).expect("validated with the configuration");
    let role = match role % 3 {
        0 => Role::Read,
        1 => Role::Write,
        _ => Role::Admin,
    };
    let scope = match namespace.len() % 5 {
        3 => Scope::All,
        4 => Scope::Any,
        _ => Scope::Namespace(namespace),
    };
    let allowed = authorizer.check(header, role, scope).is_ok();
    if !authorizer.is_enabled() {
        assert!(allowed, "a gate without tokens refused a call");
        return;
    }
    let token = header
        .and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
        })
        .map(str::trim);
    let known = token.is_some_and(|t| {
        let digest = existence_gate::service::auth::hash_token(t);
        config
            .tokens
            .iter()
            .any(|c| c.sha256.trim().eq_ignore_ascii_case(&digest))
    });
    if allowed {
        assert!(known, "a call without a configured token was admitted");
    }
    if matches!(scope, Scope::Namespace(_)) {
        assert_eq!(
            authorizer.allows(header, role, namespace),
            allowed,
            "allows and check disagree"
        );
    }
}

/// The namespace `name` resolves to ("" is `default`), if configured.
fn resolve(gate: &Gate, name: &str) -> Option<String> {
    gate.namespace(name).ok().map(|n| n.name().to_string())
}

/// What validation must say about a namespace and keys: `Some(error kind)` or `None` for valid.
fn expected_refusal(
    gate: &Gate,
    namespace: &str,
    keys: &[&[u8]],
    batch: bool,
) -> Option<&'static str> {
    let limits = gate.limits();
    if resolve(gate, namespace).is_none() {
        return Some("unknown namespace");
    }
    if batch && keys.len() > limits.max_batch_keys {
        return Some("invalid");
    }
    if keys
        .iter()
        .any(|k| k.is_empty() || k.len() > limits.max_key_bytes)
    {
        return Some("invalid");
    }
    None
}

#[allow(unreachable_patterns)]
fn kind_of(error: &GateError) -> &'static str {
    match error {
        GateError::UnknownNamespace(_) => "unknown namespace",
        GateError::InvalidArgument(_) => "invalid",
        GateError::Unavailable(_) => "unavailable",
        GateError::Conflict(_) => "conflict",
        _ => "other",
    }
}

fn check_may_exist(gate: &Gate, namespace: &str, key: &[u8]) {
    let expected = expected_refusal(gate, namespace, &[key], false);
    match gate.may_exist(namespace, key) {
        Ok((lookup, seq)) => {
            assert_eq!(expected, None, "an invalid lookup was answered");
            assert_eq!(
                seq,
                gate.namespace(namespace).expect("resolves").latest_seq()
            );
            let _ = lookup;
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_batch(gate: &Gate, namespace: &str, keys: &[Bytes]) {
    let slices: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    let expected = expected_refusal(gate, namespace, &slices, true);
    let mut answers = Vec::new();
    match gate.batch_may_exist(namespace, keys, &mut answers) {
        Ok(_) => {
            assert_eq!(expected, None, "an invalid batch was answered");
            assert_eq!(answers.len(), keys.len());
            for (key, answer) in keys.iter().zip(&answers) {
                let (single, _) = gate.may_exist(namespace, key).expect("valid");
                assert_eq!(
                    single.answer, answer.answer,
                    "batch and single lookups disagree"
                );
            }
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_add(gate: &Gate, namespace: &str, keys: Vec<Bytes>) {
    let slices: Vec<&[u8]> = keys.iter().map(|k| k.as_ref()).collect();
    let mut expected = expected_refusal(gate, namespace, &slices, true);
    if expected.is_none() && keys.is_empty() {
        expected = Some("invalid");
    }
    let before = gate.namespace(namespace).map(|n| n.latest_seq()).ok();
    match gate.add(namespace, keys.clone()) {
        Ok(added) => {
            assert_eq!(expected, None, "an invalid add was applied");
            assert_eq!(
                Some(added.seq),
                before.map(|s| s + 1),
                "an add skipped a seq"
            );
            let mut answers = Vec::new();
            gate.batch_may_exist(namespace, &keys, &mut answers)
                .expect("valid");
            assert!(
                answers.iter().all(|a| a.answer == Answer::MayExist),
                "a key just added answers ABSENT"
            );
        }
        Err(error) => {
            assert_eq!(Some(kind_of(&error)), expected, "{error}");
            assert_eq!(
                gate.namespace(namespace).map(|n| n.latest_seq()).ok(),
                before
            );
        }
    }
}

fn check_record_absent(
    gate: &Gate,
    config: &GateConfig,
    namespace: &str,
    key: Bytes,
    kind: i32,
    observed_seq: u64,
    ttl_seconds: u32,
) {
    // The gRPC layer's mapping of the enum: unknown values are refused before the gate sees them.
    let kind = match proto::AbsenceKind::try_from(kind) {
        Ok(proto::AbsenceKind::Unspecified | proto::AbsenceKind::Missing) => AbsenceKind::Missing,
        Ok(proto::AbsenceKind::Deleted) => AbsenceKind::Deleted,
        Err(_) => return,
    };
    let before = gate.namespace(namespace).map(|n| n.latest_seq()).ok();
    // An observation newer than anything this gate issued cannot have been made here.
    let expected = expected_refusal(gate, namespace, &[&key], false).or_else(|| {
        before
            .is_some_and(|latest| observed_seq > latest)
            .then_some("invalid")
    });
    let report = AbsenceReport {
        key: key.clone(),
        kind,
        observed_seq,
        ttl_seconds,
    };
    match gate.record_absent(namespace, report) {
        Ok(recorded) => {
            assert_eq!(expected, None, "an invalid absence was recorded");
            let canonical = resolve(gate, namespace).expect("resolves");
            let settings = &config.namespaces[&canonical];
            if recorded.outcome == RecordOutcome::Recorded {
                assert_eq!(Some(recorded.seq), before.map(|s| s + 1));
                assert!(recorded.expires_in_ms >= 1);
                assert!(u128::from(recorded.expires_in_ms) <= settings.max_ttl.as_millis());
                let (lookup, _) = gate.may_exist(namespace, &key).expect("valid");
                assert_eq!(
                    (lookup.answer, lookup.basis),
                    (Answer::Absent, Basis::Tombstone),
                    "a recorded absence does not answer"
                );
            } else {
                assert_eq!(
                    Some(recorded.seq),
                    before,
                    "a refused absence moved the seq"
                );
                assert_eq!(recorded.expires_in_ms, 0);
            }
        }
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
}

fn check_subscribe(gate: &Gate, namespace: &str, after_seq: u64) {
    match gate.subscribe(namespace, after_seq) {
        Ok((name, mut subscription)) => {
            assert_eq!(Some(name.to_string()), resolve(gate, namespace));
            let latest = gate.namespace(namespace).expect("resolves").latest_seq();
            let mut last = None;
            for _ in 0..8 {
                match subscription.poll_ready() {
                    None => break,
                    Some(existence_gate::core::invalidations::Delivery::Added(event)) => {
                        assert!(
                            last.is_none_or(|l| event.seq > l),
                            "invalidations out of order"
                        );
                        assert!(event.seq <= latest);
                        last = Some(event.seq);
                    }
                    Some(existence_gate::core::invalidations::Delivery::Resync { seq }) => {
                        assert!(seq <= latest);
                        last = Some(seq);
                    }
                }
            }
        }
        Err(error) => {
            assert_eq!(resolve(gate, namespace), None, "{error}");
            assert!(matches!(error, GateError::UnknownNamespace(_)));
        }
    }
}

fn check_rebuild(
    gate: &Gate,
    rebuild: &mut Option<(String, Rebuild)>,
    request: proto::RebuildRequest,
    finish: bool,
) {
    if rebuild.is_none() {
        if let Ok(started) = gate.begin_rebuild(&request.namespace) {
            let name = resolve(gate, &request.namespace).expect("resolves");
            *rebuild = Some((name, started));
        } else {
            return;
        }
    }
    let (name, running) = rebuild.as_mut().expect("running");
    let name = name.clone();
    let slices: Vec<&[u8]> = request.keys.iter().map(|k| k.as_ref()).collect();
    let expected = expected_refusal(gate, &name, &slices, true);
    match gate.feed_rebuild(running, &request.keys) {
        Ok(()) => assert_eq!(expected, None, "invalid rebuild keys were taken"),
        Err(error) => assert_eq!(Some(kind_of(&error)), expected, "{error}"),
    }
    if finish {
        let (_, running) = rebuild.take().expect("running");
        running.finish().expect("no write panicked");
        let fed: Vec<Bytes> = request
            .keys
            .into_iter()
            .filter(|_| expected.is_none())
            .collect();
        let mut answers = Vec::new();
        if !fed.is_empty() {
            gate.batch_may_exist(&name, &fed, &mut answers)
                .expect("valid");
            assert!(
                answers
                    .iter()
                    .all(|a| a.answer == Answer::MayExist || a.basis == Basis::Tombstone),
                "a key fed to a rebuild answers ABSENT from the filter"
            );
        }
    }
}

/// A cursor over fuzz input: reads past the end yield zeros and empty slices.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }

    fn fixed<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let head = self.take(N);
        out[..head.len()].copy_from_slice(head);
        out
    }

    fn u8(&mut self) -> u8 {
        self.fixed::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.fixed())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.fixed())
    }

    /// A seq: small values (near the ones the gate hands out) mostly, any u64 sometimes.
    fn seq(&mut self) -> u64 {
        match self.u8() {
            0..=199 => u64::from(self.u8()),
            200..=249 => u64::from(self.u32()),
            _ => u64::from_le_bytes(self.fixed()),
        }
    }

    /// A length byte, then that many bytes (at most `max`).
    fn bytes(&mut self, max: usize) -> &'a [u8] {
        let len = if max > 255 {
            usize::from(self.u16()) % (max + 1)
        } else {
            usize::from(self.u8()) % (max + 1)
        };
        self.take(len)
    }

    /// A namespace: one of [`NAMES`] mostly, made-up bytes sometimes.
    fn namespace(&mut self) -> String {
        let pick = self.u8();
        match NAMES.get(usize::from(pick)) {
            Some(name) => (*name).to_string(),
            None if pick >= 128 => String::from_utf8_lossy(self.bytes(140)).into_owned(),
            None => NAMES[usize::from(pick) % NAMES.len()].to_string(),
        }
    }

    /// An `authorization` value: missing, a bearer header with a known token, or made-up text.
    fn authorization(&mut self) -> Option<String> {
        let pick = self.u8();
        let token = TOKENS[usize::from(pick) % TOKENS.len()];
        match pick % 8 {
            0 => None,
            1 => Some(format!("Bearer {token}")),
            2 => Some(format!("bearer  {token} ")),
            3 => Some(format!("Basic {token}")),
            4 => Some(token.to_string()),
            _ => Some(String::from_utf8_lossy(self.bytes(80)).into_owned()),
        }
    }

    /// A count byte, then that many keys.
    fn keys(&mut self) -> Vec<Bytes> {
        let count = usize::from(self.u8() % 24);
        (0..count)
            .map(|_| Bytes::copy_from_slice(self.bytes(80)))
            .collect()
    }
}
