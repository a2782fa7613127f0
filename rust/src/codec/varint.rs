//! Kafka's variable-length integers: protobuf-style base-128 groups of the
//! zigzag-encoded value. `varint` fields are 32-bit, `varlong` fields 64-bit.
//! Decoding never reads past the slice it is given.

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VarintError {
    /// The slice ended inside the varint.
    Truncated,
    /// More continuation bytes than the type can hold.
    TooLong,
}

/// Zigzag-encode a signed 64-bit value.
#[inline]
pub fn zigzag64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Zigzag-decode to a signed 64-bit value.
#[inline]
pub fn unzigzag64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Read a varlong (up to 10 bytes) at `buf[*pos..]`, advancing `pos`.
#[inline(always)]
pub fn read_varlong(buf: &[u8], pos: &mut usize) -> Result<i64, VarintError> {
    match read_short(buf, *pos) {
        Some((v, n)) => {
            *pos += n;
            Ok(unzigzag64(v))
        }
        None => read_varlong_long(buf, pos),
    }
}

/// Read a varint (up to 5 bytes, value within i32) at `buf[*pos..]`.
#[inline(always)]
pub fn read_varint(buf: &[u8], pos: &mut usize) -> Result<i32, VarintError> {
    match read_short(buf, *pos) {
        // Two bytes hold 14 bits: always within i32.
        Some((v, n)) => {
            *pos += n;
            Ok(unzigzag64(v) as i32)
        }
        None => read_varint_long(buf, pos),
    }
}

/// The zigzagged value and length of a varint of one or two bytes at
/// `buf[at..]` (small deltas and lengths are by far the most common, then a
/// record's length and its offset delta in a large batch); `None` for a
/// longer one or a truncated one. Inlined into every field a record decodes.
#[inline(always)]
fn read_short(buf: &[u8], at: usize) -> Option<(u64, usize)> {
    let b0 = *buf.get(at)?;
    if b0 < 0x80 {
        return Some((b0 as u64, 1));
    }
    let b1 = *buf.get(at + 1)?;
    (b1 < 0x80).then_some(((b0 & 0x7f) as u64 | (b1 as u64) << 7, 2))
}

/// [`read_varlong`] of three bytes or more (or none: truncated), kept out of line.
#[cold]
#[inline(never)]
fn read_varlong_long(buf: &[u8], pos: &mut usize) -> Result<i64, VarintError> {
    let mut value: u64 = 0;
    let mut shift = 0u32;
    loop {
        let Some(&b) = buf.get(*pos) else { return Err(VarintError::Truncated) };
        *pos += 1;
        value |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Ok(unzigzag64(value));
        }
        shift += 7;
        if shift >= 70 {
            return Err(VarintError::TooLong);
        }
    }
}

/// [`read_varint`] of three bytes or more (or none: truncated), kept out of line.
#[cold]
#[inline(never)]
fn read_varint_long(buf: &[u8], pos: &mut usize) -> Result<i32, VarintError> {
    let start = *pos;
    let v = read_varlong_long(buf, pos)?;
    if *pos - start > 5 || v < i32::MIN as i64 || v > i32::MAX as i64 {
        return Err(VarintError::TooLong);
    }
    Ok(v as i32)
}

/// Append `v` as a varlong.
#[inline]
pub fn write_varlong(out: &mut Vec<u8>, v: i64) {
    let mut u = zigzag64(v);
    while u >= 0x80 {
        out.push((u as u8) | 0x80);
        u >>= 7;
    }
    out.push(u as u8);
}

/// Append `v` as a varint (same bytes as a varlong of the same value).
#[inline]
pub fn write_varint(out: &mut Vec<u8>, v: i32) {
    write_varlong(out, v as i64);
}

/// Number of bytes `v` takes as a varlong.
#[inline]
pub fn varlong_len(v: i64) -> usize {
    let u = zigzag64(v);
    let bits = 64 - (u | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_edges() {
        for v in [0i64, 1, -1, 63, -64, 64, -65, 300, i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            assert_eq!(out.len(), varlong_len(v), "{v}");
            let mut pos = 0;
            assert_eq!(read_varlong(&out, &mut pos), Ok(v));
            assert_eq!(pos, out.len());
        }
    }

    #[test]
    fn every_one_and_two_byte_value_decodes_at_the_end_and_inside_a_buffer() {
        for v in -9_000i64..9_000 {
            let mut out = vec![0x7f]; // something before it
            write_varlong(&mut out, v);
            let n = out.len();
            for tail in [&[][..], &[0x05], &[0x85, 0x01]] {
                let mut buf = out.clone();
                buf.extend_from_slice(tail);
                let mut pos = 1;
                assert_eq!(read_varlong(&buf, &mut pos), Ok(v), "{v} followed by {tail:?}");
                assert_eq!(pos, n, "{v} followed by {tail:?}");
            }
        }
    }

    #[test]
    fn known_bytes() {
        // zigzag: 0->0, -1->1, 1->2, -2->3; 150 -> 300 -> ac 02
        let mut out = Vec::new();
        write_varint(&mut out, -1);
        write_varint(&mut out, 150);
        assert_eq!(out, [0x01, 0xac, 0x02]);
    }

    #[test]
    fn truncated_and_overlong_are_errors() {
        let mut pos = 0;
        assert_eq!(read_varlong(&[0x80, 0x80], &mut pos), Err(VarintError::Truncated));
        let mut pos = 0;
        assert_eq!(read_varlong(&[0xff; 11], &mut pos), Err(VarintError::TooLong));
        let mut pos = 0;
        // 2^32 does not fit a varint
        let mut out = Vec::new();
        write_varlong(&mut out, 1 << 32);
        assert_eq!(read_varint(&out, &mut pos), Err(VarintError::TooLong));
    }
}
