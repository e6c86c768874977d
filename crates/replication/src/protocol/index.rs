//! The shared snapshots' index (`STREAM.$snapshots`): which record is a version of it, and what a version
//! names. A rule of the protocol, not of the bucket: the applier judges gaps by the index ([`gap`](super::gap)),
//! a start loads the snapshot it names, and junk taken for a version once stopped every start — so the
//! simulation reads the index through these same functions.

/// Whether `payload`, the body of a record stored at stream seq `at`, is an index: seqs, eight bytes each,
/// rising, none 0, and each below `at` — a snapshot is shared after the seq it covers was applied, so the
/// record naming it comes later in the stream. On a stream whose records are sealed junk is refused before
/// (its checksum); on an older stream's unsealed records this is the only check: eight random bytes make a
/// rising list of one seq almost always, and a seq far past the stream's end named snapshots no bucket held,
/// so that every start and restart failed to download one; below `at`, eight random bytes pass once in
/// about 2⁴⁴ tries on a stream of a million messages. Empty names no snapshot: what
/// `IndexRead::confirm` writes where no snapshot was shared yet.
pub fn valid_index(at: u64, payload: &[u8]) -> bool {
    let seqs = covered_seqs(payload);
    payload.len().is_multiple_of(8)
        && seqs.windows(2).all(|pair| pair[0] < pair[1])
        && seqs.first().is_none_or(|first| *first > 0)
        && seqs.last().is_none_or(|last| *last < at)
}

/// The index record's seqs, oldest first.
pub fn covered_seqs(payload: &[u8]) -> Vec<u64> {
    payload
        .chunks_exact(8)
        .map(|seq| u64::from_le_bytes(seq.try_into().expect("8 bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::valid_index;

    fn index(seqs: &[u64]) -> Vec<u8> {
        seqs.iter().flat_map(|s| s.to_le_bytes()).collect()
    }

    #[test]
    fn an_index_names_rising_seqs_before_its_own() {
        assert!(valid_index(100, &index(&[40, 60, 99])));
        assert!(valid_index(100, &[]));
        assert!(
            !valid_index(100, &index(&[40, 100])),
            "a seq at or past the record's own"
        );
        assert!(!valid_index(100, &index(&[60, 40])), "not rising");
        assert!(!valid_index(100, &index(&[0, 40])), "seq 0");
        assert!(!valid_index(100, b"abc"), "not whole seqs");
        // Eight bytes of junk (here ASCII) read as one seq far past the stream's end.
        assert!(!valid_index(1_000_000, b"junk!!!!"));
    }
}
