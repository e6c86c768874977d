//! Pub/Sub: `SUBSCRIBE invalidations:<namespace>[@<seq>]`, the forwarder of each subscription, and the
//! invalidations pushed to the connection, written out a part at a time.
//!
//! One invalidation may carry a whole batch `Add` (up to `max_batch_keys` keys of up to `max_key_bytes`
//! each: tens of MB once rendered as one `message` per key). Rendered whole into each subscriber's output,
//! every subscriber that does not read held its own copy: 50 of them took the gate from 13 to 651 MB
//! during 10,000 `Add`s. So a push is rendered [`PUSH_CHUNK`] bytes at a time (whole messages), and the next
//! part only once the last is written: a subscriber that does not read holds one part, and the
//! invalidations themselves are shared with every other subscriber and the replay buffer.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::bloom;
use super::reply::{Outcome, Protocol, Refusal, Replies};
use super::session::Session;
use crate::auth::Role;
use crate::core::invalidations::Delivery;
use crate::grpc::RESUME_WAIT;
use crate::subscriptions::Held;
use tokio::task::AbortHandle;

/// The channel prefix of a namespace's invalidations.
pub const INVALIDATIONS: &str = "invalidations:";

/// A subscription of a connection: the task forwarding its invalidations, and its place in its token's
/// count ([`subscriptions`](crate::subscriptions)); dropped (unsubscribed, reset, the connection closed),
/// it stops the one and gives back the other.
#[derive(Debug)]
pub struct Subscribed {
    forwarder: AbortHandle,
    _held: Option<Held>,
}

impl Drop for Subscribed {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

/// Bytes of a push rendered at once, at most (plus the one message that crosses it).
pub const PUSH_CHUNK: usize = 64 * 1024;

/// An invalidation for a subscribed channel, on its way to the connection.
#[derive(Debug)]
pub struct Push {
    pub channel: Arc<str>,
    pub delivery: Delivery,
}

/// A push being written out: the push, and the index of its next key.
#[derive(Debug)]
pub struct Rendering {
    push: Push,
    next_key: usize,
}

impl Rendering {
    pub fn new(push: Push) -> Self {
        Self { push, next_key: 0 }
    }

    /// Renders the push's next messages into `out` in `protocol` — at least one, then more while `out` holds
    /// fewer than `chunk` bytes; whether the push is now written whole.
    pub fn next_part(&mut self, protocol: Protocol, out: &mut BytesMut, chunk: usize) -> bool {
        let mut replies = Replies { out, protocol };
        let channel = Arc::clone(&self.push.channel);
        let message = |replies: &mut Replies<'_>, payload: &[u8]| {
            replies.push(3);
            replies.bulk(b"message");
            replies.bulk(channel.as_bytes());
            replies.bulk(payload);
        };
        match &self.push.delivery {
            Delivery::Added(event) => {
                for key in event.keys.iter().skip(self.next_key) {
                    let mut payload = format!("added {} ", event.seq).into_bytes();
                    payload.extend_from_slice(&key);
                    message(&mut replies, &payload);
                    self.next_key += 1;
                    if replies.out.len() >= chunk {
                        break;
                    }
                }
                self.next_key == event.keys.len()
            }
            Delivery::Resync { seq } => {
                message(&mut replies, format!("resync {seq}").as_bytes());
                true
            }
        }
    }
}

impl Session {
    /// Whether the connection has subscriptions (only then can pushes arrive).
    pub fn is_subscribed(&self) -> bool {
        !self.subscriptions.is_empty()
    }

    /// Writes the next part of a push being written out into `out`; whether it is written whole.
    pub fn write_push(&self, rendering: &mut Rendering, out: &mut BytesMut) -> bool {
        rendering.next_part(self.protocol, out, PUSH_CHUNK)
    }

    /// `SUBSCRIBE invalidations:<namespace> ...`: one confirmation per channel, then its invalidations.
    pub(super) async fn subscribe(&mut self, channels: &[Bytes], out: &mut BytesMut) -> Outcome {
        for channel in channels {
            let (name, after_seq) = invalidation_channel(channel)?;
            let namespace = bloom::namespace(name.as_bytes())?;
            self.check(Role::Read, &namespace)?;
            let channel: Arc<str> = Arc::from(String::from_utf8_lossy(channel).as_ref());
            if let Some(other) = self
                .following(&namespace)
                .filter(|other| **other != channel)
            {
                return Err(Refusal::err(format!(
                    "this connection follows namespace {namespace:?} already, on channel {other}: one \
                     subscription per namespace and connection (each holds one of the namespace's \
                     max_subscribers_per_namespace places); UNSUBSCRIBE it first"
                )));
            }
            if !self.subscriptions.contains_key(&channel) {
                let held = self
                    .port
                    .access
                    .hold_subscription(self.authorization.as_deref())
                    .map_err(Refusal::err)?;
                if after_seq > 0 {
                    // A seq seen on a replica ahead of this one: reach it first, so the subscription goes
                    // on exactly (as gRPC's SubscribeInvalidations does) instead of with a resync.
                    self.port.writes.reach(after_seq, RESUME_WAIT).await;
                }
                let (_, mut subscription) = self
                    .port
                    .gate
                    .subscribe(&namespace, after_seq)
                    .map_err(bloom::refusal)?;
                let pushes = self.pushes.clone();
                let forwarded = Arc::clone(&channel);
                let forwarder = tokio::spawn(async move {
                    loop {
                        let delivery = subscription.next().await;
                        let push = Push {
                            channel: Arc::clone(&forwarded),
                            delivery,
                        };
                        if pushes.send(push).await.is_err() {
                            return;
                        }
                    }
                });
                let subscribed = Subscribed {
                    forwarder: forwarder.abort_handle(),
                    _held: held,
                };
                self.subscriptions.insert(Arc::clone(&channel), subscribed);
            }
            let count = self.subscriptions.len();
            let mut replies = self.replies(out);
            replies.push(3);
            replies.bulk(b"subscribe");
            replies.bulk(channel.as_bytes());
            replies.integer(count as i64);
        }
        Ok(())
    }

    /// The channel on which this connection follows `namespace`, if it does.
    fn following(&self, namespace: &str) -> Option<&Arc<str>> {
        self.subscriptions.keys().find(|channel| {
            invalidation_channel(channel.as_bytes())
                .ok()
                .and_then(|(name, _)| bloom::namespace(name.as_bytes()).ok())
                .is_some_and(|followed| followed == namespace)
        })
    }

    /// `UNSUBSCRIBE [channel ...]`: the channels named, or all.
    pub(super) fn unsubscribe(&mut self, channels: &[Bytes], out: &mut BytesMut) {
        let channels: Vec<Bytes> = if channels.is_empty() {
            self.subscriptions
                .keys()
                .map(|c| Bytes::copy_from_slice(c.as_bytes()))
                .collect()
        } else {
            channels.to_vec()
        };
        if channels.is_empty() {
            let mut replies = self.replies(out);
            replies.push(3);
            replies.bulk(b"unsubscribe");
            replies.null();
            replies.integer(0);
            return;
        }
        for channel in channels {
            let key: Arc<str> = Arc::from(String::from_utf8_lossy(&channel).as_ref());
            self.subscriptions.remove(&key);
            let count = self.subscriptions.len();
            let mut replies = self.replies(out);
            replies.push(3);
            replies.bulk(b"unsubscribe");
            replies.bulk(&channel);
            replies.integer(count as i64);
        }
    }
}

/// The namespace and the seq to resume after of a channel `invalidations:<namespace>` (from now on) or
/// `invalidations:<namespace>@<seq>` (everything after `seq`, or `resync` first if that cannot be served).
fn invalidation_channel(channel: &[u8]) -> Result<(&str, u64), Refusal> {
    let refused = || {
        Refusal::err(format!(
            "cannot subscribe to {:?}: the gate publishes only the channels {INVALIDATIONS}<namespace> and \
             {INVALIDATIONS}<namespace>@<seq> (resuming after seq)",
            String::from_utf8_lossy(channel)
        ))
    };
    let name = std::str::from_utf8(channel)
        .ok()
        .and_then(|c| c.strip_prefix(INVALIDATIONS))
        .ok_or_else(refused)?;
    match name.rsplit_once('@') {
        None => Ok((name, 0)),
        Some((name, seq)) => Ok((name, seq.parse().map_err(|_| refused())?)),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::core::invalidations::Invalidation;

    fn push(keys: usize, key_bytes: usize) -> Push {
        let keys: Vec<Bytes> = (0..keys)
            .map(|i| Bytes::from(format!("{i:0key_bytes$}")))
            .collect();
        Push {
            channel: Arc::from("invalidations:users"),
            delivery: Delivery::Added(Arc::new(Invalidation {
                seq: 7,
                at_ms: 0,
                keys: keys.into(),
            })),
        }
    }

    #[test]
    fn a_large_push_is_written_a_part_at_a_time_and_the_parts_make_the_whole() {
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let mut whole = BytesMut::new();
            assert!(Rendering::new(push(2_000, 1_000)).next_part(protocol, &mut whole, usize::MAX));
            assert!(whole.len() > 2_000_000);
            let (mut parts, mut rendering) = (BytesMut::new(), Rendering::new(push(2_000, 1_000)));
            let mut calls = 0;
            loop {
                let mut part = BytesMut::new();
                let done = rendering.next_part(protocol, &mut part, PUSH_CHUNK);
                assert!(part.len() < PUSH_CHUNK + 1_100, "{}", part.len());
                parts.extend_from_slice(&part);
                calls += 1;
                if done {
                    break;
                }
            }
            assert_eq!(parts, whole);
            assert!(calls > 30, "{calls}");
        }
    }

    #[test]
    fn a_resync_and_a_small_push_are_written_in_one_part() {
        let mut out = BytesMut::new();
        let resync = Push {
            channel: Arc::from("invalidations:users"),
            delivery: Delivery::Resync { seq: 9 },
        };
        assert!(Rendering::new(resync).next_part(Protocol::Resp2, &mut out, PUSH_CHUNK));
        assert_eq!(
            &out[..],
            b"*3\r\n$7\r\nmessage\r\n$19\r\ninvalidations:users\r\n$8\r\nresync 9\r\n"
        );
        assert!(Rendering::new(push(3, 4)).next_part(Protocol::Resp2, &mut out, PUSH_CHUNK));
    }
}
