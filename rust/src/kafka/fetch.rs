//! Fetch responses turned into committed records.
//!
//! [`Batches`] walks the records of one fetch response (a zero-copy slice of
//! the response buffer) batch by batch and decides each batch's fate the way
//! Kafka's read_committed consumer does: the response lists the transactions
//! that were aborted in the fetched range as `(producer id, first offset)`;
//! before each batch, every listed transaction whose first offset is at or
//! below the batch's last offset makes its producer "aborted"; a
//! transactional data batch of an aborted producer is skipped; an ABORT
//! marker of that producer ends it. The broker lists a transaction in every
//! response that overlaps it, so one whose records span several responses is
//! dropped in each. A batch cut off at the end of the response (the broker
//! fills responses up to a byte limit) is not used; the next fetch starts at
//! its offset. Each batch's CRC-32C is checked before anything is used.
//!
//! [`FetchCursor`] fetches (pipelined: the next request goes out before the
//! current response is decoded), retries leader changes and broken
//! connections until the stall timeout, and feeds records below `end` to a
//! sink; [`KafkaSource`] is it as the engine's [`ChangelogSource`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::client::{KafkaClient, FIRST_BACKOFF, MAX_BACKOFF};
use super::conn::Conn;
use super::KafkaError;
use crate::codec::{self, BatchHeader, CodecError, ControlType, RecordRef, HEADER_LEN};
use crate::source::{ChangeRecord, ChangelogSource, LogError, SkipCounts};

/// Highest Fetch version used: v12 is the last that names topics (v13+ use topic ids).
pub const FETCH_VERSION: i16 = 12;

/// What became of one batch of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// Committed data: its records are used.
    Data,
    /// A data batch of an aborted transaction.
    Aborted,
    /// A control batch (transaction marker).
    Control,
}

/// One complete, CRC-checked batch of a response.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    pub header: BatchHeader,
    pub bytes: &'a [u8],
    pub fate: Fate,
}

/// The batches of one fetch response, in order, with their fate.
pub struct Batches<'a> {
    records: &'a [u8],
    at: usize,
    /// `(first offset, producer id)` sorted by first offset.
    aborted: Vec<(i64, i64)>,
    next_aborted: usize,
    aborted_pids: HashSet<i64>,
}

impl<'a> Batches<'a> {
    /// The batches of `records`, with the response's aborted transactions as
    /// `(producer id, first offset)`.
    pub fn new(records: &'a [u8], aborted: impl IntoIterator<Item = (i64, i64)>) -> Self {
        let mut aborted: Vec<(i64, i64)> = aborted.into_iter().map(|(pid, first)| (first, pid)).collect();
        aborted.sort_unstable();
        Batches { records, at: 0, aborted, next_aborted: 0, aborted_pids: HashSet::new() }
    }

    /// Byte position of the next batch in the records.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The next complete batch, `None` at the end of the records or at a
    /// batch cut off by the end of the response. A batch that is not valid
    /// (bad header, bad CRC, an unreadable marker) is an error with its base
    /// offset, the batch is not used.
    pub fn next_batch(&mut self) -> Option<Result<Batch<'a>, (i64, CodecError)>> {
        let rest = &self.records[self.at..];
        let (base, len) = codec::peek_offset_and_length(rest)?;
        let total = 12usize.saturating_add(usize::try_from(len).unwrap_or(0));
        if len < 0 || total < HEADER_LEN {
            return Some(Err((base, CodecError::Corrupt(format!("batch length {len} is impossible")))));
        }
        if rest.len() < total {
            return None; // cut off: fetched again from its offset
        }
        let bytes = &rest[..total];
        let header = match BatchHeader::parse(bytes) {
            Ok(h) => h,
            Err(e) => return Some(Err((base, e))),
        };
        if let Err(e) = codec::verify_crc(&header, bytes) {
            return Some(Err((base, e)));
        }
        while let Some(&(first, pid)) = self.aborted.get(self.next_aborted) {
            if first > header.last_offset() {
                break;
            }
            self.aborted_pids.insert(pid);
            self.next_aborted += 1;
        }
        let fate = if header.is_control() {
            match codec::control_type(&header, bytes) {
                Ok(ControlType::Abort) => {
                    self.aborted_pids.remove(&header.producer_id);
                }
                Ok(_) => {}
                Err(e) => return Some(Err((base, e))),
            }
            Fate::Control
        } else if header.is_transactional() && self.aborted_pids.contains(&header.producer_id) {
            Fate::Aborted
        } else {
            Fate::Data
        };
        self.at += total;
        Some(Ok(Batch { header, bytes, fate }))
    }

    /// The next offset after the last complete batch of `records`, if any
    /// (headers only, no CRC check: where to fetch next while these are decoded).
    pub fn next_offset_after(records: &[u8]) -> Option<i64> {
        let mut at = 0usize;
        let mut next = None;
        while let Some((_, len)) = codec::peek_offset_and_length(&records[at..]) {
            let total = 12usize.saturating_add(usize::try_from(len).ok()?);
            if total < HEADER_LEN || records.len() - at < total {
                break;
            }
            let h = BatchHeader::parse(&records[at..at + total]).ok()?;
            next = Some(h.next_offset());
            at += total;
        }
        next
    }
}

/// A fetch response's data for one partition.
struct Response {
    records: Bytes,
    aborted: Vec<(i64, i64)>,
    /// The offset it was fetched at.
    offset: i64,
    /// The broker it came from.
    broker: String,
}

/// A request on the wire whose response has not been read.
struct InFlight {
    corr: i32,
    version: i16,
    offset: i64,
}

/// Reads one partition from its leader, read_committed, from a position.
pub struct FetchCursor {
    client: Arc<KafkaClient>,
    topic: String,
    partition: i32,
    position: i64,
    conn: Option<Conn>,
    inflight: Option<InFlight>,
    skipped: SkipCounts,
    bytes_read: u64,
    scratch: Vec<u8>,
    partition_max_bytes: i32,
    stall_timeout: Duration,
}

impl FetchCursor {
    pub fn new(client: Arc<KafkaClient>, topic: &str, partition: i32, start: i64) -> Self {
        let partition_max_bytes = client.config.partition_max_bytes;
        let stall_timeout = client.config.stall_timeout;
        FetchCursor {
            client,
            topic: topic.to_string(),
            partition,
            position: start,
            conn: None,
            inflight: None,
            skipped: SkipCounts::default(),
            bytes_read: 0,
            scratch: Vec::new(),
            partition_max_bytes,
            stall_timeout,
        }
    }

    pub fn position(&self) -> i64 {
        self.position
    }
    pub fn skipped(&self) -> SkipCounts {
        self.skipped
    }
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read
    }

    fn tp(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    fn request(&self, offset: i64) -> FetchRequest {
        let wait = self.client.config.fetch_max_wait.as_millis().min(i32::MAX as u128) as i32;
        FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(wait)
            .with_min_bytes(1)
            .with_max_bytes(self.partition_max_bytes)
            .with_isolation_level(1)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(self.topic.clone())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(self.partition)
                    .with_current_leader_epoch(-1)
                    .with_fetch_offset(offset)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(self.partition_max_bytes)])])
    }

    /// Send a fetch at `offset` on the current connection (connecting to the leader first).
    fn send(&mut self, offset: i64) -> Result<(), KafkaError> {
        if self.conn.is_none() {
            let leader = self.client.leader(&self.topic, self.partition)?;
            self.conn = Some(self.client.checkout(&leader)?);
        }
        let req = self.request(offset);
        let conn = self.conn.as_mut().expect("connected above");
        let version = conn.version::<FetchRequest>(FETCH_VERSION)?;
        let corr = conn.send(&req, version)?;
        self.inflight = Some(InFlight { corr, version, offset });
        Ok(())
    }

    /// Read the response of the request in flight.
    fn recv(&mut self) -> Result<Response, KafkaError> {
        let f = self.inflight.take().expect("a request is in flight");
        let tp = self.tp();
        let conn = self.conn.as_mut().expect("a request in flight has a connection");
        conn.set_read_timeout(conn.request_timeout() + self.client.config.fetch_max_wait);
        let resp = conn.recv::<FetchRequest>(f.corr, f.version)?;
        let broker = conn.broker.clone();
        if resp.error_code != 0 {
            return Err(conn.broker_error(&format!("Fetch of {tp}"), resp.error_code, None));
        }
        let p = resp
            .responses
            .iter()
            .filter(|t| t.topic.0.as_str() == self.topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == self.partition)
            .ok_or_else(|| KafkaError::Protocol(format!("broker {broker}: a Fetch response without {tp}")))?;
        match p.error_code {
            0 => {}
            1 => {
                return Err(KafkaError::OutOfRange(format!(
                    "broker {broker}: offset {} of {} is out of range (the log holds {}..{}): the topic was \
                     truncated, deleted or recreated behind the store; wipe the store and restore it",
                    f.offset, tp, p.log_start_offset, p.high_watermark
                )))
            }
            code => return Err(conn.broker_error(&format!("Fetch of {tp} at offset {}", f.offset), code, None)),
        }
        let aborted =
            p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset)).collect::<Vec<_>>();
        Ok(Response { records: p.records.clone().unwrap_or_default(), aborted, offset: f.offset, broker })
    }

    /// The next response at the current position, retrying retriable
    /// failures until `deadline`.
    fn fetch(&mut self, deadline: Instant) -> Result<Response, KafkaError> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let r = (|| {
                match &self.inflight {
                    Some(f) if f.offset == self.position => {}
                    Some(_) => {
                        self.recv()?; // a request for another offset: read it and drop it
                        self.send(self.position)?;
                    }
                    None => self.send(self.position)?,
                }
                self.recv()
            })();
            match r {
                Ok(resp) => return Ok(resp),
                Err(e) if e.retriable() && Instant::now() + backoff < deadline => {
                    // Another broker may lead now, or this one restarted: ask again.
                    self.conn = None;
                    self.inflight = None;
                    self.client.invalidate(&self.topic, self.partition);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    self.conn = None;
                    self.inflight = None;
                    return Err(e);
                }
            }
        }
    }

    fn context(&self) -> String {
        format!("reading {} on {} at offset {}", self.tp(), self.client.servers(), self.position)
    }

    /// Feed the committed records with offsets in `[position, end)` to `sink`
    /// until about `max_bytes` of batches were used. Returns true while
    /// `position < end` (more to read), false once `end` is reached.
    pub fn read(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&RecordRef<'_>),
    ) -> Result<bool, KafkaError> {
        let mut used = 0usize;
        let mut deadline = Instant::now() + self.stall_timeout;
        while self.position < end {
            if used >= max_bytes.max(1) {
                return Ok(true);
            }
            let resp = self.fetch(deadline).map_err(|e| e.context(&self.context()))?;
            // Ask for what follows while this is decoded.
            if let Some(next) = Batches::next_offset_after(&resp.records) {
                if next > self.position && next < end && self.inflight.is_none() {
                    let _ = self.send(next); // a failure shows on the next fetch
                }
            }
            let before = self.position;
            let mut batches = Batches::new(&resp.records, resp.aborted.iter().copied());
            let mut first = true;
            loop {
                let b = match batches.next_batch() {
                    None => break,
                    Some(Err((base, e))) => {
                        return Err(match e {
                            CodecError::UnsupportedCompression(c) => KafkaError::UnsupportedCompression(format!(
                                "broker {}: {}: the batch at offset {base} uses compression {c}, which this build \
                                 cannot decode",
                                resp.broker,
                                self.context()
                            )),
                            e => KafkaError::Corrupt(format!(
                                "broker {}: {}: the fetched batch at offset {base} is damaged: {e}",
                                resp.broker,
                                self.context()
                            )),
                        })
                    }
                    Some(Ok(b)) => b,
                };
                first = false;
                let h = b.header;
                if h.next_offset() <= self.position {
                    continue; // before the position (the broker sends whole batches)
                }
                if h.base_offset >= end {
                    self.position = end; // everything below `end` was consumed
                    break;
                }
                let upto = h.next_offset().min(end);
                let from = self.position.max(h.base_offset);
                match b.fate {
                    Fate::Control => self.skipped.control += (upto - from) as u64,
                    Fate::Aborted => {
                        self.skipped.aborted += if from == h.base_offset && upto == h.next_offset() {
                            h.records_count as u64
                        } else {
                            (upto - from) as u64
                        }
                    }
                    Fate::Data => {
                        let context = self.context();
                        let broker = &resp.broker;
                        let bad = |e: CodecError| match e {
                            CodecError::UnsupportedCompression(c) => KafkaError::UnsupportedCompression(format!(
                                "broker {broker}: {context}: the batch at offset {} uses compression {c}, which this \
                                 build cannot decode",
                                h.base_offset
                            )),
                            e => KafkaError::Corrupt(format!(
                                "broker {broker}: {context}: the fetched batch at offset {} does not decode: {e}",
                                h.base_offset
                            )),
                        };
                        let records = codec::batch_records(&h, b.bytes, &mut self.scratch).map_err(bad)?;
                        let pos = self.position;
                        for r in records {
                            let r = r.map_err(bad)?;
                            if r.offset < pos {
                                continue;
                            }
                            if r.offset >= end {
                                break;
                            }
                            sink(&r);
                        }
                    }
                }
                self.position = upto;
                used += b.bytes.len();
                self.bytes_read += b.bytes.len() as u64;
                if self.position >= end {
                    break;
                }
            }
            if first && !resp.records.is_empty() && batches.position() == 0 {
                // The first batch did not fit the response: ask for more bytes.
                let need = codec::peek_offset_and_length(&resp.records).map_or(0, |(_, l)| l.max(0) as i64 + 12);
                let grown =
                    (self.partition_max_bytes as i64 * 2).max(need).min(super::conn::MAX_RESPONSE_BYTES as i64 / 2);
                if grown as i32 <= self.partition_max_bytes {
                    return Err(KafkaError::Protocol(format!(
                        "broker {}: {}: a batch of {need} bytes does not fit a response",
                        resp.broker,
                        self.context()
                    )));
                }
                self.partition_max_bytes = grown as i32;
            }
            if self.position > before {
                deadline = Instant::now() + self.stall_timeout;
            } else if Instant::now() >= deadline {
                return Err(KafkaError::Timeout(format!(
                    "broker {}: {}: no progress for {:.1} s (reading up to offset {end}); the fetch at offset {} \
                     brought nothing usable",
                    resp.broker,
                    self.context(),
                    self.stall_timeout.as_secs_f64(),
                    resp.offset
                )));
            }
        }
        Ok(false)
    }

    /// The connection, if it can be reused (no request in flight).
    fn release(&mut self) {
        if let Some(c) = self.conn.take() {
            if self.inflight.is_none() {
                self.client.checkin(c);
            }
        }
        self.inflight = None;
    }
}

impl Drop for FetchCursor {
    fn drop(&mut self) {
        self.release();
    }
}

/// A [`FetchCursor`] as the restore engine's [`ChangelogSource`].
pub struct KafkaSource {
    cursor: FetchCursor,
}

impl KafkaSource {
    pub fn new(client: Arc<KafkaClient>, topic: &str, partition: i32, start: i64) -> Self {
        KafkaSource { cursor: FetchCursor::new(client, topic, partition, start) }
    }

    pub fn cursor(&mut self) -> &mut FetchCursor {
        &mut self.cursor
    }
}

impl ChangelogSource for KafkaSource {
    fn position(&self) -> i64 {
        self.cursor.position()
    }

    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        Ok(self.cursor.read(end, max_bytes, &mut |r| {
            sink(ChangeRecord { offset: r.offset, timestamp: r.timestamp, key: r.key, value: r.value })
        })?)
    }

    fn skipped(&self) -> SkipCounts {
        self.cursor.skipped()
    }

    fn bytes_read(&self) -> u64 {
        self.cursor.bytes_read()
    }
}
