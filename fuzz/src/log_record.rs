//! The `log_record` target: one log record's payload through the mutation codec, and the same bytes through
//! the frame layer.

use existence_gate::storage::{codec, frame};

/// Decodes `data` as one log record (a decoded record must re-encode to exactly `data`, or — a record of an
/// older type, which is written in the current one — to bytes that decode to the same mutation), reads it
/// as a sequence of frames decoding each payload, and scans it for a valid frame.
pub fn log_record(data: &[u8]) {
    if let Ok(mutation) = codec::decode(data) {
        let mut again = Vec::new();
        codec::encode(&mutation, &mut again);
        let older = [
            codec::RECORD_ABSENT_UNOBSERVED,
            codec::ADD_FIXED,
            codec::REBUILD_FIXED,
        ];
        if data[0] == codec::ADD_UNIFORM {
            again.clear();
            codec::encode_with_seq(
                &mutation,
                mutation.seq(),
                codec::KeyLengths::Uniform,
                &mut again,
            );
            assert_eq!(
                again, data,
                "an Add of keys of one length re-encodes differently"
            );
        } else if older.contains(&data[0]) {
            let upgraded = codec::decode(&again).expect("a re-encoded record decodes");
            assert_eq!(
                upgraded, mutation,
                "an older record re-encodes to another mutation"
            );
        } else {
            assert_eq!(again, data, "a decoded record re-encodes differently");
        }
    }
    let mut reader = frame::Reader::new(data, data.len() as u64);
    let mut last_offset = None;
    loop {
        match reader.next_frame() {
            Ok(frame::Next::Frame(offset, payload)) => {
                assert!(last_offset.is_none_or(|last| offset > last) || payload.is_empty());
                assert!(offset + frame::HEADER_BYTES + payload.len() as u64 <= data.len() as u64);
                last_offset = Some(offset);
                let _ = codec::decode(payload);
            }
            Ok(frame::Next::End) => {
                assert_eq!(reader.offset(), data.len() as u64);
                break;
            }
            Ok(frame::Next::Damaged(damage)) => {
                assert!(damage.offset <= data.len() as u64);
                break;
            }
            Err(error) => panic!("reading frames from memory failed: {error}"),
        }
    }
    let _ = frame::contains_valid_frame(data);
}
