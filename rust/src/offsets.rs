//! The values of a store's `offsets` column family, decoded without RocksDB.
//!
//! `"<topic>-<partition>"` maps to the changelog offset of the last applied
//! record and `status` to the open/closed marker, both 8-byte big-endian
//! signed. The bytes come from disk, so decoding is total: any key and value
//! either decode or give a message saying what is wrong with them. [`crate::store`]
//! reads the column family and adds the store's path to the message.

/// Name of the column family that holds offsets and the status marker.
pub const OFFSETS_CF: &str = "offsets";
/// Key of the status marker in [`OFFSETS_CF`].
pub const STATUS_KEY: &[u8] = b"status";
/// Key of Kafka Streams' interactive-query position in [`OFFSETS_CF`]
/// (`PositionSerde` bytes, trailing zeros included); not an offset, and
/// statestore neither reads nor writes it.
pub const POSITION_KEY: &[u8] = b"position";
/// Status value: the store is open (a crash leaves this behind).
pub const STATUS_OPEN: i64 = 1;
/// Status value: the store was closed cleanly.
pub const STATUS_CLOSED: i64 = 0;
/// The offset Kafka Streams records for a store whose task has not committed a
/// changelog record yet (its `OFFSET_UNKNOWN`): "no offset yet", a store to
/// restore from the changelog's start, never a position.
pub const OFFSET_UNKNOWN: i64 = -4;

/// Encode an offset or status value as 8-byte big-endian signed.
pub fn encode_i64(v: i64) -> [u8; 8] {
    v.to_be_bytes()
}

/// Decode an 8-byte big-endian signed value; any other length is `None`.
pub fn decode_i64(bytes: &[u8]) -> Option<i64> {
    <[u8; 8]>::try_from(bytes).ok().map(i64::from_be_bytes)
}

/// One entry of the offsets column family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsEntry {
    /// The status marker.
    Status(i64),
    /// The offset recorded for the topic partition named by the key.
    Offset(String, i64),
    /// Kafka Streams' position entry (skipped).
    Position,
}

/// Decode one `(key, value)` of the offsets column family. A key that is not
/// UTF-8 or a value that is not 8 bytes is an error naming the key.
pub fn decode_entry(key: &[u8], value: &[u8]) -> Result<OffsetsEntry, String> {
    if key == STATUS_KEY {
        return decode_i64(value)
            .map(OffsetsEntry::Status)
            .ok_or_else(|| format!("status marker is {} bytes, expected 8", value.len()));
    }
    if key == POSITION_KEY {
        return Ok(OffsetsEntry::Position);
    }
    let name = std::str::from_utf8(key).map_err(|_| format!("offsets key is not UTF-8: {key:?}"))?;
    let offset = decode_i64(value).ok_or_else(|| format!("offset of {name} is {} bytes, expected 8", value.len()))?;
    Ok(OffsetsEntry::Offset(name.to_string(), offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_decode_or_name_the_problem() {
        assert_eq!(decode_entry(b"t-0", &encode_i64(41)), Ok(OffsetsEntry::Offset("t-0".into(), 41)));
        assert_eq!(decode_entry(STATUS_KEY, &encode_i64(STATUS_OPEN)), Ok(OffsetsEntry::Status(STATUS_OPEN)));
        assert_eq!(decode_entry(b"t-0", b"xyz").unwrap_err(), "offset of t-0 is 3 bytes, expected 8");
        assert!(decode_entry(STATUS_KEY, b"").unwrap_err().contains("status marker is 0 bytes"));
        assert!(decode_entry(b"\xff-0", &encode_i64(1)).unwrap_err().contains("not UTF-8"));
        assert_eq!(decode_i64(&encode_i64(i64::MIN)), Some(i64::MIN));
        assert_eq!(decode_entry(POSITION_KEY, &[0, 0, 0, 0, 1, 0, 0]), Ok(OffsetsEntry::Position));
    }
}
