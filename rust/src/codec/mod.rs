//! Kafka RecordBatch v2: encode and decode.
//!
//! A batch is a 61-byte header followed by its records (compressed as a whole
//! when the codec bits are set):
//!
//! ```text
//! baseOffset i64 | batchLength i32 | partitionLeaderEpoch i32 | magic i8 (=2) | crc u32
//! attributes i16 | lastOffsetDelta i32 | baseTimestamp i64 | maxTimestamp i64
//! producerId i64 | producerEpoch i16 | baseSequence i32 | recordsCount i32 | records...
//! ```
//!
//! `batchLength` counts the bytes after itself; the CRC-32C covers attributes
//! to the end. A record is `length varint, attributes i8, timestampDelta
//! varlong, offsetDelta varint, key, value, headers`, where byte fields are a
//! varint length (-1 = null) and their bytes. Decoding borrows keys, values
//! and headers from the input and never allocates from a length field: every
//! length is checked against the bytes actually present first.

mod compression;
pub mod varint;

pub use compression::{codec_name, compress, decompress, Compression, MAX_DECOMPRESSED};
use varint::{read_varint, read_varlong, varlong_len, write_varint, write_varlong, VarintError};

/// Bytes of the batch header, records excluded.
pub const HEADER_LEN: usize = 61;
/// baseOffset + batchLength: the bytes not counted by batchLength.
pub const LOG_OVERHEAD: usize = 12;
/// The only magic this codec reads and writes.
pub const MAGIC_V2: i8 = 2;
/// Where the CRC-covered part of a batch starts (the attributes field).
pub const CRC_START: usize = 21;
const CRC_OFFSET: usize = 17;
const MAGIC_OFFSET: usize = 16;

/// attributes bits 0-2: compression codec.
pub const COMPRESSION_MASK: i16 = 0x07;
/// attributes bit 3: timestamps are LogAppendTime (the batch's maxTimestamp).
pub const TIMESTAMP_TYPE_MASK: i16 = 0x08;
/// attributes bit 4: the batch belongs to a transaction.
pub const TRANSACTIONAL_MASK: i16 = 0x10;
/// attributes bit 5: the batch holds one control record (a transaction marker).
pub const CONTROL_MASK: i16 = 0x20;
/// attributes bit 6: the batch carries a delete horizon (compaction).
pub const DELETE_HORIZON_MASK: i16 = 0x40;

/// No producer (non-idempotent, non-transactional writes).
pub const NO_PRODUCER_ID: i64 = -1;

/// The kind of a control record (its key's `type` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlType {
    /// Type 0: the transaction was aborted.
    Abort,
    /// Type 1: the transaction was committed.
    Commit,
    /// Any other type (leader-change and KRaft records); carries the type.
    Other(i16),
    /// No record at all: the log cleaner empties a marker whose transaction
    /// has no data left but keeps the batch (with its control and
    /// transactional flags and offsets) when it is its producer's last
    /// (and, since Kafka 4.0, when it ends a cleaning round). Kafka's
    /// consumer skips it; it ends no transaction.
    Empty,
}

impl ControlType {
    /// Kafka's name of the marker (as kafka-dump-log prints it).
    pub fn name(self) -> String {
        match self {
            Self::Abort => "ABORT".into(),
            Self::Commit => "COMMIT".into(),
            Self::Other(t) => format!("TYPE_{t}"),
            Self::Empty => "EMPTY".into(),
        }
    }
}

/// Why bytes are not a valid batch. Messages describe the problem only; the
/// log layer adds the file, byte position and offset.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    /// A malformed header, a CRC mismatch, or records that do not parse.
    #[error("{0}")]
    Corrupt(String),
    /// The codec bits name a codec this build cannot decode.
    #[error("unsupported compression codec {0}")]
    UnsupportedCompression(String),
}

#[cold]
fn corrupt(msg: impl Into<String>) -> CodecError {
    CodecError::Corrupt(msg.into())
}

#[cold]
fn varint_err(what: &str, e: VarintError) -> CodecError {
    match e {
        VarintError::Truncated => corrupt(format!("record {what}: varint runs past the end of the record")),
        VarintError::TooLong => corrupt(format!("record {what}: varint too long")),
    }
}

#[inline]
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
#[inline]
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
#[inline]
fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The fixed fields of a RecordBatch v2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records_count: i32,
}

/// Read only baseOffset and batchLength (the first 12 bytes).
#[inline]
pub fn peek_offset_and_length(buf: &[u8]) -> Option<(i64, i32)> {
    if buf.len() < LOG_OVERHEAD {
        return None;
    }
    Some((be_i64(buf, 0), be_i32(buf, 8)))
}

impl BatchHeader {
    /// Parse and sanity-check the header at the start of `buf` (which must
    /// hold at least [`HEADER_LEN`] bytes). The CRC is not checked here.
    pub fn parse(buf: &[u8]) -> Result<Self, CodecError> {
        if buf.len() < HEADER_LEN {
            return Err(corrupt(format!("batch header needs {HEADER_LEN} bytes, {} present", buf.len())));
        }
        let h = BatchHeader {
            base_offset: be_i64(buf, 0),
            batch_length: be_i32(buf, 8),
            partition_leader_epoch: be_i32(buf, 12),
            magic: buf[MAGIC_OFFSET] as i8,
            crc: u32::from_be_bytes(buf[CRC_OFFSET..CRC_OFFSET + 4].try_into().unwrap()),
            attributes: be_i16(buf, 21),
            last_offset_delta: be_i32(buf, 23),
            base_timestamp: be_i64(buf, 27),
            max_timestamp: be_i64(buf, 35),
            producer_id: be_i64(buf, 43),
            producer_epoch: be_i16(buf, 51),
            base_sequence: be_i32(buf, 53),
            records_count: be_i32(buf, 57),
        };
        if h.magic != MAGIC_V2 {
            return Err(corrupt(format!(
                "magic {} (only RecordBatch v2, magic 2, is supported; older message sets are not)",
                h.magic
            )));
        }
        if (h.batch_length as i64) < (HEADER_LEN - LOG_OVERHEAD) as i64 {
            return Err(corrupt(format!("batch length {} is shorter than a batch header", h.batch_length)));
        }
        if h.base_offset < 0 {
            return Err(corrupt(format!("negative base offset {}", h.base_offset)));
        }
        if h.last_offset_delta < 0 || h.records_count < 0 {
            return Err(corrupt(format!(
                "negative last offset delta {} or record count {}",
                h.last_offset_delta, h.records_count
            )));
        }
        // The offset after the batch must exist (offsets are below i64::MAX).
        if h.base_offset > i64::MAX - 1 - h.last_offset_delta as i64 {
            return Err(corrupt(format!(
                "base offset {} plus last offset delta {} is past the largest offset",
                h.base_offset, h.last_offset_delta
            )));
        }
        Ok(h)
    }

    /// Bytes the whole batch occupies in the log.
    #[inline]
    pub fn total_len(&self) -> usize {
        self.batch_length as usize + LOG_OVERHEAD
    }
    /// Offset of the batch's last record.
    #[inline]
    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }
    /// Offset following the batch.
    #[inline]
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
    /// The raw codec id (attributes bits 0-2).
    #[inline]
    pub fn compression_id(&self) -> u8 {
        (self.attributes & COMPRESSION_MASK) as u8
    }
    /// Whether its records section is compressed (else it is the batch's body).
    #[inline]
    pub fn is_compressed(&self) -> bool {
        self.compression_id() != 0
    }
    #[inline]
    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_MASK != 0
    }
    #[inline]
    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_MASK != 0
    }
    #[inline]
    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_MASK != 0
    }
}

/// CRC-32C of a whole batch's covered bytes (attributes to the end).
#[inline]
pub fn batch_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[CRC_START..])
}

/// Check the CRC of `batch` (exactly one whole batch) against its header.
pub fn verify_crc(header: &BatchHeader, batch: &[u8]) -> Result<(), CodecError> {
    let actual = batch_crc(batch);
    if actual != header.crc {
        return Err(corrupt(format!("CRC mismatch: stored {:08x}, computed {actual:08x}", header.crc)));
    }
    Ok(())
}

/// One record, borrowed from the batch (or its decompressed records).
#[derive(Debug, Clone, Copy)]
pub struct RecordRef<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub attributes: i8,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    header_count: i32,
    headers_raw: &'a [u8],
}

impl<'a> RecordRef<'a> {
    /// Number of headers.
    pub fn header_count(&self) -> usize {
        self.header_count as usize
    }
    /// The record headers as `(key, value)`; already validated when the record was read.
    pub fn headers(&self) -> HeaderIter<'a> {
        self.raw_headers().iter()
    }
    /// The record headers as they sit in the record (validated).
    pub fn raw_headers(&self) -> RawHeaders<'a> {
        RawHeaders { count: self.header_count, raw: self.headers_raw }
    }
}

/// A record's headers in the record wire format, validated: `count` headers,
/// each `varint(key length) key varint(value length, -1 for null) value`, in
/// `raw` (the header count itself is not part of `raw`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RawHeaders<'a> {
    count: i32,
    raw: &'a [u8],
}

impl<'a> RawHeaders<'a> {
    /// No headers.
    pub const NONE: RawHeaders<'static> = RawHeaders { count: 0, raw: &[] };

    /// Headers `raw` in the wire format, built by [`RawHeaders::encode`] or
    /// read and validated by the codec; `count` of them.
    pub fn new(count: i32, raw: &'a [u8]) -> Self {
        Self { count: count.max(0), raw }
    }

    pub fn count(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The headers in the wire format, without their count.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    /// The headers as `(key, value)`.
    pub fn iter(&self) -> HeaderIter<'a> {
        HeaderIter { buf: self.raw, pos: 0, left: self.count }
    }

    /// Append `headers` to `out` in the wire format (without their count);
    /// how many there were.
    pub fn encode<'h>(headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>, out: &mut Vec<u8>) -> i32 {
        let mut n = 0;
        for (k, v) in headers {
            write_varint(out, k.len() as i32);
            out.extend_from_slice(k);
            match v {
                Some(v) => {
                    write_varint(out, v.len() as i32);
                    out.extend_from_slice(v);
                }
                None => write_varint(out, -1),
            }
            n += 1;
        }
        n
    }
}

/// Iterator over a record's headers.
pub struct HeaderIter<'a> {
    buf: &'a [u8],
    pos: usize,
    left: i32,
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left <= 0 {
            return None;
        }
        self.left -= 1;
        // Validated by `Records::next`, so these cannot fail.
        let k = read_bytes(self.buf, &mut self.pos, "header key").ok()?;
        let v = read_bytes(self.buf, &mut self.pos, "header value").ok()?;
        Some((k.unwrap_or(&[]), v))
    }
}

#[inline]
fn read_bytes<'a>(buf: &'a [u8], pos: &mut usize, what: &str) -> Result<Option<&'a [u8]>, CodecError> {
    let len = read_varint(buf, pos).map_err(|e| varint_err(what, e))?;
    if len < 0 {
        if len != -1 {
            return Err(corrupt(format!("record {what}: negative length {len}")));
        }
        return Ok(None);
    }
    let start = *pos;
    let end = start + len as usize;
    if end > buf.len() {
        return Err(corrupt(format!(
            "record {what}: length {len} runs past the end of the record ({} bytes left)",
            buf.len() - start
        )));
    }
    *pos = end;
    Ok(Some(&buf[start..end]))
}

/// Iterator over the records of one batch.
pub struct Records<'a> {
    data: &'a [u8],
    pos: usize,
    left: i32,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    last_offset_delta: i32,
    /// Offset delta of the previous record (-1 before the first).
    prev_delta: i32,
}

impl<'a> Records<'a> {
    /// Records in `data` (uncompressed records section) of the batch `header`.
    pub fn new(header: &BatchHeader, data: &'a [u8]) -> Self {
        Records {
            data,
            pos: 0,
            left: header.records_count,
            base_offset: header.base_offset,
            base_timestamp: header.base_timestamp,
            log_append_time: header.is_log_append_time().then_some(header.max_timestamp),
            last_offset_delta: header.last_offset_delta,
            prev_delta: -1,
        }
    }

    /// Records still to come (as the header says).
    pub fn remaining(&self) -> usize {
        self.left.max(0) as usize
    }

    /// Bytes of the records section not yet consumed.
    pub fn trailing_bytes(&self) -> usize {
        self.data.len() - self.pos
    }

    /// Append the records left with offsets in `[from, end)` to `out`,
    /// decoded in one loop, then trimmed (offsets ascend in a batch: the
    /// decoder checks it). On a damaged record the records in range before it
    /// stay in `out` and its error returns -- unless it lies past `end`: a
    /// read that stops before a record does not report it.
    pub fn decode_range_into(&mut self, out: &mut Vec<RecordRef<'a>>, from: i64, end: i64) -> Result<(), CodecError> {
        let at = out.len();
        out.reserve(self.remaining());
        let mut decoded = Ok(());
        while self.left > 0 {
            self.left -= 1;
            match self.read_one() {
                Ok(r) => out.push(r),
                Err(e) => {
                    self.left = 0;
                    decoded = Err(e);
                }
            }
        }
        let lo = at + out[at..].partition_point(|r| r.offset < from);
        let hi = at + out[at..].partition_point(|r| r.offset < end);
        let reached_end = hi < out.len();
        out.truncate(hi);
        out.drain(at..lo);
        if reached_end {
            return Ok(());
        }
        decoded
    }

    fn read_one(&mut self) -> Result<RecordRef<'a>, CodecError> {
        let len = read_varint(self.data, &mut self.pos).map_err(|e| varint_err("length", e))?;
        if len < 0 || self.pos + len as usize > self.data.len() {
            return Err(corrupt(format!(
                "record length {len} runs past the end of the records ({} bytes left)",
                self.data.len() - self.pos
            )));
        }
        let rec = &self.data[self.pos..self.pos + len as usize];
        self.pos += len as usize;
        let mut p = 0usize;
        let Some(&attributes) = rec.first() else { return Err(corrupt("empty record")) };
        p += 1;
        let ts_delta = read_varlong(rec, &mut p).map_err(|e| varint_err("timestamp delta", e))?;
        let off_delta = read_varint(rec, &mut p).map_err(|e| varint_err("offset delta", e))?;
        // Offsets increase inside the batch and stay within it: a record
        // elsewhere would collide with another batch's offsets.
        if off_delta <= self.prev_delta || off_delta > self.last_offset_delta {
            return Err(corrupt(format!(
                "record offset delta {off_delta} is not after the previous one ({}) and within the batch's last \
                 offset delta {}",
                self.prev_delta, self.last_offset_delta
            )));
        }
        self.prev_delta = off_delta;
        let key = read_bytes(rec, &mut p, "key")?;
        let value = read_bytes(rec, &mut p, "value")?;
        let header_count = read_varint(rec, &mut p).map_err(|e| varint_err("header count", e))?;
        if header_count < 0 {
            return Err(corrupt(format!("record header count {header_count} is negative")));
        }
        let headers_start = p;
        for _ in 0..header_count {
            let k = read_bytes(rec, &mut p, "header key")?;
            if k.is_none() {
                return Err(corrupt("record header key is null"));
            }
            read_bytes(rec, &mut p, "header value")?;
        }
        if p != rec.len() {
            return Err(corrupt(format!("record has {} bytes after its last field", rec.len() - p)));
        }
        Ok(RecordRef {
            offset: self.base_offset + off_delta as i64,
            timestamp: self.log_append_time.unwrap_or(self.base_timestamp.wrapping_add(ts_delta)),
            attributes: attributes as i8,
            key,
            value,
            header_count,
            headers_raw: &rec[headers_start..],
        })
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<RecordRef<'a>, CodecError>;
    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.left <= 0 {
            return None;
        }
        self.left -= 1;
        let r = self.read_one();
        if r.is_err() {
            self.left = 0;
        }
        Some(r)
    }
}

/// The records of `batch` (one whole batch with a parsed `header`). A
/// compressed batch is decompressed into `scratch` (whose capacity is reused
/// across calls), an uncompressed one is borrowed in place.
pub fn batch_records<'a>(
    header: &BatchHeader,
    batch: &'a [u8],
    scratch: &'a mut Vec<u8>,
) -> Result<Records<'a>, CodecError> {
    let body = &batch[HEADER_LEN..];
    let id = header.compression_id();
    let data: &'a [u8] = match Compression::from_id(id) {
        Some(Compression::None) => body,
        Some(codec) => {
            scratch.clear();
            decompress(codec, body, scratch)
                .map_err(|e| corrupt(format!("{} records do not decompress: {e}", codec.name())))?;
            scratch.as_slice()
        }
        None => return Err(CodecError::UnsupportedCompression(codec_name(id))),
    };
    Ok(Records::new(header, data))
}

/// The marker type of a control batch (its single record's key);
/// [`ControlType::Empty`] for one that holds no record.
pub fn control_type(header: &BatchHeader, batch: &[u8]) -> Result<ControlType, CodecError> {
    if header.records_count == 0 {
        return Ok(ControlType::Empty);
    }
    let mut scratch = Vec::new();
    let mut recs = batch_records(header, batch, &mut scratch)?;
    let rec = recs.next().ok_or_else(|| corrupt("control batch holds no record"))??;
    let key = rec.key.ok_or_else(|| corrupt("control record has a null key"))?;
    if key.len() < 4 {
        return Err(corrupt(format!("control record key is {} bytes, needs 4", key.len())));
    }
    Ok(match be_i16(key, 2) {
        0 => ControlType::Abort,
        1 => ControlType::Commit,
        t => ControlType::Other(t),
    })
}

/// Producer fields and flags of a batch being built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub transactional: bool,
    pub control: bool,
    pub partition_leader_epoch: i32,
}

impl Default for BatchMeta {
    fn default() -> Self {
        BatchMeta {
            producer_id: NO_PRODUCER_ID,
            producer_epoch: -1,
            base_sequence: -1,
            transactional: false,
            control: false,
            partition_leader_epoch: -1,
        }
    }
}

/// Builds one batch by appending records; [`BatchBuilder::finish_into`]
/// writes the header, optional compression and the CRC.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    meta: BatchMeta,
    base_offset: i64,
    records: Vec<u8>,
    count: i32,
    first_timestamp: i64,
    max_timestamp: i64,
    last_offset_delta: i32,
}

impl BatchBuilder {
    /// A batch whose first record will have `base_offset`.
    pub fn new(base_offset: i64, meta: BatchMeta) -> Self {
        BatchBuilder {
            meta,
            base_offset,
            records: Vec::new(),
            count: 0,
            first_timestamp: 0,
            max_timestamp: -1,
            last_offset_delta: 0,
        }
    }

    pub fn meta(&self) -> &BatchMeta {
        &self.meta
    }
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    /// Records appended so far.
    pub fn count(&self) -> usize {
        self.count as usize
    }
    /// Bytes the batch would take uncompressed.
    pub fn size(&self) -> usize {
        HEADER_LEN + self.records.len()
    }

    /// Append a record at `offset` (>= the base offset, increasing).
    pub fn append(
        &mut self,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) {
        if self.count == 0 {
            self.first_timestamp = timestamp;
        }
        self.max_timestamp = self.max_timestamp.max(timestamp);
        let delta = (offset - self.base_offset) as i32;
        self.last_offset_delta = delta;
        self.count += 1;
        let ts_delta = timestamp - self.first_timestamp;
        let field = |b: Option<&[u8]>| b.map_or(1, |b| varlong_len(b.len() as i64) + b.len());
        let mut body = 1 + varlong_len(ts_delta) + varlong_len(delta as i64) + field(key) + field(value);
        body += varlong_len(headers.len() as i64);
        for (k, v) in headers {
            body += field(Some(k)) + field(*v);
        }
        // Length first, then the fields straight into the batch buffer.
        let out = &mut self.records;
        out.reserve(body + 5);
        write_varint(out, body as i32);
        out.push(0u8);
        write_varlong(out, ts_delta);
        write_varint(out, delta);
        let put = |out: &mut Vec<u8>, b: Option<&[u8]>| match b {
            Some(b) => {
                write_varint(out, b.len() as i32);
                out.extend_from_slice(b);
            }
            None => write_varint(out, -1),
        };
        put(out, key);
        put(out, value);
        write_varint(out, headers.len() as i32);
        RawHeaders::encode(headers.iter().copied(), out);
    }

    /// Append the finished batch to `out`, compressing the records with
    /// `codec` (kept uncompressed when compression does not make them smaller).
    pub fn finish_into(&self, codec: Compression, out: &mut Vec<u8>) {
        let compressed;
        let (codec, body): (Compression, &[u8]) = if codec == Compression::None {
            (Compression::None, &self.records)
        } else {
            compressed = compress(codec, &self.records);
            if compressed.len() < self.records.len() {
                (codec, &compressed)
            } else {
                (Compression::None, &self.records)
            }
        };
        let start = out.len();
        let mut attributes = codec as i16;
        if self.meta.transactional {
            attributes |= TRANSACTIONAL_MASK;
        }
        if self.meta.control {
            attributes |= CONTROL_MASK;
        }
        let batch_length = (HEADER_LEN - LOG_OVERHEAD + body.len()) as i32;
        let max_ts = if self.count == 0 { -1 } else { self.max_timestamp };
        out.extend_from_slice(&self.base_offset.to_be_bytes());
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&self.meta.partition_leader_epoch.to_be_bytes());
        out.push(MAGIC_V2 as u8);
        out.extend_from_slice(&0u32.to_be_bytes());
        out.extend_from_slice(&attributes.to_be_bytes());
        out.extend_from_slice(&self.last_offset_delta.to_be_bytes());
        out.extend_from_slice(&(if self.count == 0 { -1 } else { self.first_timestamp }).to_be_bytes());
        out.extend_from_slice(&max_ts.to_be_bytes());
        out.extend_from_slice(&self.meta.producer_id.to_be_bytes());
        out.extend_from_slice(&self.meta.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.meta.base_sequence.to_be_bytes());
        out.extend_from_slice(&self.count.to_be_bytes());
        out.extend_from_slice(body);
        let crc = batch_crc(&out[start..]);
        out[start + CRC_OFFSET..start + CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    }

    /// The finished batch as a new vector.
    pub fn finish(&self, codec: Compression) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size());
        self.finish_into(codec, &mut out);
        out
    }
}

/// A control batch (one record) ending a transaction of `producer_id` with
/// `commit` (COMMIT) or not (ABORT). The value is Kafka's EndTransactionMarker
/// (version 0, coordinator epoch).
pub fn control_batch(
    base_offset: i64,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    timestamp: i64,
    coordinator_epoch: i32,
) -> Vec<u8> {
    let meta = BatchMeta {
        producer_id,
        producer_epoch,
        base_sequence: -1,
        transactional: true,
        control: true,
        partition_leader_epoch: -1,
    };
    let mut b = BatchBuilder::new(base_offset, meta);
    let key = [0u8, 0, 0, commit as u8];
    let mut value = [0u8; 6];
    value[2..].copy_from_slice(&coordinator_epoch.to_be_bytes());
    b.append(base_offset, timestamp, Some(&key), Some(&value), &[]);
    b.finish(Compression::None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(codec: Compression) -> Vec<u8> {
        let meta = BatchMeta {
            producer_id: 7,
            producer_epoch: 3,
            base_sequence: 0,
            transactional: true,
            ..Default::default()
        };
        let mut b = BatchBuilder::new(100, meta);
        b.append(100, 1_000, Some(b"k1"), Some(b"v1"), &[]);
        b.append(101, 1_005, None, Some(b"v2"), &[(b"h", Some(b"x")), (b"n", None)]);
        b.append(102, 999, Some(b"k3"), None, &[]);
        b.finish(codec)
    }

    #[test]
    fn round_trip_all_fields() {
        for codec in [Compression::None, Compression::Gzip, Compression::Snappy, Compression::Lz4, Compression::Zstd] {
            let batch = sample(codec);
            let h = BatchHeader::parse(&batch).unwrap();
            assert_eq!(h.total_len(), batch.len());
            assert_eq!((h.base_offset, h.last_offset(), h.records_count), (100, 102, 3));
            assert_eq!((h.producer_id, h.producer_epoch, h.is_transactional(), h.is_control()), (7, 3, true, false));
            assert_eq!((h.base_timestamp, h.max_timestamp), (1_000, 1_005));
            verify_crc(&h, &batch).unwrap();
            let mut scratch = Vec::new();
            let recs: Vec<_> = batch_records(&h, &batch, &mut scratch).unwrap().collect::<Result<_, _>>().unwrap();
            assert_eq!(recs.len(), 3);
            assert_eq!(
                (recs[0].offset, recs[0].key, recs[0].value, recs[0].timestamp),
                (100, Some(&b"k1"[..]), Some(&b"v1"[..]), 1000)
            );
            assert_eq!((recs[1].key, recs[1].timestamp), (None, 1005));
            let hs: Vec<_> = recs[1].headers().collect();
            assert_eq!(hs, vec![(&b"h"[..], Some(&b"x"[..])), (&b"n"[..], None)]);
            // raw: key length 1 (02), "h", value length 1 (02), "x"; 02 "n" and -1 (01) for null
            assert_eq!(recs[1].raw_headers(), RawHeaders::new(2, &[2, b'h', 2, b'x', 2, b'n', 1]));
            assert_eq!(recs[0].raw_headers(), RawHeaders::NONE);
            assert_eq!((recs[2].value, recs[2].timestamp), (None, 999));
        }
    }

    #[test]
    fn control_batches() {
        for (commit, want) in [(true, ControlType::Commit), (false, ControlType::Abort)] {
            let b = control_batch(5, 9, 1, commit, 42, 0);
            let h = BatchHeader::parse(&b).unwrap();
            verify_crc(&h, &b).unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(control_type(&h, &b).unwrap(), want);
        }
        // An empty control batch, as the log cleaner leaves one: no marker, no error.
        let meta =
            BatchMeta { producer_id: 9, producer_epoch: 1, transactional: true, control: true, ..Default::default() };
        let b = BatchBuilder::new(7, meta).finish(Compression::None);
        let h = BatchHeader::parse(&b).unwrap();
        assert!(h.is_control() && h.records_count == 0 && h.next_offset() == 8);
        assert_eq!(control_type(&h, &b).unwrap(), ControlType::Empty);
    }

    #[test]
    fn flipped_byte_fails_crc() {
        let mut b = sample(Compression::None);
        let n = b.len();
        b[n - 3] ^= 0x40;
        let h = BatchHeader::parse(&b).unwrap();
        assert!(matches!(verify_crc(&h, &b), Err(CodecError::Corrupt(m)) if m.contains("CRC")));
    }

    #[test]
    fn lying_lengths_are_errors_not_allocations() {
        // A record claiming a 2 GB key in a tiny batch.
        let mut b = BatchBuilder::new(0, BatchMeta::default());
        b.append(0, 0, Some(b"k"), Some(b"v"), &[]);
        let mut batch = b.finish(Compression::None);
        // record: len, attrs, ts, off, keylen(=1 -> zigzag 2) ...
        let keylen_at = HEADER_LEN + 4;
        assert_eq!(batch[keylen_at], 2);
        batch[keylen_at] = 0xfe; // continuation: varint now spans into the key bytes
        let h = BatchHeader::parse(&batch).unwrap();
        let mut scratch = Vec::new();
        let r: Vec<_> = batch_records(&h, &batch, &mut scratch).unwrap().collect();
        assert!(r[0].is_err());
        // A record count of 2^31-1 over 1 record: the second read fails cleanly.
        let mut batch = b.finish(Compression::None);
        batch[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let h = BatchHeader::parse(&batch).unwrap();
        let mut it = batch_records(&h, &batch, &mut scratch).unwrap();
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());
    }

    #[test]
    fn record_offsets_outside_the_batch_or_going_back_are_corrupt() {
        // Found by the `batch` fuzz target: a record whose offset delta is
        // beyond lastOffsetDelta was handed out with an offset of the next batch.
        for (deltas, last) in [(&[0i64, 5][..], 3i32), (&[1, 1][..], 1), (&[2, 1][..], 2)] {
            let mut b = BatchBuilder::new(10, BatchMeta::default());
            for &d in deltas {
                b.append(10 + d, 0, Some(b"k"), Some(b"v"), &[]);
            }
            let mut batch = b.finish(Compression::None);
            batch[23..27].copy_from_slice(&last.to_be_bytes());
            let h = BatchHeader::parse(&batch).unwrap();
            let mut scratch = Vec::new();
            let r: Vec<_> = batch_records(&h, &batch, &mut scratch).unwrap().collect();
            assert!(r[0].is_ok(), "{deltas:?}");
            assert!(
                matches!(&r[1], Err(CodecError::Corrupt(m)) if m.contains("offset delta")),
                "{deltas:?}: {:?}",
                r[1]
            );
        }
    }

    #[test]
    fn bad_headers() {
        let mut b = sample(Compression::None);
        b[MAGIC_OFFSET] = 1;
        assert!(BatchHeader::parse(&b).is_err());
        let mut b = sample(Compression::None);
        b[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(BatchHeader::parse(&b).is_err());
        assert!(BatchHeader::parse(&b[..30]).is_err());
        // next_offset() would overflow (a fuzzed base offset near i64::MAX).
        let mut b = sample(Compression::None);
        b[0..8].copy_from_slice(&(i64::MAX - 2).to_be_bytes());
        assert!(matches!(BatchHeader::parse(&b), Err(CodecError::Corrupt(m)) if m.contains("largest offset")));
        b[0..8].copy_from_slice(&(i64::MAX - 3).to_be_bytes());
        assert_eq!(BatchHeader::parse(&b).unwrap().next_offset(), i64::MAX);
        let mut b = sample(Compression::None);
        b[22] |= 0x07; // codec 7
        let h = BatchHeader::parse(&b).unwrap();
        let mut s = Vec::new();
        assert!(matches!(batch_records(&h, &b, &mut s), Err(CodecError::UnsupportedCompression(_))));
    }
}
