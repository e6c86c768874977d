//! How the stream's own records are framed, so that junk published on their subjects is never taken for one.
//!
//! Anything with publish rights on `STREAM.>` can put bytes on `$member`, `$barrier`, `$sizing.<ns>`,
//! `$timing` or `$snapshots`. Records written as bare bodies were accepted by shape alone: eight random bytes
//! made a snapshots index naming a seq far past the stream's end, and every start and restart then failed to
//! download it. A **sealed** record cannot be made by accident:
//!
//! ```text
//! magic (8 bytes, one per record kind) | version (u16 LE) | body | CRC-32C of all before it (u32 LE)
//! ```
//!
//! A payload without the kind's magic, of a version this build does not read, or whose checksum does not
//! match, is junk: every replica passes it over alike, counts it (`existence_replica_skipped_messages_total`)
//! and logs subject, seq and why. Random bytes pass all three once in 2⁹⁶ tries; bytes copied from another
//! kind's record fail the magic. A checksum is no signature: someone who means to forge a record and may
//! publish on the stream can — keep publish rights to the replicas (docs/deployment.md).
//!
//! Streams set up before identity format 4 hold their records in the **legacy** form (a kind's legacy
//! prefix, then the body), and go on being written so: the older replicas on such a stream read nothing
//! else. A build older than format 4 refuses a stream set up in it, so no replica takes a sealed record
//! for junk.

/// The version of the sealed frame this build writes and reads.
const VERSION: u16 = 1;
/// The bytes around a sealed record's body: magic, version, checksum.
const OVERHEAD: usize = 8 + 2 + 4;

/// The kinds of the stream's own records that are replaced or added to over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// `$member`: joins, leaves, removals and hellos.
    Member,
    /// `$barrier`: a replica's lease barrier.
    Barrier,
    /// `$sizing.<namespace>`: a namespace's filter sizing.
    Sizing,
    /// `$timing`: the deployment's read lease and clock drift.
    Timing,
    /// `$snapshots`: the covered seqs of the shared snapshots.
    SnapshotIndex,
}

impl Record {
    /// The subject token after the stream's name (`$sizing` is followed by the namespace).
    pub(super) fn token(self) -> &'static str {
        match self {
            Self::Member => "$member",
            Self::Barrier => "$barrier",
            Self::Sizing => "$sizing",
            Self::Timing => "$timing",
            Self::SnapshotIndex => "$snapshots",
        }
    }

    /// What the record is, for messages.
    fn name(self) -> &'static str {
        match self {
            Self::Member => "membership record",
            Self::Barrier => "lease barrier",
            Self::Sizing => "sizing record",
            Self::Timing => "timing record",
            Self::SnapshotIndex => "snapshots index",
        }
    }

    fn magic(self) -> &'static [u8; 8] {
        match self {
            Self::Member => b"EXGMEMBS",
            Self::Barrier => b"EXGBARRS",
            Self::Sizing => b"EXGSIZES",
            Self::Timing => b"EXGTIMES",
            Self::SnapshotIndex => b"EXGSNAPS",
        }
    }

    /// What a legacy record of this kind starts with before its body.
    fn legacy_prefix(self) -> &'static [u8] {
        match self {
            Self::Member => b"EXGMEMB1",
            Self::Timing => b"existence-gate timing v1:",
            Self::Barrier | Self::Sizing | Self::SnapshotIndex => b"",
        }
    }
}

/// How a stream's records are framed; its identity's format says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Streams set up in identity formats 1 to 3.
    Legacy,
    /// Streams set up in identity format 4 or later.
    Sealed,
}

impl Framing {
    /// The identity format from which records are sealed.
    pub(super) const SEALED_FROM_FORMAT: u32 = 4;

    /// The framing of a stream whose identity has `format`.
    pub(super) fn of_format(format: u32) -> Self {
        if format >= Self::SEALED_FROM_FORMAT {
            Self::Sealed
        } else {
            Self::Legacy
        }
    }

    /// The payload of a `record` holding `body`.
    pub fn frame(self, record: Record, body: &[u8]) -> Vec<u8> {
        match self {
            Self::Legacy => [record.legacy_prefix(), body].concat(),
            Self::Sealed => {
                let mut payload = Vec::with_capacity(body.len() + OVERHEAD);
                payload.extend_from_slice(record.magic());
                payload.extend_from_slice(&VERSION.to_le_bytes());
                payload.extend_from_slice(body);
                payload.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
                payload
            }
        }
    }

    /// The body of `payload` if it is a `record`; otherwise why it is junk.
    pub fn body(self, record: Record, payload: &[u8]) -> Result<&[u8], String> {
        let what = record.name();
        match self {
            Self::Legacy => payload
                .strip_prefix(record.legacy_prefix())
                .ok_or_else(|| format!("{} bytes that are not a {what}", payload.len())),
            Self::Sealed => {
                let Some(framed) = payload.len().checked_sub(4).filter(|n| *n >= OVERHEAD - 4)
                else {
                    return Err(format!(
                        "{} bytes, too short for a {what} ({OVERHEAD} at least)",
                        payload.len()
                    ));
                };
                if &payload[..8] != record.magic() {
                    return Err(format!("{} bytes that are not a {what}", payload.len()));
                }
                let version = u16::from_le_bytes([payload[8], payload[9]]);
                if version != VERSION {
                    return Err(format!(
                        "a {what} of version {version}; this build reads version {VERSION}"
                    ));
                }
                let stored = u32::from_le_bytes(payload[framed..].try_into().expect("4 bytes"));
                if crc32c::crc32c(&payload[..framed]) != stored {
                    return Err(format!(
                        "a {what} whose checksum does not match its {} bytes (damaged, or not written by \
                         a replica)",
                        payload.len()
                    ));
                }
                Ok(&payload[10..framed])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KINDS: [Record; 5] = [
        Record::Member,
        Record::Barrier,
        Record::Sizing,
        Record::Timing,
        Record::SnapshotIndex,
    ];

    #[test]
    fn each_framing_reads_back_what_it_wrote_and_only_for_its_kind() {
        for framing in [Framing::Legacy, Framing::Sealed] {
            for record in KINDS {
                let payload = framing.frame(record, b"body");
                assert_eq!(framing.body(record, &payload).unwrap(), b"body");
            }
        }
        let member = Framing::Sealed.frame(Record::Member, b"body");
        let refused = Framing::Sealed.body(Record::Barrier, &member).unwrap_err();
        assert!(refused.contains("not a lease barrier"), "{refused}");
    }

    #[test]
    fn a_legacy_record_keeps_the_bytes_older_builds_wrote() {
        assert_eq!(
            Framing::Legacy.frame(Record::Timing, b" read_lease_ns=1"),
            b"existence-gate timing v1: read_lease_ns=1"
        );
        assert_eq!(
            Framing::Legacy.frame(Record::SnapshotIndex, b"12345678"),
            b"12345678"
        );
        assert_eq!(Framing::of_format(3), Framing::Legacy);
        assert_eq!(Framing::of_format(4), Framing::Sealed);
    }

    #[test]
    fn a_newer_version_is_named() {
        let mut payload = Framing::Sealed.frame(Record::Sizing, b"x");
        payload[8] = 2;
        let refused = Framing::Sealed.body(Record::Sizing, &payload).unwrap_err();
        assert!(refused.contains("version 2"), "{refused}");
    }

    proptest! {
        /// Junk is not a sealed record (the magic alone rules out random bytes), and one flipped bit of a
        /// sealed record is caught by the checksum, wherever it falls.
        #[test]
        fn junk_and_damage_are_refused(
            junk in proptest::collection::vec(any::<u8>(), 0..64),
            body in proptest::collection::vec(any::<u8>(), 0..64),
            bit in any::<prop::sample::Index>(),
            kind in 0..KINDS.len(),
        ) {
            let record = KINDS[kind];
            prop_assert!(Framing::Sealed.body(record, &junk).is_err());
            let mut payload = Framing::Sealed.frame(record, &body);
            let bit = bit.index(payload.len() * 8);
            payload[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Framing::Sealed.body(record, &payload).is_err());
        }
    }
}
