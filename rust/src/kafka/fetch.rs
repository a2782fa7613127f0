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
//! A [`FetchCursor`] feeds the records below `end` to a sink. Its network
//! side, the [`Fetcher`], fetches in order (pipelined: the next request goes
//! out before the current response is checked and decoded), checks each
//! response's batches, and retries leader changes and broken connections
//! until the stall timeout. It runs on the cursor's thread or, for the
//! restore engine's [`KafkaSource`], on a fetch thread of its own, so the
//! kernel's copy out of the socket, the CRC-32C checks and the waits for the
//! broker overlap the restore's decoding and writing. In a fetch session
//! ([`super::session`]) a broker's thread drives the fetchers of all the
//! partitions it leads through the same steps ([`Fetcher::fetch_partition`],
//! [`Fetcher::take_partition`], [`Fetcher::step`]), one Fetch for them all.

use std::collections::HashSet;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{BrokerId, FetchRequest, FetchResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::client::{KafkaClient, FIRST_BACKOFF, MAX_BACKOFF};
use super::conn::{self, Conn};
use super::frames::FrameLease;
use super::session::{FetchSession, Member};
use super::KafkaError;
use crate::codec::{self, BatchHeader, CodecError, ControlType, RecordRef, HEADER_LEN};
use crate::source::{recycle, ChangeRecord, ChangeSlices, ChangelogSource, LogError, SkipCounts};

/// Most records in one slice handed over ([`FetchCursor::read_slices`]):
/// the slice and the keys it points to stay in the core's cache while the
/// consumer goes over them again (the bulk collector hashes the keys first,
/// then adds them). With slices of a whole response (~8,000 records) a bulk
/// restore of 2M records took 0.41 s, with 256 records 0.33 s.
const SLICE_RECORDS: usize = 256;

/// Highest Fetch version used for a topic whose id is not known (a broker
/// older than Kafka 2.8 names none): v12, the last that names topics.
pub const FETCH_VERSION: i16 = 12;

/// Highest Fetch version used for a topic whose id Metadata named: v13+
/// (Kafka 3.1+) fetch by topic id, so a topic deleted and recreated under the
/// same name is `UNKNOWN_TOPIC_ID` instead of the new topic's records. v15
/// is the last whose response has no field beyond v12's but the topic id
/// (v16 adds the leaders' endpoints).
pub const FETCH_VERSION_TOPIC_IDS: i16 = 15;

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

    /// What the batch headers of `records` say about fetching on (headers
    /// only, no CRC check: where to fetch next while these are decoded).
    pub fn plan(records: &[u8]) -> Plan {
        let mut at = 0usize;
        let mut next = None;
        let ended = |next: Option<i64>| next.map_or(Plan::Unreadable, Plan::Next);
        while let Some((_, len)) = codec::peek_offset_and_length(&records[at..]) {
            let Some(total) = usize::try_from(len).ok().map(|l| l.saturating_add(12)).filter(|t| *t >= HEADER_LEN)
            else {
                return ended(next);
            };
            if records.len() - at < total {
                return next.map_or(Plan::CutOff { need: total }, Plan::Next);
            }
            match BatchHeader::parse(&records[at..at + total]) {
                Ok(h) => next = Some(h.next_offset()),
                Err(_) => return ended(next),
            }
            at += total;
        }
        match next {
            Some(n) => Plan::Next(n),
            None if records.is_empty() => Plan::Empty,
            None => Plan::CutOff { need: 0 }, // not even a batch's offset and length
        }
    }
}

/// Where a response leaves the fetching, by its batch headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// No records: nothing new at the offset yet.
    Empty,
    /// The first batch does not fit the response: it needs `need` bytes
    /// (0: unknown).
    CutOff { need: usize },
    /// Fetching goes on at this offset, after the last complete batch.
    Next(i64),
    /// The first batch's header cannot be read: the records say where it is
    /// damaged, not where to go on.
    Unreadable,
}

/// What a [`Fetcher`] makes of a response at its offset ([`Fetcher::step`]).
pub(super) enum Step {
    /// Hand it out; the fetching goes on at the fetcher's offset.
    Deliver,
    /// Hand out nothing and fetch the same offset again, after this pause.
    Again(Duration),
    /// Give up on the read.
    Fail(KafkaError),
}

/// A fetch response's data for one partition.
pub(super) struct Response {
    records: Bytes,
    aborted: Vec<(i64, i64)>,
    /// The offset it was fetched at.
    pub(super) offset: i64,
    /// The broker it came from.
    broker: String,
    /// The topic id it was fetched under (None: unknown, a broker older than Kafka 2.8).
    topic_id: Option<Uuid>,
    /// Its complete batches, CRC-checked, in order.
    checked: Vec<Checked>,
    /// The batch that stopped the check, if one was damaged: its base offset and why.
    damage: Option<(i64, CodecError)>,
}

/// A batch of a response that passed its checks: where it is, its header, its fate.
struct Checked {
    at: usize,
    len: usize,
    header: BatchHeader,
    fate: Fate,
}

impl Response {
    fn new(records: Bytes, aborted: Vec<(i64, i64)>, offset: i64, broker: String, topic_id: Option<Uuid>) -> Self {
        Response { records, aborted, offset, broker, topic_id, checked: Vec::new(), damage: None }
    }

    /// Check the batches (CRC, header, markers) and decide their fates, so
    /// the cursor's thread only decodes. Checking stops at a damaged batch;
    /// the batches before it stay usable.
    pub(super) fn check(&mut self) {
        let mut batches = Batches::new(&self.records, self.aborted.iter().copied());
        loop {
            let at = batches.position();
            match batches.next_batch() {
                None => break,
                Some(Ok(b)) => self.checked.push(Checked { at, len: b.bytes.len(), header: b.header, fate: b.fate }),
                Some(Err(e)) => {
                    self.damage = Some(e);
                    break;
                }
            }
        }
    }
}

/// A Fetch request's entry for `topic`: by its id when given (v13+), else by name.
pub(super) fn fetch_topic(topic: &str, topic_id: Option<Uuid>) -> FetchTopic {
    match topic_id {
        Some(id) => FetchTopic::default().with_topic_id(id),
        None => FetchTopic::default().with_topic(TopicName(StrBytes::from_string(topic.to_string()))),
    }
}

/// A read_committed Fetch request of `topics`, outside any fetch session
/// (each request names all it fetches), for at most `max_bytes` in all.
pub(super) fn fetch_request(client: &KafkaClient, topics: Vec<FetchTopic>, max_bytes: i32) -> FetchRequest {
    let wait = client.config.fetch_max_wait.as_millis().min(i32::MAX as u128) as i32;
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(1)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(topics)
}

/// The part of `resp` for `topic-partition` (its topic named by `topic_id`
/// when the request fetched by id).
pub(super) fn find_partition<'r>(
    resp: &'r FetchResponse,
    topic: &str,
    topic_id: Option<Uuid>,
    partition: i32,
) -> Option<&'r PartitionData> {
    resp.responses
        .iter()
        .filter(|t| match topic_id {
            Some(id) => t.topic_id == id,
            None => t.topic.0.as_str() == topic,
        })
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == partition)
}

/// A request on the wire whose response has not been read.
struct InFlight {
    corr: i32,
    version: i16,
    offset: i64,
    sent: Instant,
    /// The topic id it fetched by (v13+), else None (by name).
    topic_id: Option<Uuid>,
}

/// The network side of a cursor: hands out the responses of one partition in
/// order from an offset, with the next request on the wire while the last
/// response is decoded. It grows the response size for a batch that does not
/// fit, retries leader changes and broken connections, and gives up after
/// the stall timeout without progress.
pub(super) struct Fetcher {
    client: Arc<KafkaClient>,
    pub(super) topic: String,
    pub(super) partition: i32,
    /// Offset of the next response to hand out.
    pub(super) offset: i64,
    /// No request is sent ahead for this offset or later.
    pub(super) end: i64,
    conn: Option<Conn>,
    inflight: Option<InFlight>,
    /// Bytes asked for per response: [`FIRST_FETCH_BYTES`] at first, so that
    /// a read's first records arrive soon, then twice the last up to
    /// `max.partition.fetch.bytes`; more for a batch that does not fit.
    pub(super) fetch_bytes: i32,
    partition_max_bytes: i32,
    stall_timeout: Duration,
    /// Leader epoch of the connected leader, sent with each fetch (-1: unknown).
    pub(super) leader_epoch: i32,
    /// The last error came with the new leader (KIP-951): go there without
    /// a metadata refresh.
    pub(super) hinted: bool,
    /// How long the broker took to answer the last request.
    pub(super) answered_in: Duration,
    /// Responses in a row that held only batches below the offset (in a
    /// fetch session; a fetcher of its own counts them in [`Fetcher::next`]).
    pub(super) stuck: u32,
    /// The topic id the reads are held to: the one the client last read the
    /// partition under (a read going on from a store's offset), else the
    /// first one this fetcher fetched under. A different one in Metadata is
    /// a recreated topic: [`KafkaError::OutOfRange`], never a silent read
    /// of the new topic.
    topic_id: Option<Uuid>,
    /// The read starts at the log start (a store restored from scratch):
    /// until it handed something out it takes the topic as it is now.
    from_scratch: bool,
    /// Where the reads began.
    start: i64,
    /// Keeps the client's response buffers pooled while this fetcher lives.
    _frames: FrameLease,
}

/// Responses in a row that leave the fetch offset where it was although
/// they hold batches (all of them below it): the broker does not answer the
/// fetch it was sent, and the restore ends after this many.
pub const MAX_STUCK_RESPONSES: u32 = 8;

/// Bytes asked for by a fetcher's first request. A restore can start on a
/// response only when the whole of it has arrived and been checked: a first
/// response of the full `max.partition.fetch.bytes` (8 MiB) kept each
/// partition's restore waiting about 5 ms before its first record.
const FIRST_FETCH_BYTES: i32 = 1 << 20;

impl Fetcher {
    /// A fetcher of `topic-partition` from `offset`; `held`: the topic id
    /// the records before `offset` were read under (the store's), which a
    /// read going on from there must find ([`KafkaClient::expected_topic_id`]).
    pub(super) fn new(client: Arc<KafkaClient>, topic: &str, partition: i32, offset: i64, held: Option<Uuid>) -> Self {
        let (partition_max_bytes, stall_timeout) = (client.config.partition_max_bytes, client.config.stall_timeout);
        let frames = client.frames.activate();
        let topic_id = client.expected_topic_id(topic, partition, offset, held);
        Fetcher {
            topic_id,
            from_scratch: topic_id.is_none(),
            start: offset,
            client,
            topic: topic.to_string(),
            partition,
            offset,
            end: offset,
            conn: None,
            inflight: None,
            fetch_bytes: FIRST_FETCH_BYTES.min(partition_max_bytes),
            partition_max_bytes,
            stall_timeout,
            leader_epoch: -1,
            hinted: false,
            answered_in: Duration::ZERO,
            stuck: 0,
            _frames: frames,
        }
    }

    pub(super) fn tp(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    pub(super) fn context(&self) -> String {
        format!("reading {} on {} at offset {}", self.tp(), self.client.servers(), self.offset)
    }

    fn request(&self, offset: i64, leader_epoch: i32, topic_id: Option<Uuid>) -> FetchRequest {
        let topic =
            fetch_topic(&self.topic, topic_id).with_partitions(vec![self.fetch_partition(offset, leader_epoch)]);
        fetch_request(&self.client, vec![topic], self.fetch_bytes)
    }

    /// This partition's entry of a Fetch request at `offset`.
    pub(super) fn fetch_partition(&self, offset: i64, leader_epoch: i32) -> FetchPartition {
        FetchPartition::default()
            .with_partition(self.partition)
            .with_current_leader_epoch(leader_epoch)
            .with_fetch_offset(offset)
            .with_last_fetched_epoch(-1)
            .with_log_start_offset(-1)
            .with_partition_max_bytes(self.fetch_bytes)
    }

    /// The topic id to fetch by, checked against the one the reads are held
    /// to: a topic whose id changed was deleted and recreated.
    pub(super) fn check_topic_id(&mut self) -> Result<Option<Uuid>, KafkaError> {
        let Some(now) = self.client.topic_id(&self.topic) else { return Ok(self.topic_id) };
        match self.topic_id {
            Some(was) if was != now => {
                if self.from_scratch && self.offset <= self.start {
                    self.topic_id = Some(now); // nothing read yet: the topic as it is now
                } else {
                    return Err(KafkaError::OutOfRange(format!(
                        "topic {} was deleted and recreated (its id is {now} now, {was} when {} was read before): \
                         the store holds records of the old topic; wipe it and restore it",
                        self.topic,
                        self.tp()
                    )));
                }
            }
            Some(_) => {}
            None => self.topic_id = Some(now),
        }
        self.client.read_under(&self.topic, self.partition, now);
        Ok(Some(now))
    }

    /// Send a fetch at `offset` on the current connection (connecting to the leader first).
    fn send(&mut self, offset: i64) -> Result<(), KafkaError> {
        if self.conn.is_none() {
            let leader = self.client.leader(&self.topic, self.partition)?;
            self.conn = Some(self.client.checkout(&leader.broker)?);
            self.leader_epoch = leader.epoch;
        }
        let topic_id = self.check_topic_id()?;
        let conn = self.conn.as_mut().expect("connected above");
        let version = match topic_id {
            Some(_) => conn.version::<FetchRequest>(FETCH_VERSION_TOPIC_IDS)?,
            None => conn.version::<FetchRequest>(FETCH_VERSION)?,
        };
        let by_id = topic_id.filter(|_| version >= 13);
        let req = self.request(offset, self.leader_epoch, by_id);
        let conn = self.conn.as_mut().expect("connected above");
        let corr = conn.send(&req, version)?;
        self.inflight = Some(InFlight { corr, version, offset, sent: Instant::now(), topic_id: by_id });
        Ok(())
    }

    /// Read the response of the request in flight. A throttled response
    /// (`throttle_time_ms` and no data for the partition, as a broker over a
    /// quota answers) is an empty one; the next request waits the throttle.
    fn recv(&mut self) -> Result<Response, KafkaError> {
        let f = self.inflight.take().expect("a request is in flight");
        let tp = self.tp();
        let conn = self.conn.as_mut().expect("a request in flight has a connection");
        conn.set_read_timeout(conn.request_timeout() + self.client.config.fetch_max_wait);
        let resp = conn.recv::<FetchRequest>(f.corr, f.version)?;
        self.answered_in = f.sent.elapsed();
        conn.throttle(resp.throttle_time_ms);
        let broker = conn.broker.clone();
        if resp.error_code != 0 {
            return Err(conn.broker_error(&format!("Fetch of {tp} at offset {}", f.offset), resp.error_code, None));
        }
        let Some(p) = find_partition(&resp, &self.topic, f.topic_id, self.partition) else {
            if resp.throttle_time_ms > 0 {
                return Ok(Response::new(Bytes::new(), Vec::new(), f.offset, broker, None));
            }
            return Err(KafkaError::Protocol(format!(
                "broker {broker}: a Fetch response without {tp} (fetched at offset {})",
                f.offset
            )));
        };
        self.take_partition(p, f.offset, &broker)
    }

    /// This partition's part of a Fetch response from `broker` to a fetch
    /// at `offset`: its records, or the error it answered (a new leader the
    /// broker named is taken, see `hinted`).
    pub(super) fn take_partition(
        &mut self,
        p: &PartitionData,
        offset: i64,
        broker: &str,
    ) -> Result<Response, KafkaError> {
        let tp = self.tp();
        match p.error_code {
            0 => {}
            1 => {
                return Err(KafkaError::OutOfRange(format!(
                    "broker {broker}: offset {offset} of {tp} is out of range (the log holds {}..{}): the topic was \
                     truncated, deleted or recreated behind the store; wipe the store and restore it",
                    p.log_start_offset, p.high_watermark
                )))
            }
            code => {
                // KIP-951: the broker may name the new leader (Apache Kafka
                // does from Fetch v16 on; at v12 the field exists, unused).
                let hint = &p.current_leader;
                if matches!(code, 6 | 74) {
                    self.hinted =
                        self.client.hint_leader(&self.topic, self.partition, hint.leader_id.0, hint.leader_epoch);
                }
                return Err(conn::broker_error(broker, &format!("Fetch of {tp} at offset {offset}"), code, None));
            }
        }
        let aborted =
            p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset)).collect::<Vec<_>>();
        Ok(Response::new(p.records.clone().unwrap_or_default(), aborted, offset, broker.to_string(), self.topic_id))
    }

    /// One response at `self.offset`, retrying retriable failures until `deadline`.
    fn fetch(&mut self, deadline: Instant) -> Result<Response, KafkaError> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let r = (|| {
                match &self.inflight {
                    Some(f) if f.offset == self.offset => {}
                    Some(_) => {
                        self.recv()?; // a request for another offset: read it and drop it
                        self.send(self.offset)?;
                    }
                    None => self.send(self.offset)?,
                }
                self.recv()
            })();
            match r {
                Ok(resp) => return Ok(resp),
                Err(e) if e.retriable() && Instant::now() + backoff < deadline => {
                    // Another broker may lead now, or this one restarted: ask
                    // again, unless the broker named the new leader. One that
                    // did not answer at all is asked for metadata last.
                    if let Some(c) = &self.conn {
                        self.client.failed_at(&c.broker, &e);
                    }
                    self.release_after_error(&e);
                    if std::mem::take(&mut self.hinted) {
                        continue;
                    }
                    self.client.invalidate(&self.topic, self.partition);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    self.hinted = false;
                    self.release_after_error(&e);
                    return Err(e);
                }
            }
        }
    }

    /// The next response with something to decode (at least one complete
    /// batch, or a damaged one), checked, and the offset after it sent for
    /// while it is checked and decoded.
    fn next(&mut self) -> Result<Response, KafkaError> {
        let deadline = Instant::now() + self.stall_timeout;
        let mut stuck = 0u32;
        loop {
            let mut resp = self.fetch(deadline).map_err(|e| e.context(&self.context()))?;
            let throttled = self.conn.as_ref().is_some_and(|c| !c.throttled_for().is_zero());
            match self.step(&resp, &mut stuck, throttled) {
                Step::Deliver => {
                    // The next offset is sent for ahead unless the broker asked
                    // for a pause: then it waits on the next fetch, and this
                    // response goes first.
                    if self.offset > resp.offset && self.offset < self.end && self.inflight.is_none() && !throttled {
                        let _ = self.send(self.offset); // a failure shows on the next fetch
                    }
                    resp.check();
                    return Ok(resp);
                }
                Step::Again(wait) => {
                    if !wait.is_zero() {
                        std::thread::sleep(wait.min(super::conn::left(deadline)));
                    }
                }
                Step::Fail(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(self.stalled(&resp));
            }
        }
    }

    /// What a response at the fetcher's offset means for the fetching, by
    /// its batch headers: hand it out (the offset moved past its last
    /// complete batch, or its first batch is damaged and the cursor says
    /// so), or fetch the same offset again -- with more bytes for a batch
    /// that did not fit, or after a pause when the broker had nothing and
    /// answered at once (unless it asked for a throttle, which the next
    /// request waits out anyway) -- or give up on a broker that keeps
    /// answering batches below the offset. `stuck` counts those answers in
    /// a row; `throttled`: the connection waits out a throttle.
    pub(super) fn step(&mut self, resp: &Response, stuck: &mut u32, throttled: bool) -> Step {
        match Batches::plan(&resp.records) {
            Plan::Next(next) if next > self.offset => {
                self.offset = next;
                self.fetch_bytes =
                    self.fetch_bytes.max(self.partition_max_bytes.min(self.fetch_bytes.saturating_mul(2)));
                *stuck = 0;
                Step::Deliver
            }
            Plan::Next(next) => {
                // Only batches below the offset asked for: the broker did
                // not answer this fetch. Asked again a few times, then an
                // error (handing them over would fetch here forever).
                *stuck += 1;
                if *stuck >= MAX_STUCK_RESPONSES {
                    return Step::Fail(KafkaError::Protocol(format!(
                        "broker {}: {}: {stuck} Fetch responses at offset {} held only batches ending at or before \
                         offset {next}: the broker does not move the fetch forward",
                        resp.broker,
                        self.context(),
                        resp.offset
                    )));
                }
                Step::Again(FIRST_BACKOFF)
            }
            Plan::Unreadable => Step::Deliver,
            Plan::CutOff { need } => {
                // The first batch did not fit the response: ask for more bytes.
                let grown =
                    (self.fetch_bytes as i64 * 2).max(need as i64).min(super::conn::MAX_RESPONSE_BYTES as i64 / 2);
                if grown as i32 <= self.fetch_bytes {
                    return Step::Fail(KafkaError::Protocol(format!(
                        "broker {}: {}: a batch of {need} bytes does not fit a response",
                        resp.broker,
                        self.context()
                    )));
                }
                self.fetch_bytes = grown as i32;
                self.partition_max_bytes = self.partition_max_bytes.max(self.fetch_bytes);
                Step::Again(Duration::ZERO)
            }
            Plan::Empty => {
                // A broker holds a fetch up to `fetch.max.wait` for data;
                // one that answers nothing at once is not asked again at once.
                let max_wait = self.client.config.fetch_max_wait;
                if !throttled && self.answered_in < max_wait / 2 {
                    Step::Again(max_wait - self.answered_in)
                } else {
                    Step::Again(Duration::ZERO)
                }
            }
        }
    }

    /// The error of a read that made no progress for the stall timeout, the
    /// last response being `resp`.
    pub(super) fn stalled(&self, resp: &Response) -> KafkaError {
        KafkaError::Timeout(format!(
            "broker {}: {}: no progress for {:.1} s (reading up to offset {}); the fetch at offset {} brought \
             nothing usable",
            resp.broker,
            self.context(),
            self.stall_timeout.as_secs_f64(),
            self.end,
            resp.offset
        ))
    }

    /// Drop the connection after a failed fetch (it may be out of step),
    /// unless the broker answered in step with an error code: then it is
    /// given back for reuse.
    fn release_after_error(&mut self, e: &KafkaError) {
        let in_step = matches!(e, KafkaError::Broker { .. } | KafkaError::OutOfRange(_)) && self.inflight.is_none();
        match self.conn.take() {
            Some(c) if in_step => self.client.checkin(c),
            _ => {}
        }
        self.inflight = None;
    }

    /// Fetch on from `offset` (requests go out ahead below `end` only).
    pub(super) fn seek(&mut self, offset: i64, end: i64) {
        self.offset = offset;
        self.end = end;
    }

    /// Give the connection back to the client if it can be reused (no
    /// request in flight).
    fn release(&mut self) {
        if let Some(c) = self.conn.take() {
            if self.inflight.is_none() {
                self.client.checkin(c);
            }
        }
        self.inflight = None;
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        self.release();
    }
}

/// Responses fetched ahead that wait to be decoded (besides the one being
/// decoded and the one on the wire).
const RESPONSES_AHEAD: usize = 1;

/// Responses a cursor reading ahead holds at most: those waiting, the one
/// being decoded (or left partly read) and the one being received.
pub(super) const RESPONSES_HELD: usize = RESPONSES_AHEAD + 2;

/// A [`Fetcher`] on a thread of its own, receiving (the kernel's copy out
/// of the socket) and deciding where to fetch next while the cursor's thread
/// decodes: a Kafka client's network thread, in the way librdkafka's broker
/// threads work beside the application's.
struct Ahead {
    responses: Receiver<Result<Response, KafkaError>>,
    thread: JoinHandle<Box<Fetcher>>,
    end: i64,
}

impl Ahead {
    fn start(mut fetcher: Box<Fetcher>, offset: i64, end: i64) -> Self {
        fetcher.seek(offset, end);
        let (tx, responses) = sync_channel(RESPONSES_AHEAD);
        let thread = std::thread::Builder::new()
            .name(format!("fetch {}", fetcher.tp()))
            .spawn(move || {
                while fetcher.offset < fetcher.end {
                    let r = fetcher.next();
                    let failed = r.is_err();
                    // The cursor may be gone (dropped, or fetching elsewhere).
                    if tx.send(r).is_err() || failed {
                        break;
                    }
                }
                fetcher
            })
            .expect("spawning a fetch thread");
        Ahead { responses, thread, end }
    }

    /// Stop fetching; the fetcher, for its connection and response size.
    fn stop(self) -> Box<Fetcher> {
        drop(self.responses); // a thread waiting to hand over a response stops
        match self.thread.join() {
            Ok(f) => f,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// Where a cursor's responses come from.
enum Responses {
    /// Fetched on the cursor's own thread.
    Here(Box<Fetcher>),
    /// Fetched ahead on a fetch thread.
    Ahead(Ahead),
    /// Fetched by the broker threads of a fetch session shared with other reads.
    Session(Member),
    /// Between the two (only while switching).
    Switching,
}

/// Reads one partition from its leader, read_committed, from a position.
pub struct FetchCursor {
    client: Arc<KafkaClient>,
    topic: String,
    partition: i32,
    responses: Responses,
    read_ahead: bool,
    position: i64,
    skipped: SkipCounts,
    bytes_read: u64,
    /// Decompressed records of the last compressed batch.
    scratch: Vec<u8>,
    /// A response a read stopped in, at its byte budget: the next read goes
    /// on with its batches from the position before fetching another.
    pending: Option<Response>,
    /// The buffers of the last slices handed over (kept for their allocation).
    slice_spare: Vec<RecordRef<'static>>,
    batch_spare: Vec<RecordRef<'static>>,
    /// The topic id of the last response read (None: none read with one).
    topic_id: Option<Uuid>,
}

impl FetchCursor {
    /// A cursor that fetches on the caller's thread.
    pub fn new(client: Arc<KafkaClient>, topic: &str, partition: i32, start: i64) -> Self {
        Self::with_read_ahead(client, topic, partition, start, false, None)
    }

    /// A cursor that, with `read_ahead`, fetches on a thread of its own
    /// while the caller decodes (started on the first read, for the range
    /// that read asks for; another range restarts it).
    pub fn with_read_ahead(
        client: Arc<KafkaClient>,
        topic: &str,
        partition: i32,
        start: i64,
        read_ahead: bool,
        held: Option<Uuid>,
    ) -> Self {
        FetchCursor {
            responses: Responses::Here(Box::new(Fetcher::new(client.clone(), topic, partition, start, held))),
            client,
            topic: topic.to_string(),
            partition,
            read_ahead,
            position: start,
            skipped: SkipCounts::default(),
            bytes_read: 0,
            scratch: Vec::new(),
            pending: None,
            slice_spare: Vec::new(),
            batch_spare: Vec::new(),
            topic_id: None,
        }
    }

    /// A cursor whose responses the broker threads of `session` fetch,
    /// in Fetch requests shared with the session's other partitions.
    pub fn in_session(
        session: &Arc<FetchSession>,
        topic: &str,
        partition: i32,
        start: i64,
        held: Option<Uuid>,
    ) -> Self {
        FetchCursor {
            responses: Responses::Session(session.member(topic, partition, start, held)),
            client: session.client().clone(),
            topic: topic.to_string(),
            partition,
            read_ahead: true,
            position: start,
            skipped: SkipCounts::default(),
            bytes_read: 0,
            scratch: Vec::new(),
            pending: None,
            slice_spare: Vec::new(),
            batch_spare: Vec::new(),
            topic_id: None,
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
    /// The topic id the records read so far were read under (None: none
    /// read, or a broker that names no topic ids).
    pub fn topic_id(&self) -> Option<Uuid> {
        self.topic_id
    }

    /// The fetcher back on this thread (a fetch thread is stopped).
    fn here(&mut self) -> &mut Fetcher {
        if let Responses::Ahead(_) = self.responses {
            let Responses::Ahead(a) = std::mem::replace(&mut self.responses, Responses::Switching) else {
                unreachable!()
            };
            self.responses = Responses::Here(a.stop());
        }
        match &mut self.responses {
            Responses::Here(f) => f,
            _ => unreachable!("the fetcher is here"),
        }
    }

    /// Start the fetch thread on `[position, end)` before the first read,
    /// so that its first response is on the way while the caller does other
    /// things (a restore creating its store). A read below another end
    /// restarts it; a cursor without read-ahead, or already fetching, is
    /// left as it is.
    pub fn prime(&mut self, end: i64) {
        if let Responses::Session(m) = &mut self.responses {
            if self.position < end {
                m.prime(self.position, end);
            }
            return;
        }
        if !self.read_ahead || self.position >= end || !matches!(self.responses, Responses::Here(_)) {
            return;
        }
        let Responses::Here(f) = std::mem::replace(&mut self.responses, Responses::Switching) else { unreachable!() };
        self.responses = Responses::Ahead(Ahead::start(f, self.position, end));
    }

    /// In a fetch session, fetch a little of `[position, end)` from the
    /// job's start, ahead of the restore's turn (its member's `prime_ahead`);
    /// elsewhere nothing.
    pub fn prime_ahead(&mut self, end: i64) {
        if let Responses::Session(m) = &mut self.responses {
            if self.position < end {
                m.prime_ahead(self.position, end);
            }
        }
    }

    /// The response at the position, reading below `end`.
    fn next_response(&mut self, end: i64) -> Result<Response, KafkaError> {
        if let Some(resp) = self.pending.take() {
            return Ok(resp);
        }
        let position = self.position;
        if let Responses::Session(m) = &mut self.responses {
            return m.next(position, end);
        }
        if !self.read_ahead {
            let f = self.here();
            f.seek(position, end);
            return f.next();
        }
        if let Responses::Ahead(a) = &self.responses {
            if a.end == end {
                if let Ok(r) = a.responses.recv() {
                    match r {
                        // A response for another position (the reads changed course) is dropped.
                        Ok(resp) if resp.offset != position => {}
                        r => return r,
                    }
                }
            }
        }
        // No fetch thread yet, or one for another range, or one that ended: (re)start it here.
        self.here();
        let Responses::Here(f) = std::mem::replace(&mut self.responses, Responses::Switching) else { unreachable!() };
        let a = Ahead::start(f, position, end);
        let r = a.responses.recv();
        self.responses = Responses::Ahead(a);
        match r {
            Ok(Ok(resp)) if resp.offset != position => Err(KafkaError::Protocol(format!(
                "fetch thread of {}: a response at offset {} for position {position}",
                self.tp(),
                resp.offset
            ))),
            Ok(r) => r,
            Err(_) => Err(KafkaError::Protocol(format!(
                "fetch thread of {}: ended without a response at offset {position}",
                self.tp()
            ))),
        }
    }

    fn tp(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
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
        self.read_slices(end, max_bytes, &mut |records| records.iter().for_each(&mut *sink))
    }

    /// [`FetchCursor::read`] with the records handed over in slices of up to
    /// [`SLICE_RECORDS`] records, borrowed from the response (a slice of
    /// uncompressed batches may span several) or from the decompressed
    /// records of one compressed batch (in a buffer the next one reuses).
    /// Records before an error are handed over before it returns.
    pub fn read_slices(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&[RecordRef<'_>]),
    ) -> Result<bool, KafkaError> {
        let mut used = 0usize;
        let (mut spare, mut batch_spare) =
            (std::mem::take(&mut self.slice_spare), std::mem::take(&mut self.batch_spare));
        let mut result = Ok(false);
        while self.position < end {
            if used >= max_bytes.max(1) {
                result = Ok(true);
                break;
            }
            let resp = match self.next_response(end) {
                Ok(resp) => resp,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            };
            if resp.topic_id.is_some() {
                self.topic_id = resp.topic_id;
            }
            let mut slice: Vec<RecordRef<'_>> = recycle(std::mem::take(&mut spare));
            let budget = Budget { max: max_bytes.max(1), used: &mut used };
            let outcome = self.take_response(&resp, end, budget, &mut slice, &mut batch_spare, sink);
            if !slice.is_empty() {
                sink(&slice);
            }
            spare = recycle(slice);
            match outcome {
                Err(e) => {
                    result = Err(e);
                    break;
                }
                Ok(Taken::Partly) => {
                    self.pending = Some(resp);
                    result = Ok(true);
                    break;
                }
                Ok(Taken::Whole) => {}
            }
        }
        (self.slice_spare, self.batch_spare) = (spare, batch_spare);
        result
    }

    /// Use the batches of `resp` from the position on, until the read's
    /// `budget` is spent (a read of a few MiB stops within a response of 8, so
    /// a replay's chunk does not overshoot its size by most of a response):
    /// the data records of its uncompressed batches go into `slice` (handed to
    /// `sink` whenever full; the caller hands over the rest), those of a
    /// compressed batch to `sink` after what `slice` holds, so that records
    /// keep their order.
    fn take_response<'r>(
        &mut self,
        resp: &'r Response,
        end: i64,
        budget: Budget<'_>,
        slice: &mut Vec<RecordRef<'r>>,
        batch_spare: &mut Vec<RecordRef<'static>>,
        sink: &mut dyn FnMut(&[RecordRef<'_>]),
    ) -> Result<Taken, KafkaError> {
        let used = budget.used;
        for c in &resp.checked {
            let (h, len) = (c.header, c.len);
            if h.next_offset() <= self.position {
                continue; // before the position (the broker sends whole batches)
            }
            if *used >= budget.max && h.base_offset < end {
                return Ok(Taken::Partly);
            }
            if h.base_offset >= end {
                self.position = end; // everything below `end` was consumed
                break;
            }
            let upto = h.next_offset().min(end);
            let from = self.position.max(h.base_offset);
            match c.fate {
                // Records stepped over, not offsets: a marker is one, an
                // empty control batch the cleaner left none.
                Fate::Control | Fate::Aborted => {
                    let n = if from == h.base_offset && upto == h.next_offset() {
                        h.records_count as u64
                    } else {
                        (upto - from) as u64
                    };
                    match c.fate {
                        Fate::Control => self.skipped.control += n,
                        _ => self.skipped.aborted += n,
                    }
                }
                Fate::Data => {
                    let (broker, context) = (&resp.broker, self.context());
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
                    let bytes = &resp.records[c.at..c.at + c.len];
                    if h.is_compressed() {
                        // Its records live in the scratch buffer until the next
                        // compressed batch: hand over what came before, then them.
                        if !slice.is_empty() {
                            sink(slice);
                            slice.clear();
                        }
                        let mut own: Vec<RecordRef<'_>> = recycle(std::mem::take(batch_spare));
                        let decoded = codec::batch_records(&h, bytes, &mut self.scratch)
                            .and_then(|records| slice_records(records, from, end, &mut own, sink));
                        if !own.is_empty() {
                            sink(&own);
                        }
                        *batch_spare = recycle(own);
                        decoded.map_err(bad)?;
                    } else {
                        let records = codec::Records::new(&h, &bytes[HEADER_LEN..]);
                        slice_records(records, from, end, slice, sink).map_err(bad)?;
                    }
                }
            }
            self.position = upto;
            *used += len;
            self.bytes_read += len as u64;
            if self.position >= end {
                break;
            }
        }
        if let (Some((base, e)), true) = (&resp.damage, self.position < end) {
            return Err(match e {
                CodecError::UnsupportedCompression(c) => KafkaError::UnsupportedCompression(format!(
                    "broker {}: {}: the batch at offset {base} uses compression {c}, which this build cannot \
                     decode",
                    resp.broker,
                    self.context()
                )),
                e => KafkaError::Corrupt(format!(
                    "broker {}: {}: the fetched batch at offset {base} is damaged: {e}",
                    resp.broker,
                    self.context()
                )),
            });
        }
        Ok(Taken::Whole)
    }
}

/// The bytes of batches one read may use, and those it used so far.
struct Budget<'a> {
    max: usize,
    used: &'a mut usize,
}

/// How much of a response a read took.
enum Taken {
    /// All of it from the position (or up to the read's end).
    Whole,
    /// Batches up to the read's budget; the rest waits for the next read.
    Partly,
}

/// Push the records of `records` with offsets in `[from, end)` onto `slice`
/// ([`codec::Records::decode_range_into`]), handing it to `sink` in slices of
/// [`SLICE_RECORDS`] whenever it holds that many (what is left stays in `slice`).
fn slice_records<'a>(
    mut records: codec::Records<'a>,
    from: i64,
    end: i64,
    slice: &mut Vec<RecordRef<'a>>,
    sink: &mut dyn FnMut(&[RecordRef<'_>]),
) -> Result<(), CodecError> {
    let decoded = records.decode_range_into(slice, from, end);
    let full = slice.len() / SLICE_RECORDS * SLICE_RECORDS;
    if full > 0 {
        slice[..full].chunks(SLICE_RECORDS).for_each(&mut *sink);
        slice.drain(..full);
    }
    decoded
}

impl Drop for FetchCursor {
    fn drop(&mut self) {
        // A fetch thread is left to stop by itself: its next hand-over fails
        // and it ends, giving its connection back (joining it here could wait
        // out a slow broker's response). One that reached the end has ended.
        if let Responses::Ahead(a) = std::mem::replace(&mut self.responses, Responses::Switching) {
            drop(a.responses);
        }
    }
}

/// A [`FetchCursor`] as the restore engine's [`ChangelogSource`]: it reads
/// ahead, the restore decoding while the next response arrives.
pub struct KafkaSource {
    cursor: FetchCursor,
    slices: ChangeSlices,
}

impl KafkaSource {
    /// A source of `topic-partition` from `start`, held to topic id `held` (see [`Fetcher::new`]).
    pub fn new(client: Arc<KafkaClient>, topic: &str, partition: i32, start: i64, held: Option<Uuid>) -> Self {
        KafkaSource {
            cursor: FetchCursor::with_read_ahead(client, topic, partition, start, true, held),
            slices: ChangeSlices::default(),
        }
    }

    /// A source fetched by the broker threads of `session`.
    pub fn in_session(
        session: &Arc<FetchSession>,
        topic: &str,
        partition: i32,
        start: i64,
        held: Option<Uuid>,
    ) -> Self {
        KafkaSource {
            cursor: FetchCursor::in_session(session, topic, partition, start, held),
            slices: ChangeSlices::default(),
        }
    }

    pub fn cursor(&mut self) -> &mut FetchCursor {
        &mut self.cursor
    }
}

impl ChangelogSource for KafkaSource {
    fn position(&self) -> i64 {
        self.cursor.position()
    }

    fn topic_id(&self) -> Option<[u8; 16]> {
        self.cursor.topic_id().map(|id| id.into_bytes())
    }

    fn next_chunk(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(ChangeRecord<'_>),
    ) -> Result<bool, LogError> {
        Ok(self.cursor.read(end, max_bytes, &mut |r| sink(r.into()))?)
    }

    fn next_records(
        &mut self,
        end: i64,
        max_bytes: usize,
        sink: &mut dyn FnMut(&[ChangeRecord<'_>]),
    ) -> Result<bool, LogError> {
        let slices = &mut self.slices;
        Ok(self.cursor.read_slices(end, max_bytes, &mut |records| slices.hand_over(records, sink))?)
    }

    fn skipped(&self) -> SkipCounts {
        self.cursor.skipped()
    }

    fn bytes_read(&self) -> u64 {
        self.cursor.bytes_read()
    }

    fn reads_ahead(&self) -> bool {
        true
    }

    fn prime(&mut self, end: i64) {
        self.cursor.prime(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{BatchBuilder, BatchMeta, Compression};

    /// A batch of offsets `base..base + n`; with `damaged`, its last record
    /// says it has -1 headers (and the CRC is not checked here).
    fn batch(base: i64, n: i64, damaged: bool) -> (BatchHeader, Vec<u8>) {
        let mut b = BatchBuilder::new(base, BatchMeta::default());
        for o in base..base + n {
            b.append(o, o, Some(format!("k{o}").as_bytes()), Some(b"v"), &[]);
        }
        let mut bytes = b.finish(Compression::None);
        if damaged {
            *bytes.last_mut().unwrap() = 0x01;
        }
        (BatchHeader::parse(&bytes).unwrap(), bytes)
    }

    fn take(
        b: &(BatchHeader, Vec<u8>),
        from: i64,
        end: i64,
        slice: &mut Vec<RecordRef<'static>>,
    ) -> (Vec<Vec<i64>>, Result<(), CodecError>) {
        let mut handed = Vec::new();
        let mut own: Vec<RecordRef<'_>> = recycle(std::mem::take(slice));
        let r = slice_records(codec::Records::new(&b.0, &b.1[HEADER_LEN..]), from, end, &mut own, &mut |s| {
            handed.push(s.iter().map(|r| r.offset).collect())
        });
        let left = own.iter().map(|r| r.offset).collect::<Vec<_>>();
        handed.push(left);
        (handed, r)
    }

    #[test]
    fn a_batch_s_records_in_range_go_out_in_slices_of_a_fixed_size() {
        let b = batch(100, 600, false);
        let (handed, r) = take(&b, 150, 690, &mut Vec::new());
        r.unwrap();
        let sizes: Vec<usize> = handed.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![SLICE_RECORDS, SLICE_RECORDS, 540 - 2 * SLICE_RECORDS], "the rest stays");
        assert_eq!(handed.concat(), (150..690).collect::<Vec<i64>>());
    }

    #[test]
    fn a_damaged_record_is_reported_only_to_a_read_that_reaches_it() {
        let b = batch(0, 10, true);
        let (handed, r) = take(&b, 0, 5, &mut Vec::new());
        assert!(r.is_ok());
        assert_eq!(handed.concat(), (0..5).collect::<Vec<i64>>());
        let (handed, r) = take(&b, 0, 10, &mut Vec::new());
        assert!(r.is_err());
        assert_eq!(handed.concat(), (0..9).collect::<Vec<i64>>(), "the records before it are kept");
    }
}
