//! The fetcher against a fake in-process broker on 127.0.0.1: a well-behaved
//! one serving a log with aborted transactions in small responses that cut
//! batches and split a transaction, and bad ones (garbage, a connection closed
//! mid-response, a batch with a bad CRC, a fetch that never brings anything,
//! one that answers batches below the offset asked for). A [`Script`] shared
//! by the fake brokers of a cluster adds what a cluster does: throttles,
//! errors of a leader election, leader epochs, a leader moving.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, LeaderIdAndEpoch, PartitionData,
};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    MetadataResponse, ProduceRequest, ProduceResponse, ProducerId, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable, StrBytes};

use super::client::KafkaClient;
use super::config::ClientConfig;
use super::fetch::{Batches, Fate, FetchCursor, Plan};
use super::session::FetchSession;
use super::KafkaError;
use crate::codec::{self, control_batch, BatchBuilder, BatchMeta, Compression};

/// How the fake broker misbehaves on Fetch.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Good,
    Garbage,
    CloseMidResponse,
    BadCrc,
    Silent,
    /// Every Fetch answered with the log's first batch, whatever its offset.
    Stale,
    /// Good, but the connection is closed after each answer (ApiVersions aside).
    CloseAfterAnswer,
}

/// What the fake brokers of one cluster share: who leads, in which epoch,
/// the faults to answer next, and what they were asked.
#[derive(Default)]
struct Script {
    /// Port of each node (node id = index + 1).
    ports: Vec<u16>,
    /// Node id of the leader of t-0 (0: node 1).
    leader: i32,
    /// Its leader epoch.
    epoch: i32,
    /// Error codes to answer next, by API (Metadata: for the whole topic).
    errors: VecDeque<(ApiKey, i16)>,
    /// `throttle_time_ms` to answer next, by API (a throttled Fetch has no partitions).
    throttles: VecDeque<(ApiKey, i32)>,
    /// A node that no longer leads names the leader (KIP-951's `current_leader`).
    hint: bool,
    /// Requests received: (node id, API, when, the leader epoch sent).
    seen: Vec<(i32, ApiKey, Instant, i32)>,
    /// Connections accepted, by node id.
    accepted: Vec<i32>,
    /// Fetches received: (version, the topic id asked for).
    fetches: Vec<(i16, uuid::Uuid)>,
    /// The topic's id (Metadata v10+ names it, Fetch v13+ is offered and
    /// answers `UNKNOWN_TOPIC_ID` to another); nil: a broker without ids.
    topic_id: uuid::Uuid,
    /// Nodes that read requests and answer none (a SIGSTOPped broker: the
    /// kernel still accepts its connections).
    muted: Vec<i32>,
    /// Partitions of t (0: one).
    partitions: i32,
    /// The leader of each partition of t by index, where it is not `leader`.
    leaders: Vec<i32>,
    /// Fetches received: (node, connection, the partitions named).
    fetched: Vec<(i32, usize, Vec<i32>)>,
    /// ListOffsets requests received: (node, the partitions named).
    listed: Vec<(i32, Vec<i32>)>,
    /// How long a Fetch takes to answer (a broker that is the bottleneck).
    fetch_time: Duration,
    /// Error codes partitions of t answer to every Fetch at or past an
    /// offset: (partition, code, offset).
    partition_errors: Vec<(i32, i16, i64)>,
    /// The record batches of the Produce requests taken, in the order taken.
    produced: Vec<Bytes>,
}

type Shared = Arc<Mutex<Script>>;

impl Script {
    fn leader(&self) -> i32 {
        self.leader.max(1)
    }
    fn leader_of(&self, partition: i32) -> i32 {
        self.leaders.get(partition as usize).copied().unwrap_or_else(|| self.leader())
    }
    fn take<T: Copy>(q: &mut VecDeque<(ApiKey, T)>, key: ApiKey) -> Option<T> {
        let i = q.iter().position(|(k, _)| *k == key)?;
        q.remove(i).map(|(_, v)| v)
    }
    fn error(&mut self, key: ApiKey) -> i16 {
        Self::take(&mut self.errors, key).unwrap_or(0)
    }
    fn throttle(&mut self, key: ApiKey) -> i32 {
        Self::take(&mut self.throttles, key).unwrap_or(0)
    }
    /// The requests of `key` seen so far: (node, when, epoch).
    fn asked(&self, key: ApiKey) -> Vec<(i32, Instant, i32)> {
        self.seen.iter().filter(|s| s.1 == key).map(|&(n, _, t, e)| (n, t, e)).collect()
    }
}

/// A log: batches, and the aborted transactions as `(producer id, first offset, marker offset)`.
#[derive(Clone, Default)]
struct Log {
    batches: Vec<(i64, Vec<u8>)>,
    aborted: Vec<(i64, i64, i64)>,
    end: i64,
}

fn data(base: i64, n: i64, pid: Option<i64>) -> Vec<u8> {
    data_with(base, n, pid, Compression::None, 0)
}

/// The value of record `o` padded with `pad` bytes (which compress well).
fn value_of(o: i64, pad: usize) -> String {
    format!("v{o}{}", "x".repeat(pad))
}

fn data_with(base: i64, n: i64, pid: Option<i64>, codec: Compression, pad: usize) -> Vec<u8> {
    let meta = match pid {
        Some(p) => {
            BatchMeta { producer_id: p, producer_epoch: 0, base_sequence: 0, transactional: true, ..Default::default() }
        }
        None => BatchMeta::default(),
    };
    let mut b = BatchBuilder::new(base, meta);
    for o in base..base + n {
        let k = format!("k{o}");
        let v = value_of(o, pad);
        b.append(o, 1000 + o, Some(k.as_bytes()), Some(v.as_bytes()), &[]);
    }
    b.finish(codec)
}

/// 0..10 plain; 10..15 pid 5 (aborted); 15..20 pid 6 (committed); 20..25 pid 5
/// (the same aborted transaction); 25 ABORT pid 5; 26 COMMIT pid 6; 27..37 plain.
fn sample() -> Log {
    let batches = vec![
        (0, data(0, 10, None)),
        (10, data(10, 5, Some(5))),
        (15, data(15, 5, Some(6))),
        (20, data(20, 5, Some(5))),
        (25, control_batch(25, 5, 0, false, 2000, 0)),
        (26, control_batch(26, 6, 0, true, 2000, 0)),
        (27, data(27, 10, None)),
    ];
    Log { batches, aborted: vec![(5, 10, 25)], end: 37 }
}

/// Padding of [`compressed_sample`]'s values.
const PAD: usize = 200;

/// [`sample`]'s offsets and transactions with compressed batches between
/// plain ones: a compressed batch's records are decoded into a buffer that
/// the next compressed batch reuses.
fn compressed_sample() -> Log {
    let d = |base, n, pid, codec| {
        let b = data_with(base, n, pid, codec, PAD);
        if codec != Compression::None {
            assert!(b.len() < data_with(base, n, pid, Compression::None, PAD).len(), "{codec:?} compresses");
        }
        (base, b)
    };
    let batches = vec![
        d(0, 10, None, Compression::None),
        d(10, 5, Some(5), Compression::Lz4),
        d(15, 5, Some(6), Compression::Zstd),
        d(20, 5, Some(5), Compression::None),
        (25, control_batch(25, 5, 0, false, 2000, 0)),
        (26, control_batch(26, 6, 0, true, 2000, 0)),
        d(27, 5, None, Compression::Gzip),
        d(32, 3, None, Compression::Snappy),
        d(35, 2, None, Compression::None),
    ];
    Log { batches, aborted: vec![(5, 10, 25)], end: 37 }
}

fn expected() -> Vec<i64> {
    (0..10).chain(15..20).chain(27..37).collect()
}

fn respond<E: Encodable>(s: &mut TcpStream, key: ApiKey, version: i16, corr: i32, body: &E) {
    let mut out = vec![0u8; 4];
    ResponseHeader::default().with_correlation_id(corr).encode(&mut out, key.response_header_version(version)).unwrap();
    body.encode(&mut out, version).unwrap();
    let n = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&n.to_be_bytes());
    let _ = s.write_all(&out);
}

/// The bytes each Fetch asked for (`partition_max_bytes`), by the port of the fake broker asked.
static ASKED: Mutex<Vec<(u16, i32)>> = Mutex::new(Vec::new());

/// Serve one connection (`conn`: its number among the cluster's) of node
/// `node`; partition p of t holds `logs[p]` (the last one beyond).
fn serve(mut s: TcpStream, node: i32, conn: usize, script: Shared, logs: Vec<Log>, mode: Mode, max_bytes: usize) {
    let log_of = |p: i32| &logs[(p.max(0) as usize).min(logs.len() - 1)];
    let port = script.lock().unwrap().ports[node as usize - 1];
    // A broker mutes a connection it throttled (KIP-219): nothing more is
    // read from it until the throttle has passed.
    let mut muted_until: Option<Instant> = None;
    loop {
        if let Some(t) = muted_until.take() {
            thread::sleep(t.saturating_duration_since(Instant::now()));
        }
        let mut len = [0u8; 4];
        if s.read_exact(&mut len).is_err() {
            return;
        }
        let mut buf = BytesMut::zeroed(u32::from_be_bytes(len) as usize);
        if s.read_exact(&mut buf).is_err() {
            return;
        }
        let mut buf: Bytes = buf.freeze();
        let h = decode_request_header_from_buffer(&mut buf).unwrap();
        let (key, v, corr) = (ApiKey::try_from(h.request_api_key).unwrap(), h.request_api_version, h.correlation_id);
        let mut sc = script.lock().unwrap();
        if sc.muted.contains(&node) {
            continue;
        }
        let (error, throttle) = (sc.error(key), sc.throttle(key));
        if throttle > 0 {
            muted_until = Some(Instant::now() + Duration::from_millis(throttle as u64));
        }
        let (leader, epoch) = (sc.leader(), sc.epoch);
        let leaders: Vec<i32> = (0..sc.partitions.max(1)).map(|p| sc.leader_of(p)).collect();
        let partition_errors = sc.partition_errors.clone();
        let brokers: Vec<MetadataResponseBroker> = sc
            .ports
            .iter()
            .enumerate()
            .map(|(i, p)| {
                MetadataResponseBroker::default()
                    .with_node_id(BrokerId(i as i32 + 1))
                    .with_host(StrBytes::from_static_str("127.0.0.1"))
                    .with_port(*p as i32)
            })
            .collect();
        let hint = sc.hint;
        let topic_id = sc.topic_id;
        let mut seen = |sent_epoch: i32| sc.seen.push((node, key, Instant::now(), sent_epoch));
        match key {
            ApiKey::ApiVersions => {
                let fetch_max = if topic_id.is_nil() { 12 } else { 17 };
                let keys = [(0, 3, 12), (1, 4, fetch_max), (2, 1, 8), (3, 0, 12), (18, 0, 3)]
                    .map(|(k, a, b)| ApiVersion::default().with_api_key(k).with_min_version(a).with_max_version(b));
                respond(&mut s, key, v, corr, &ApiVersionsResponse::default().with_api_keys(keys.to_vec()));
            }
            ApiKey::Metadata => {
                seen(-1);
                drop(sc);
                let r = MetadataResponse::default().with_throttle_time_ms(throttle).with_brokers(brokers).with_topics(
                    vec![MetadataResponseTopic::default()
                        .with_error_code(error)
                        .with_topic_id(if v >= 10 { topic_id } else { uuid::Uuid::nil() })
                        .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
                        .with_partitions(
                            leaders
                                .iter()
                                .enumerate()
                                .map(|(p, l)| {
                                    MetadataResponsePartition::default()
                                        .with_partition_index(p as i32)
                                        .with_leader_id(BrokerId(*l))
                                        .with_leader_epoch(epoch)
                                })
                                .collect(),
                        )],
                );
                respond(&mut s, key, v, corr, &r);
            }
            ApiKey::Produce => {
                // A partition of t, its batch taken unless an error is scripted.
                let req = ProduceRequest::decode(&mut buf, v).unwrap();
                seen(-1);
                let data = &req.topic_data[0].partition_data[0];
                if error == 0 {
                    sc.produced.push(data.records.clone().unwrap_or_default());
                }
                drop(sc);
                let r = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                    .with_name(TopicName(StrBytes::from_static_str("t")))
                    .with_partition_responses(vec![PartitionProduceResponse::default()
                        .with_index(data.index)
                        .with_error_code(error)])]);
                respond(&mut s, key, v, corr, &r);
            }
            ApiKey::ListOffsets => {
                let req = ListOffsetsRequest::decode(&mut buf, v).unwrap();
                seen(req.topics[0].partitions[0].current_leader_epoch);
                let asked: Vec<&_> = req.topics.iter().flat_map(|t| t.partitions.iter()).collect();
                sc.listed.push((node, asked.iter().map(|p| p.partition_index).collect()));
                drop(sc);
                // Every partition asked, the error queued (if any) for each.
                let answers = asked.iter().map(|p| {
                    let off = if p.timestamp == -2 { 0 } else { log_of(p.partition_index).end };
                    ListOffsetsPartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(error)
                        .with_offset(off)
                });
                let r = ListOffsetsResponse::default().with_throttle_time_ms(throttle).with_topics(vec![
                    ListOffsetsTopicResponse::default()
                        .with_name(TopicName(StrBytes::from_static_str("t")))
                        .with_partitions(answers.collect()),
                ]);
                respond(&mut s, key, v, corr, &r);
            }
            ApiKey::Fetch => {
                let req = FetchRequest::decode(&mut buf, v).unwrap();
                seen(req.topics[0].partitions[0].current_leader_epoch);
                sc.fetches.push((v, req.topics[0].topic_id));
                let named = req.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.partition)).collect();
                sc.fetched.push((node, conn, named));
                let fetch_time = sc.fetch_time;
                drop(sc);
                thread::sleep(fetch_time);
                // The topic in a response: by id from v13 on, else by name.
                let topic = || match v {
                    13.. => FetchableTopicResponse::default().with_topic_id(req.topics[0].topic_id),
                    _ => FetchableTopicResponse::default().with_topic(TopicName(StrBytes::from_static_str("t"))),
                };
                let error = if v >= 13 && req.topics[0].topic_id != topic_id { 100 } else { error };
                ASKED.lock().unwrap().push((port, req.topics[0].partitions[0].partition_max_bytes));
                if throttle > 0 {
                    // A broker over a quota: the throttle time and no partitions.
                    respond(&mut s, key, v, corr, &FetchResponse::default().with_throttle_time_ms(throttle));
                    continue;
                }
                // As a broker reads a Fetch (a map by partition): of two entries for one
                // partition the last one's offset counts, answered once, where the first stood.
                let mut asked_for: Vec<(i32, i64)> = Vec::new();
                for asked in &req.topics[0].partitions {
                    match asked_for.iter_mut().find(|(p, _)| *p == asked.partition) {
                        Some(entry) => entry.1 = asked.fetch_offset,
                        None => asked_for.push((asked.partition, asked.fetch_offset)),
                    }
                }
                let mut parts = Vec::new();
                for (partition, at) in asked_for {
                    let (log, lead) = (log_of(partition), leaders.get(partition as usize).copied().unwrap_or(leader));
                    let error = if node != lead { 6 } else { error };
                    let error = partition_errors.iter().find(|e| e.0 == partition && at >= e.2).map_or(error, |e| e.1);
                    if error != 0 {
                        let mut p = PartitionData::default().with_partition_index(partition).with_error_code(error);
                        if hint && error == 6 {
                            p.current_leader =
                                LeaderIdAndEpoch::default().with_leader_id(BrokerId(lead)).with_leader_epoch(epoch);
                        }
                        parts.push(p);
                        continue;
                    }
                    let at = if mode == Mode::Stale { 0 } else { at };
                    let mut records = Vec::new();
                    for (base, b) in &log.batches {
                        let next = log.batches.iter().find(|(o, _)| o > base).map_or(log.end, |(o, _)| *o);
                        if next > at && records.len() < max_bytes {
                            records.extend_from_slice(b);
                        }
                    }
                    // Cut the last batch, as a byte limit does, but always hand out a
                    // whole first batch (KIP-74).
                    let first = codec::peek_offset_and_length(&records).map_or(0, |(_, l)| l as usize + 12);
                    records.truncate(max_bytes.max(first));
                    if mode == Mode::BadCrc {
                        let n = records.len();
                        records[n.min(70) - 1] ^= 0x55;
                    }
                    if mode == Mode::Silent {
                        records.clear();
                    }
                    let aborted = log
                        .aborted
                        .iter()
                        .filter(|(_, _, marker)| *marker >= at)
                        .map(|&(pid, first, _)| {
                            AbortedTransaction::default().with_producer_id(ProducerId(pid)).with_first_offset(first)
                        })
                        .collect();
                    parts.push(
                        PartitionData::default()
                            .with_partition_index(partition)
                            .with_high_watermark(log.end)
                            .with_last_stable_offset(log.end)
                            .with_aborted_transactions(Some(aborted))
                            .with_records(Some(Bytes::from(records))),
                    );
                }
                let r = FetchResponse::default().with_responses(vec![topic().with_partitions(parts)]);
                match mode {
                    Mode::Garbage => {
                        let _ = s.write_all(&[0, 0, 0, 40]);
                        let _ = s.write_all(&[0xAB; 40]);
                    }
                    Mode::CloseMidResponse => {
                        let mut out = Vec::new();
                        r.encode(&mut out, v).unwrap();
                        let _ = s.write_all(&((out.len() + 4) as u32).to_be_bytes());
                        let _ = s.write_all(&out[..out.len() / 2]);
                        return;
                    }
                    _ => respond(&mut s, key, v, corr, &r),
                }
            }
            _ => return,
        }
        if mode == Mode::CloseAfterAnswer && key != ApiKey::ApiVersions {
            return;
        }
    }
}

/// A fake broker; returns its `host:port`.
fn fake(log: Log, mode: Mode, max_bytes: usize) -> String {
    let (addrs, _) = cluster(1, log, mode, max_bytes);
    addrs.into_iter().next().unwrap()
}

/// `nodes` fake brokers sharing a [`Script`]; their `host:port`s.
fn cluster(nodes: usize, log: Log, mode: Mode, max_bytes: usize) -> (Vec<String>, Shared) {
    cluster_of(nodes, vec![log], mode, max_bytes)
}

/// [`cluster`] with partition p of t holding `logs[p]`.
fn cluster_of(nodes: usize, logs: Vec<Log>, mode: Mode, max_bytes: usize) -> (Vec<String>, Shared) {
    let partitions = logs.len() as i32;
    let listeners: Vec<TcpListener> = (0..nodes).map(|_| TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let ports: Vec<u16> = listeners.iter().map(|l| l.local_addr().unwrap().port()).collect();
    let script = Arc::new(Mutex::new(Script { ports: ports.clone(), partitions, ..Script::default() }));
    for (i, l) in listeners.into_iter().enumerate() {
        let (logs, script) = (logs.clone(), script.clone());
        thread::spawn(move || {
            for s in l.incoming() {
                let Ok(s) = s else { return };
                let conn = {
                    let mut sc = script.lock().unwrap();
                    sc.accepted.push(i as i32 + 1);
                    sc.accepted.len()
                };
                let (logs, script) = (logs.clone(), script.clone());
                thread::spawn(move || serve(s, i as i32 + 1, conn, script, logs, mode, max_bytes));
            }
        });
    }
    (ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(), script)
}

fn client(addr: &str, stall: Duration) -> Arc<KafkaClient> {
    let c = ClientConfig::parse([("bootstrap.servers", addr)], Duration::from_secs(2), stall).unwrap();
    KafkaClient::new(c)
}

/// The ways a cursor fetches: on its caller's thread, on a fetch thread of
/// its own, or through a fetch session (a broker's thread shared with the
/// other reads of a job).
#[derive(Clone, Copy, Debug)]
enum Via {
    Here,
    Ahead,
    Session,
}

impl Via {
    const ALL: [Via; 3] = [Via::Here, Via::Ahead, Via::Session];

    /// A cursor on t-0 from `start` that fetches this way.
    fn cursor(self, c: Arc<KafkaClient>, start: i64) -> FetchCursor {
        self.held_cursor(c, start, None)
    }

    /// [`Via::cursor`] of a store whose records were read under topic id `held`.
    fn held_cursor(self, c: Arc<KafkaClient>, start: i64, held: Option<uuid::Uuid>) -> FetchCursor {
        match self {
            Via::Here => FetchCursor::with_read_ahead(c, "t", 0, start, false, held),
            Via::Ahead => FetchCursor::with_read_ahead(c, "t", 0, start, true, held),
            Via::Session => FetchCursor::in_session(&FetchSession::new(c), "t", 0, start, held),
        }
    }
}

fn drain(c: &mut FetchCursor, end: i64) -> Result<Vec<i64>, KafkaError> {
    let mut got = Vec::new();
    while c.read(end, 1 << 20, &mut |r| got.push(r.offset))? {}
    Ok(got)
}

#[test]
fn batches_follow_the_aborted_list_across_responses() {
    let log = sample();
    let all: Vec<u8> = log.batches.iter().flat_map(|(_, b)| b.clone()).collect();
    let aborted = [(5, 10)];
    let mut b = Batches::new(&all, aborted);
    let fates: Vec<(i64, Fate)> =
        std::iter::from_fn(|| b.next_batch()).map(|r| r.unwrap()).map(|b| (b.header.base_offset, b.fate)).collect();
    assert_eq!(
        fates,
        vec![
            (0, Fate::Data),
            (10, Fate::Aborted),
            (15, Fate::Data),
            (20, Fate::Aborted),
            (25, Fate::Control),
            (26, Fate::Control),
            (27, Fate::Data)
        ]
    );
    // A second response starting inside the aborted transaction lists it again.
    let tail: Vec<u8> = log.batches[3..].iter().flat_map(|(_, b)| b.clone()).collect();
    let mut b = Batches::new(&tail, aborted);
    assert_eq!(b.next_batch().unwrap().unwrap().fate, Fate::Aborted);
    // A batch cut off at the end is not handed out.
    let mut b = Batches::new(&all[..all.len() - 3], aborted);
    assert_eq!(std::iter::from_fn(|| b.next_batch()).count(), 6);
}

#[test]
fn the_plan_of_a_response_is_where_its_complete_batches_end() {
    let log = sample();
    let all: Vec<u8> = log.batches.iter().flat_map(|(_, b)| b.clone()).collect();
    let first = log.batches[0].1.len();
    assert_eq!(Batches::plan(&[]), Plan::Empty);
    assert_eq!(Batches::plan(&all), Plan::Next(37));
    assert_eq!(Batches::plan(&all[..all.len() - 1]), Plan::Next(27), "the last batch cut off");
    assert_eq!(Batches::plan(&all[..first + 3]), Plan::Next(10));
    assert_eq!(Batches::plan(&all[..first - 1]), Plan::CutOff { need: first }, "the first batch cut off");
    assert_eq!(Batches::plan(&all[..5]), Plan::CutOff { need: 0 }, "not even a length");
    // A damaged first header leaves nothing to go on from; a later one, the batches before it.
    let mut bad = all.clone();
    bad[8..12].copy_from_slice(&(-5i32).to_be_bytes());
    assert_eq!(Batches::plan(&bad), Plan::Unreadable);
    let mut bad = all.clone();
    bad[first + 16] = 99; // the second batch's magic
    assert_eq!(Batches::plan(&bad), Plan::Next(10));
}

#[test]
fn a_fetcher_asks_for_a_small_first_response_then_twice_as_much_up_to_the_partition_maximum() {
    // One batch a response, so that every batch is a fetch of its own.
    let addr = fake(sample(), Mode::Good, 100);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let pairs = [("bootstrap.servers", addr.as_str()), ("max.partition.fetch.bytes", "5000000")];
    let c = ClientConfig::parse(pairs, Duration::from_secs(2), Duration::from_secs(5)).unwrap();
    let mut cur = FetchCursor::with_read_ahead(KafkaClient::new(c), "t", 0, 0, true, None);
    assert_eq!(drain(&mut cur, 37).unwrap(), expected());
    let asked: Vec<i32> = ASKED.lock().unwrap().iter().filter(|(p, _)| *p == port).map(|&(_, n)| n).collect();
    assert!(asked.len() >= 6, "{asked:?}");
    assert_eq!(asked[..6], [1 << 20, 2 << 20, 4 << 20, 5_000_000, 5_000_000, 5_000_000]);
}

/// The Fetch requests the fake broker at `port` received so far.
fn fetches_asked(port: u16) -> usize {
    ASKED.lock().unwrap().iter().filter(|(p, _)| *p == port).count()
}

#[test]
fn a_primed_cursor_fetches_before_its_first_read_and_one_without_read_ahead_does_not() {
    let addr = fake(sample(), Mode::Good, 100);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let mut here = FetchCursor::with_read_ahead(client(&addr, Duration::from_secs(5)), "t", 0, 0, false, None);
    here.prime(37);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(fetches_asked(port), 0, "a cursor fetching on its caller's thread waits for a read");
    let mut ahead = FetchCursor::with_read_ahead(client(&addr, Duration::from_secs(5)), "t", 0, 0, true, None);
    ahead.prime(37);
    let deadline = Instant::now() + Duration::from_secs(5);
    while fetches_asked(port) == 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert!(fetches_asked(port) > 0, "no Fetch before the first read");
    assert_eq!(drain(&mut ahead, 37).unwrap(), expected());
    assert_eq!(drain(&mut here, 37).unwrap(), expected());
    // Primed for one end and read to another: the reads decide.
    let mut other = FetchCursor::with_read_ahead(client(&addr, Duration::from_secs(5)), "t", 0, 0, true, None);
    other.prime(37);
    assert_eq!(drain(&mut other, 20).unwrap(), (0..10).chain(15..20).collect::<Vec<_>>());
}

#[test]
fn large_responses_read_into_reused_buffers_hand_over_each_response_s_own_records() {
    // Batches of ~160 KB, responses of two or three: every frame is pooled,
    // and later responses are read into the buffers of earlier ones.
    let pad = 8_000;
    let batches: Vec<(i64, Vec<u8>)> =
        (0..24).map(|i| (i * 20, data_with(i * 20, 20, None, Compression::None, pad))).collect();
    assert!(batches[0].1.len() > 150_000);
    let log = Log { batches, aborted: vec![], end: 480 };
    let addr = fake(log, Mode::Good, 400_000);
    for via in Via::ALL {
        let c = client(&addr, Duration::from_secs(5));
        let mut cur = via.cursor(c.clone(), 0);
        let mut got = Vec::new();
        while cur
            .read_slices(480, 1 << 20, &mut |slice| {
                for r in slice {
                    let (k, v) = (format!("k{}", r.offset), value_of(r.offset, pad));
                    assert_eq!((r.key, r.value), (Some(k.as_bytes()), Some(v.as_bytes())), "{via:?}");
                    got.push(r.offset);
                }
            })
            .unwrap()
        {}
        assert_eq!(got, (0..480).collect::<Vec<_>>());
        assert!(c.frames.pooled() > 0, "no buffer came back to the pool ({via:?})");
        drop(cur);
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.frames.pooled() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5)); // a fetch thread ends by itself
        }
        assert_eq!(c.frames.pooled(), 0, "the buffers outlived the last fetcher");
    }
}

#[test]
fn a_read_stops_within_a_response_at_its_byte_budget_and_the_next_goes_on_from_it() {
    // Responses of two or three ~160 KB batches, reads of one batch's worth:
    // each read takes one batch, and the next takes the following one from
    // the same response rather than fetching again (a replay's chunk would
    // otherwise overshoot its size by most of a response).
    let pad = 8_000;
    let batches: Vec<(i64, Vec<u8>)> =
        (0..24).map(|i| (i * 20, data_with(i * 20, 20, None, Compression::None, pad))).collect();
    let log = Log { batches, aborted: vec![], end: 480 };
    let addr = fake(log, Mode::Good, 400_000);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    for via in Via::ALL {
        let before = fetches_asked(port);
        let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 0);
        let (mut got, mut reads) = (Vec::new(), 0);
        loop {
            let mut this = Vec::new();
            let more = cur.read(480, 1, &mut |r| this.push(r.offset)).unwrap();
            reads += 1;
            assert_eq!(this.len(), 20, "{via:?}: read {reads} took one batch");
            got.extend(this);
            if !more {
                break;
            }
        }
        assert_eq!(got, (0..480).collect::<Vec<_>>(), "{via:?}");
        assert_eq!(reads, 24, "{via:?}");
        let fetches = fetches_asked(port) - before;
        assert!(fetches < 16, "{via:?}: {fetches} Fetch requests for 24 batches in responses of 2-3");
    }
}

#[test]
fn slices_of_compressed_and_plain_batches_hand_over_every_committed_record_once_in_order() {
    for via in Via::ALL {
        for max in [400, 1000, 1 << 20] {
            let addr = fake(compressed_sample(), Mode::Good, max);
            let case = format!("max bytes {max}, {via:?}");
            let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 0);
            let mut got = Vec::new();
            while cur
                .read_slices(37, 1 << 20, &mut |slice| {
                    assert!(!slice.is_empty(), "an empty slice: {case}");
                    for r in slice {
                        let (k, v) = (format!("k{}", r.offset), value_of(r.offset, PAD));
                        assert_eq!((r.key, r.value), (Some(k.as_bytes()), Some(v.as_bytes())), "{case}");
                        got.push(r.offset);
                    }
                })
                .unwrap()
            {}
            assert_eq!(got, expected(), "{case}");
            assert_eq!((cur.position(), cur.skipped().aborted, cur.skipped().control), (37, 10, 2), "{case}");
            let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 12);
            assert_eq!(drain(&mut cur, 34).unwrap(), (15..20).chain(27..34).collect::<Vec<_>>(), "{case}");
        }
    }
}

#[test]
fn restores_through_small_responses_that_cut_batches_and_split_a_transaction() {
    let log = sample();
    for via in Via::ALL {
        for max in [120, 200, 333, 1 << 20] {
            let addr = fake(log.clone(), Mode::Good, max);
            let c = client(&addr, Duration::from_secs(5));
            let o = c.offsets("t", 0).unwrap();
            assert_eq!((o.start, o.end, o.last_stable), (0, 37, 37));
            let mut cur = via.cursor(c, 0);
            assert_eq!(drain(&mut cur, 37).unwrap(), expected(), "max bytes {max}, {via:?}");
            assert_eq!(cur.position(), 37);
            assert_eq!((cur.skipped().aborted, cur.skipped().control), (10, 2));
        }
        // Starting mid-log, inside the aborted transaction, and stopping before the end.
        let addr = fake(log.clone(), Mode::Good, 150);
        let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 12);
        assert_eq!(drain(&mut cur, 30).unwrap(), (15..20).chain(27..30).collect::<Vec<_>>());
        // Then on to further ends, the last past a cut: nothing read twice, nothing missed.
        assert_eq!(drain(&mut cur, 33).unwrap(), (30..33).collect::<Vec<_>>(), "{via:?}");
        assert_eq!(drain(&mut cur, 37).unwrap(), (33..37).collect::<Vec<_>>(), "{via:?}");
        // Small reads of one range hand out each record once.
        let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 0);
        let mut got = Vec::new();
        while cur.read(37, 1, &mut |r| got.push(r.offset)).unwrap() {}
        assert_eq!(got, expected(), "{via:?}");
        // A cursor dropped halfway does not wait for its fetch thread.
        let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 0);
        assert!(cur.read(37, 1, &mut |_| {}).unwrap());
        let t = Instant::now();
        drop(cur);
        assert!(t.elapsed() < Duration::from_millis(500), "{via:?}: {:?}", t.elapsed());
    }
}

/// The error reading the whole sample from a broker behaving as `mode` says,
/// the same with and without a fetch thread; how long it took (the longer).
fn failure(mode: Mode) -> (KafkaError, Duration, String) {
    let addr = fake(sample(), mode, 1 << 20);
    let mut seen: Vec<(KafkaError, Duration)> = Vec::new();
    for via in Via::ALL {
        let c = client(&addr, Duration::from_millis(600));
        let mut cur = via.cursor(c, 0);
        let t = Instant::now();
        let e = drain(&mut cur, 37).unwrap_err();
        seen.push((e, t.elapsed()));
    }
    let (b, tb) = seen.pop().unwrap();
    let (a, ta) = seen.pop().unwrap();
    assert_eq!(a.to_string(), b.to_string(), "the same error with a fetch thread");
    (a, ta.max(tb), addr)
}

#[test]
fn garbage_is_an_error_naming_the_broker_partition_and_offset() {
    let (e, took, addr) = failure(Mode::Garbage);
    let m = e.to_string();
    assert!(matches!(e, KafkaError::Protocol(_)), "{m}");
    assert!(m.contains(&addr) && m.contains("t-0") && m.contains("offset 0"), "{m}");
    assert!(took < Duration::from_secs(3));
}

#[test]
fn a_connection_closed_mid_response_ends_in_an_error_not_a_hang() {
    let (e, took, addr) = failure(Mode::CloseMidResponse);
    let m = e.to_string();
    assert!(m.contains(&addr) && m.contains("t-0") && m.contains("offset 0") && m.contains("closed"), "{m}");
    assert!(took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_bad_crc_is_corrupt_naming_the_batch() {
    let (e, _, addr) = failure(Mode::BadCrc);
    let m = e.to_string();
    assert!(matches!(e, KafkaError::Corrupt(_)), "{m}");
    assert!(m.contains(&addr) && m.contains("t-0") && m.contains("batch at offset 0"), "{m}");
}

#[test]
fn no_progress_times_out_naming_the_offset() {
    let (e, took, addr) = failure(Mode::Silent);
    let m = e.to_string();
    assert!(matches!(e, KafkaError::Timeout(_)), "{m}");
    assert!(m.contains(&addr) && m.contains("t-0") && m.contains("offset 0") && m.contains("no progress"), "{m}");
    assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(5), "{took:?}");
}

#[test]
fn a_broker_answering_nothing_at_once_is_not_asked_again_at_once() {
    let (_, took, addr) = failure(Mode::Silent);
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    // Two readers of 0.6 s each, a fetch per `fetch.max.wait` (100 ms): about 14.
    let asked = fetches_asked(port);
    assert!(asked <= 2 * 12, "{asked} fetches in {took:?}");
}

#[test]
fn an_unreachable_cluster_is_an_error_within_the_timeout() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let t = Instant::now();
    let e = client(&addr, Duration::from_millis(300)).offsets("t", 0).unwrap_err();
    assert!(e.to_string().contains(&addr), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// A batch with the control and transactional flags and no record, as
/// Kafka's log cleaner leaves one (a marker emptied, kept for its producer).
fn empty_control(base: i64, pid: i64) -> Vec<u8> {
    let meta =
        BatchMeta { producer_id: pid, producer_epoch: 0, transactional: true, control: true, ..Default::default() };
    BatchBuilder::new(base, meta).finish(Compression::None)
}

/// A data batch with no record, as the cleaner keeps an idempotent
/// producer's last batch once its records are compacted away.
fn empty_data(base: i64, pid: i64) -> Vec<u8> {
    let meta = BatchMeta { producer_id: pid, producer_epoch: 0, base_sequence: 3, ..Default::default() };
    BatchBuilder::new(base, meta).finish(Compression::None)
}

/// 0..10 plain; 10..15 pid 5 (aborted); 15 ABORT pid 5; 16 empty control
/// pid 5; 17..20 pid 6 (committed); 20 COMMIT pid 6; 21 empty control pid 6;
/// 22..27 plain; 27 an empty data batch of pid 8; 28..30 plain.
fn cleaned_sample() -> Log {
    let batches = vec![
        (0, data(0, 10, None)),
        (10, data(10, 5, Some(5))),
        (15, control_batch(15, 5, 0, false, 2000, 0)),
        (16, empty_control(16, 5)),
        (17, data(17, 3, Some(6))),
        (20, control_batch(20, 6, 0, true, 2000, 0)),
        (21, empty_control(21, 6)),
        (22, data(22, 5, None)),
        (27, empty_data(27, 8)),
        (28, data(28, 2, None)),
    ];
    Log { batches, aborted: vec![(5, 10, 15)], end: 30 }
}

#[test]
fn empty_control_batches_left_by_the_cleaner_are_skipped() {
    let log = cleaned_sample();
    let want: Vec<i64> = (0..10).chain(17..20).chain(22..27).chain(28..30).collect();
    let all: Vec<u8> = log.batches.iter().flat_map(|(_, b)| b.clone()).collect();
    let mut b = Batches::new(&all, [(5, 10)]);
    let fates: Vec<(i64, Fate)> =
        std::iter::from_fn(|| b.next_batch()).map(|r| r.unwrap()).map(|b| (b.header.base_offset, b.fate)).collect();
    assert_eq!(fates[3], (16, Fate::Control));
    assert_eq!(fates[6], (21, Fate::Control));
    assert_eq!(fates[8], (27, Fate::Data), "an empty data batch: no record, as Kafka's consumer sees it");
    for via in Via::ALL {
        // Small responses put an empty batch first, last and alone in one.
        for max in [60, 100, 200, 1 << 20] {
            let addr = fake(log.clone(), Mode::Good, max);
            let case = format!("max bytes {max}, {via:?}");
            let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 0);
            assert_eq!(drain(&mut cur, 30).unwrap(), want, "{case}");
            assert_eq!(cur.position(), 30, "{case}");
            // Records stepped over: two markers (the empty batches hold none), five aborted.
            assert_eq!((cur.skipped().control, cur.skipped().aborted), (2, 5), "{case}");
            // Starting on an empty batch.
            let mut cur = via.cursor(client(&addr, Duration::from_secs(5)), 21);
            assert_eq!(drain(&mut cur, 30).unwrap(), (22..27).chain(28..30).collect::<Vec<_>>(), "{case}");
        }
    }
}

#[test]
fn a_throttled_fetch_waits_the_throttle_and_goes_on() {
    let throttle = Duration::from_millis(300);
    for via in Via::ALL {
        let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
        {
            let mut sc = script.lock().unwrap();
            // A broker over its quota answers the first and the third fetch with a throttle and nothing else.
            sc.throttles.push_back((ApiKey::Fetch, 300));
            sc.throttles.push_back((ApiKey::Fetch, 0));
            sc.throttles.push_back((ApiKey::Fetch, 300));
        }
        let mut cur = via.cursor(client(&addrs[0], Duration::from_secs(5)), 0);
        assert_eq!(drain(&mut cur, 37).unwrap(), expected(), "{via:?}");
        let fetches = script.lock().unwrap().asked(ApiKey::Fetch);
        assert!(fetches.len() >= 5, "{}", fetches.len());
        for i in [0, 2] {
            let waited = fetches[i + 1].1 - fetches[i].1;
            assert!(waited >= throttle - Duration::from_millis(10), "{via:?}: fetch {i}: {waited:?}");
        }
    }
}

#[test]
fn a_throttle_longer_than_an_attempt_is_waited_out_on_the_same_connection() {
    // A budget of 3 s (attempts of 1 s) and a Fetch throttled for 2.5 s: a
    // request sent before the throttle ended would wait on the muted
    // connection, time out, and cost a reconnect.
    let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
    script.lock().unwrap().throttles.push_back((ApiKey::Fetch, 2500));
    let pairs = [("bootstrap.servers", addrs[0].as_str())];
    let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(3), Duration::from_secs(10)).unwrap());
    let mut cur = FetchCursor::new(c, "t", 0, 0);
    assert_eq!(drain(&mut cur, 37).unwrap(), expected());
    let sc = script.lock().unwrap();
    assert_eq!(sc.accepted.len(), 1, "one connection throughout");
    let fetches = sc.asked(ApiKey::Fetch);
    assert!(fetches[1].1 - fetches[0].1 >= Duration::from_millis(2490), "{:?}", fetches[1].1 - fetches[0].1);
}

#[test]
fn throttled_metadata_and_list_offsets_are_waited_out_before_the_next_request() {
    let (addrs, script) = cluster(1, sample(), Mode::Good, 1 << 20);
    {
        let mut sc = script.lock().unwrap();
        sc.throttles.push_back((ApiKey::Metadata, 250));
        sc.throttles.push_back((ApiKey::ListOffsets, 250));
    }
    let o = client(&addrs[0], Duration::from_secs(5)).offsets("t", 0).unwrap();
    assert_eq!((o.start, o.end, o.last_stable), (0, 37, 37));
    let sc = script.lock().unwrap();
    let (meta, lists) = (sc.asked(ApiKey::Metadata), sc.asked(ApiKey::ListOffsets));
    assert_eq!((meta.len(), lists.len()), (1, 3));
    let floor = Duration::from_millis(240);
    assert!(lists[0].1 - meta[0].1 >= floor, "after the throttled Metadata: {:?}", lists[0].1 - meta[0].1);
    assert!(lists[1].1 - lists[0].1 >= floor, "after the throttled ListOffsets: {:?}", lists[1].1 - lists[0].1);
}

#[test]
fn errors_of_a_leader_election_are_retried_and_the_leader_epoch_is_sent() {
    for via in Via::ALL {
        let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
        {
            let mut sc = script.lock().unwrap();
            sc.epoch = 7;
            for (key, code) in [
                (ApiKey::Metadata, 3), // the topic unknown for a moment
                (ApiKey::Metadata, 5),
                (ApiKey::ListOffsets, 78), // OFFSET_NOT_AVAILABLE right after an election
                (ApiKey::ListOffsets, 9),  // REPLICA_NOT_AVAILABLE
                (ApiKey::ListOffsets, -1), // UNKNOWN_SERVER_ERROR
                (ApiKey::ListOffsets, 74), // FENCED_LEADER_EPOCH
                (ApiKey::Fetch, 6),        // NOT_LEADER_OR_FOLLOWER
                (ApiKey::Fetch, 5),        // LEADER_NOT_AVAILABLE
                (ApiKey::Fetch, 9),
                (ApiKey::Fetch, 74),
                (ApiKey::Fetch, 75), // UNKNOWN_LEADER_EPOCH
                (ApiKey::Fetch, -1),
            ] {
                sc.errors.push_back((key, code));
            }
        }
        // Backoffs of 50 ms doubling: six failed tries take 2.5 s of the budget.
        let pairs = [("bootstrap.servers", addrs[0].as_str())];
        let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(6), Duration::from_secs(10)).unwrap());
        let o = c.offsets("t", 0).unwrap();
        assert_eq!((o.start, o.end, o.last_stable), (0, 37, 37));
        let mut cur = via.cursor(c, 0);
        assert_eq!(drain(&mut cur, 37).unwrap(), expected(), "{via:?}");
        let sc = script.lock().unwrap();
        assert!(sc.errors.is_empty(), "every error was answered");
        // Each error but the first two (Metadata's own) was followed by a metadata refresh.
        assert!(sc.asked(ApiKey::Metadata).len() >= 11, "{}", sc.asked(ApiKey::Metadata).len());
        for key in [ApiKey::ListOffsets, ApiKey::Fetch] {
            let epochs: Vec<i32> = sc.asked(key).iter().map(|a| a.2).collect();
            assert!(epochs.iter().all(|e| *e == 7), "{key:?} sent leader epochs {epochs:?}");
        }
    }
}

#[test]
fn a_topic_that_stays_unknown_is_an_error_within_the_request_timeout() {
    let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
    script.lock().unwrap().errors.extend([(ApiKey::Metadata, 3); 1000]);
    let t = Instant::now();
    let e = client(&addrs[0], Duration::from_millis(600)).offsets("t", 0).unwrap_err();
    assert!(matches!(e, KafkaError::NoTopic(_)), "{e}");
    assert!(e.to_string().contains(&addrs[0]) && e.to_string().contains("t-0"), "{e}");
    assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
}

#[test]
fn a_new_leader_named_by_the_former_one_is_fetched_from_without_a_metadata_refresh() {
    for hint in [true, false] {
        let (addrs, script) = cluster(2, sample(), Mode::Good, 150);
        script.lock().unwrap().epoch = 3;
        let mut cur = FetchCursor::with_read_ahead(client(&addrs[0], Duration::from_secs(5)), "t", 0, 0, false, None);
        let mut got = Vec::new();
        assert!(cur.read(37, 1, &mut |r| got.push(r.offset)).unwrap());
        // An election: node 2 leads in epoch 4; node 1 says so if it gives hints.
        {
            let mut sc = script.lock().unwrap();
            assert_eq!(sc.asked(ApiKey::Metadata).len(), 1);
            (sc.leader, sc.epoch, sc.hint) = (2, 4, hint);
        }
        while cur.read(37, 1 << 20, &mut |r| got.push(r.offset)).unwrap() {}
        assert_eq!(got, expected(), "hint {hint}");
        let sc = script.lock().unwrap();
        let to_2: Vec<i32> = sc.asked(ApiKey::Fetch).iter().filter(|a| a.0 == 2).map(|a| a.2).collect();
        assert!(!to_2.is_empty() && to_2.iter().all(|e| *e == 4), "hint {hint}: epochs sent to node 2: {to_2:?}");
        let refreshes = sc.asked(ApiKey::Metadata).len();
        assert_eq!(refreshes, if hint { 1 } else { 2 }, "hint {hint}");
    }
}

#[test]
fn a_restore_waits_out_a_leader_paused_past_the_request_timeout_before_its_first_fetch() {
    // Attempts of 1 s in a request budget of 3 s, a stall timeout of 10 s: node 1 leads, then
    // stops answering (its connections open); node 2 leads only 4 s later, past the request budget.
    use crate::source::Changelog;
    for restore in [false, true] {
        let (addrs, script) = cluster(2, sample(), Mode::Good, 150);
        let pairs = [("bootstrap.servers", addrs[0].as_str())];
        let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(3), Duration::from_secs(10)).unwrap());
        c.offsets("t", 0).unwrap(); // a pooled connection to node 1, which the next call takes
        script.lock().unwrap().muted.push(1);
        let moved = script.clone();
        thread::spawn(move || {
            thread::sleep(Duration::from_secs(4));
            moved.lock().unwrap().leader = 2;
        });
        let t = Instant::now();
        if restore {
            let o = super::client::KafkaLog(c)
                .bounds("t", 0)
                .unwrap_or_else(|e| panic!("a restore's bounds after {:?}: {e}", t.elapsed()));
            assert_eq!((o.start, o.end), (0, 37));
            assert!(t.elapsed() < Duration::from_secs(8), "bounds took {:?}", t.elapsed());
        } else {
            let e = c.offsets("t", 0).unwrap_err();
            assert!(matches!(e, KafkaError::Timeout(_)), "{e}");
            assert!(
                t.elapsed() < Duration::from_millis(3600),
                "outside a restore: the request budget, {:?}",
                t.elapsed()
            );
        }
    }
}

#[test]
fn a_leader_that_stops_answering_costs_an_attempt_not_the_call_s_budget() {
    // A budget of 3 s, attempts of 1 s: node 1 leads, then is paused (its
    // connections open, nothing answered); 300 ms later node 2 leads.
    for via in Via::ALL {
        let (addrs, script) = cluster(2, sample(), Mode::Good, 150);
        let pairs = [("bootstrap.servers", addrs[0].as_str())];
        let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(3), Duration::from_secs(10)).unwrap());
        assert_eq!(c.config.attempt_timeout, Duration::from_secs(1));
        c.offsets("t", 0).unwrap(); // a pooled connection to node 1, which the next call takes
        let pause = |script: &Shared| {
            script.lock().unwrap().muted.push(1);
            let script = script.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(300));
                script.lock().unwrap().leader = 2;
            });
        };
        pause(&script);
        let t = Instant::now();
        let o = c.offsets("t", 0).unwrap_or_else(|e| panic!("after {:?}: {e}", t.elapsed()));
        assert_eq!((o.start, o.end), (0, 37));
        assert!(t.elapsed() < Duration::from_millis(2500), "offsets took {:?}", t.elapsed());
        assert!(script.lock().unwrap().asked(ApiKey::ListOffsets).iter().any(|a| a.0 == 2));

        // A fetch waiting on a paused leader: the same, within the stall timeout.
        let (addrs, script) = cluster(2, sample(), Mode::Good, 150);
        let pairs = [("bootstrap.servers", addrs[0].as_str())];
        let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(3), Duration::from_secs(10)).unwrap());
        let mut cur = via.cursor(c, 0);
        let mut got = Vec::new();
        assert!(cur.read(37, 1, &mut |r| got.push(r.offset)).unwrap());
        pause(&script);
        let t = Instant::now();
        while cur.read(37, 1 << 20, &mut |r| got.push(r.offset)).unwrap() {}
        assert_eq!(got, expected(), "{via:?}");
        assert!(t.elapsed() < Duration::from_millis(2500), "{via:?}: the rest took {:?}", t.elapsed());
    }
}

#[test]
fn a_topic_recreated_under_the_same_name_is_out_of_range_never_read_on() {
    let (a, b) = (uuid::Uuid::from_u128(0xA), uuid::Uuid::from_u128(0xB));
    for via in Via::ALL {
        let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
        script.lock().unwrap().topic_id = a;
        let c = client(&addrs[0], Duration::from_secs(5));
        assert_eq!(c.offsets("t", 0).unwrap().end, 37);
        // A store restored up to offset 20 under id A...
        let mut cur = via.cursor(c.clone(), 0);
        assert_eq!(drain(&mut cur, 20).unwrap(), (0..10).chain(15..20).collect::<Vec<_>>());
        assert!(script.lock().unwrap().fetches.iter().all(|&(v, id)| v == 15 && id == a), "fetched by id, v15");
        // ... the topic deleted and recreated (id B) ...
        script.lock().unwrap().topic_id = b;
        // ... the same reader going on, and a restore going on from the store's offset: both out of range.
        for (what, r) in
            [("the same reader", drain(&mut cur, 37)), ("a new restore", drain(&mut via.cursor(c.clone(), 20), 37))]
        {
            let e = r.expect_err(what);
            assert!(matches!(e, KafkaError::OutOfRange(_)), "{what}: {e}");
            assert!(e.to_string().contains("recreated") && e.to_string().contains("t-0"), "{what}: {e}");
        }
        // The store wiped: a restore from the start reads the new topic, and then goes on under it.
        let mut fresh = via.cursor(c.clone(), 0);
        assert_eq!(drain(&mut fresh, 20).unwrap(), (0..10).chain(15..20).collect::<Vec<_>>());
        let mut on = via.cursor(c.clone(), 20);
        assert_eq!(drain(&mut on, 37).unwrap(), (27..37).collect::<Vec<_>>(), "{via:?}");
        assert_eq!(script.lock().unwrap().fetches.last().unwrap().1, b);
    }
    // A broker without topic ids is fetched by name (v12).
    let (addrs, script) = cluster(1, sample(), Mode::Good, 1 << 20);
    let mut cur = FetchCursor::new(client(&addrs[0], Duration::from_secs(5)), "t", 0, 0);
    assert_eq!(drain(&mut cur, 37).unwrap(), expected());
    assert!(script.lock().unwrap().fetches.iter().all(|&(v, id)| v == 12 && id.is_nil()));
}

#[test]
fn a_store_held_to_its_own_topic_id_is_out_of_range_whatever_the_client_read_since() {
    // A new client (a restarted process) on a topic recreated as B: another store of the partition
    // restored from scratch reads it under B first; the store read under A goes on from its offset.
    let (a, b) = (uuid::Uuid::from_u128(0xA), uuid::Uuid::from_u128(0xB));
    for via in Via::ALL {
        let (addrs, script) = cluster(1, sample(), Mode::Good, 150);
        script.lock().unwrap().topic_id = b;
        let c = client(&addrs[0], Duration::from_secs(5));
        assert_eq!(c.offsets("t", 0).unwrap().end, 37);
        let mut other = via.cursor(c.clone(), 0);
        assert_eq!(other.topic_id(), None, "nothing read yet");
        assert_eq!(drain(&mut other, 37).unwrap(), expected());
        assert_eq!(other.topic_id(), Some(b), "{via:?}: what it read under");
        let e = drain(&mut via.held_cursor(c.clone(), 20, Some(a)), 37).expect_err("held to A");
        assert!(matches!(e, KafkaError::OutOfRange(_)) && e.to_string().contains("recreated"), "{via:?}: {e}");
        // Held to the id it finds, or to none (a store with no record of its id), it goes on.
        let mut on = via.held_cursor(c.clone(), 20, Some(b));
        assert_eq!(drain(&mut on, 37).unwrap(), (27..37).collect::<Vec<_>>(), "{via:?}");
        assert_eq!(on.topic_id(), Some(b));
        assert_eq!(drain(&mut via.cursor(c.clone(), 20), 37).unwrap(), (27..37).collect::<Vec<_>>(), "{via:?}");
        // A store restored from scratch is held to nothing: it takes the topic as it is now.
        assert_eq!(drain(&mut via.held_cursor(c.clone(), 0, Some(a)), 37).unwrap(), expected(), "{via:?}");
    }
}

#[test]
fn pooled_connections_idle_past_connections_max_idle_ms_are_not_reused() {
    let (addrs, script) = cluster(1, sample(), Mode::Good, 1 << 20);
    let pairs = [("bootstrap.servers", addrs[0].as_str()), ("connections.max.idle.ms", "1000")];
    let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(2), Duration::from_secs(5)).unwrap());
    c.offsets("t", 0).unwrap();
    c.offsets("t", 0).unwrap();
    assert_eq!(script.lock().unwrap().accepted.len(), 1, "reused while fresh");
    thread::sleep(Duration::from_millis(1300));
    c.offsets("t", 0).unwrap();
    assert_eq!(script.lock().unwrap().accepted.len(), 2, "a new connection after the idle limit");
}

#[test]
fn connections_the_broker_closed_are_not_reused_and_a_dead_bootstrap_server_is_tried_last() {
    // A bootstrap server that accepts and hangs up at once, beside one that
    // closes every connection after one answer (as an idle reaper would).
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap().to_string();
    let tries = Arc::new(Mutex::new(0));
    let counted = tries.clone();
    thread::spawn(move || {
        for s in dead.incoming() {
            *counted.lock().unwrap() += 1;
            drop(s);
        }
    });
    let (addrs, _script) = cluster(1, sample(), Mode::CloseAfterAnswer, 1 << 20);
    let servers = format!("{dead_addr},{}", addrs[0]);
    let c = client(&servers, Duration::from_secs(5));
    for i in 0..10 {
        c.refresh_metadata("t").unwrap_or_else(|e| panic!("refresh {i}: {e}"));
        thread::sleep(Duration::from_millis(100)); // the broker's close arrives
    }
    assert!(*tries.lock().unwrap() <= 1, "the dead server was tried {} times", tries.lock().unwrap());
}

#[test]
fn a_black_holed_bootstrap_server_costs_the_connection_setup_timeout_once() {
    // A listener whose accept queue is full drops further SYNs: a host that
    // answers nothing, not even a reset.
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let hole_addr = hole.local_addr().unwrap();
    {
        use std::os::fd::AsRawFd;
        assert_eq!(unsafe { libc::listen(hole.as_raw_fd(), 0) }, 0);
    }
    let _filler = TcpStream::connect(hole_addr).unwrap();
    let (addrs, _script) = cluster(1, sample(), Mode::Good, 1 << 20);
    let servers = format!("{hole_addr},{}", addrs[0]);
    let pairs = [
        ("bootstrap.servers", servers.as_str()),
        ("socket.connection.setup.timeout.ms", "300"),
        ("connections.max.idle.ms", "1"),
    ];
    let c = KafkaClient::new(ClientConfig::parse(pairs, Duration::from_secs(5), Duration::from_secs(5)).unwrap());
    for i in 0..3 {
        let t = Instant::now();
        c.refresh_metadata("t").unwrap();
        let limit = if i == 0 { Duration::from_millis(1500) } else { Duration::from_millis(250) };
        assert!(t.elapsed() < limit, "refresh {i}: {:?}", t.elapsed());
        thread::sleep(Duration::from_millis(5)); // the pooled connection expires
    }
    drop(hole);
}

#[test]
fn bootstrap_servers_are_shuffled_per_client() {
    let firsts: std::collections::HashSet<String> =
        (0..40).map(|_| client("a:1,b:2,c:3,d:4", Duration::from_secs(1)).bootstrap_order()[0].clone()).collect();
    assert!(firsts.len() >= 2, "{firsts:?}");
    let mut order = client("a:1,b:2,c:3,d:4", Duration::from_secs(1)).bootstrap_order().to_vec();
    order.sort();
    assert_eq!(order, ["a:1", "b:2", "c:3", "d:4"]);
}

#[test]
fn a_broker_answering_batches_below_the_offset_ends_the_restore_naming_it() {
    let addr = fake(sample(), Mode::Stale, 100);
    for via in Via::ALL {
        let c = client(&addr, Duration::from_secs(20));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Instant::now();
        thread::spawn(move || {
            let mut cur = via.cursor(c, 0);
            let _ = tx.send(drain(&mut cur, 37));
        });
        let r = rx.recv_timeout(Duration::from_secs(10)).expect("the restore hangs");
        let e = r.unwrap_err();
        let m = e.to_string();
        assert!(matches!(e, KafkaError::Protocol(_)), "{m}");
        assert!(m.contains(&addr) && m.contains("t-0") && m.contains("offset 10"), "{m}");
        assert!(t.elapsed() < Duration::from_secs(5), "{via:?}: {:?}", t.elapsed());
    }
}

/// Partition `p`'s log: [`sample`]'s transactions (10..25 of pid 5 aborted)
/// then `batches` plain batches of 5 records, every value padded with `p`
/// bytes, so that a record handed to another partition's restore shows.
fn partition_log(p: i32, batches: i64) -> Log {
    let pad = p as usize;
    let mut log = vec![
        (0, data_with(0, 10, None, Compression::None, pad)),
        (10, data_with(10, 5, Some(5), Compression::None, pad)),
        (15, data_with(15, 5, Some(6), Compression::None, pad)),
        (20, data_with(20, 5, Some(5), Compression::None, pad)),
        (25, control_batch(25, 5, 0, false, 2000, 0)),
        (26, control_batch(26, 6, 0, true, 2000, 0)),
    ];
    for i in 0..batches {
        let base = 27 + 5 * i;
        log.push((base, data_with(base, 5, None, Compression::None, pad)));
    }
    Log { batches: log, aborted: vec![(5, 10, 25)], end: 27 + 5 * batches }
}

/// The committed records of [`partition_log`]`(p, ..)` below `end`, as a store holds them.
fn partition_store(p: i32, end: i64) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
    (0..10)
        .chain(15..20)
        .chain(27..end)
        .map(|o| (format!("k{o}").into_bytes(), value_of(o, p as usize).into_bytes()))
        .collect()
}

/// `restore_many` of `parts` partitions of t with `leaders` (node of each
/// partition) on `threads` threads: every store holds its own partition's
/// committed records.
fn restore_partitions(
    bootstrap: &str,
    leaders: &[i32],
    ends: i64,
    threads: usize,
) -> Vec<Result<crate::restore::engine::RestoreOutcome, crate::restore::RestoreError>> {
    use crate::restore::engine::{restore_many, RestoreSpec};
    let dir = tempfile::tempdir().unwrap();
    let specs =
        (0..leaders.len() as i32).map(|p| (RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p), None)).collect();
    let out = restore_many(&super::client::KafkaLog(client(bootstrap, Duration::from_secs(5))), specs, threads);
    for (p, o) in out.iter().enumerate() {
        let o = o.as_ref().unwrap_or_else(|e| panic!("t-{p}: {e}"));
        assert_eq!(o.end_offset, ends);
        let store = crate::store::Store::open(&dir.path().join(format!("s{p}")), false).unwrap();
        assert_eq!(crate::restore::testing::dump(&store), partition_store(p as i32, ends), "t-{p}");
    }
    out
}

#[test]
fn restore_many_sends_one_fetch_per_broker_for_all_its_partitions_over_one_connection() {
    // 4 partitions, 2 led by each of 2 nodes; one batch per response and
    // 2 ms per Fetch, so that the reads are many fetches long, overlap, and
    // wait for the brokers.
    let leaders = [1, 2, 1, 2];
    let logs: Vec<Log> = (0..4).map(|p| partition_log(p, 100)).collect();
    let end = logs[0].end;
    let (addrs, script) = cluster_of(2, logs, Mode::Good, 100);
    {
        let mut sc = script.lock().unwrap();
        sc.leaders = leaders.to_vec();
        sc.fetch_time = Duration::from_millis(2);
    }
    restore_partitions(&addrs.join(","), &leaders, end, 4);
    let sc = script.lock().unwrap();
    for node in [1, 2] {
        let fetches: Vec<&(i32, usize, Vec<i32>)> = sc.fetched.iter().filter(|f| f.0 == node).collect();
        let conns: std::collections::BTreeSet<usize> = fetches.iter().map(|f| f.1).collect();
        assert_eq!(conns.len(), 1, "node {node}: Fetches over connections {conns:?}");
        assert!(
            fetches.iter().any(|f| f.2.len() == 2),
            "node {node}: no Fetch named both its partitions ({} Fetches)",
            fetches.len()
        );
        assert!(
            fetches.iter().all(|f| f.2.iter().all(|&p| leaders[p as usize] == node)),
            "a partition it does not lead"
        );
    }
}

#[test]
fn a_job_reads_the_bounds_of_its_partitions_in_three_list_offsets_per_broker() {
    // 6 partitions, 3 led by each of 2 nodes, restored one at a time: the
    // job asks each leader once for the earliest, latest and last stable
    // offsets of all its partitions, not three times per partition.
    let leaders = [1, 2, 1, 2, 1, 2];
    let logs: Vec<Log> = (0..6).map(|p| partition_log(p, 4)).collect();
    let end = logs[0].end;
    let (addrs, script) = cluster_of(2, logs.clone(), Mode::Good, 1 << 20);
    script.lock().unwrap().leaders = leaders.to_vec();
    restore_partitions(&addrs.join(","), &leaders, end, 1);
    let listed = script.lock().unwrap().listed.clone();
    assert_eq!(listed.len(), 6, "{listed:?}");
    for (node, parts) in &listed {
        let led: Vec<i32> = (0..6).filter(|&p| leaders[p as usize] == *node).collect();
        assert_eq!(parts, &led, "node {node}");
    }

    // A leader that answers the job's request with an error (a leader
    // election): its partitions read their own bounds, with the retries.
    let (addrs, script) = cluster_of(2, logs, Mode::Good, 1 << 20);
    {
        let mut sc = script.lock().unwrap();
        sc.leaders = leaders.to_vec();
        sc.errors.push_back((ApiKey::ListOffsets, 6)); // NOT_LEADER_OR_FOLLOWER
    }
    restore_partitions(&addrs.join(","), &leaders, end, 1);
    let listed = script.lock().unwrap().listed.clone();
    let alone = listed.iter().filter(|(_, parts)| parts.len() == 1).count();
    assert_eq!(alone, 3 * 3, "the 3 partitions of the node that failed, 3 requests each: {listed:?}");
}

#[test]
fn a_leader_that_does_not_answer_holds_a_job_s_bounds_up_for_their_budget_only() {
    // Node 2 reads requests and answers none (a paused broker): the bounds
    // of node 1's partitions are read ahead, node 2's are left to their
    // restores, within an attempt's timeout (a third of the 2 s budget).
    let logs: Vec<Log> = (0..4).map(|p| partition_log(p, 4)).collect();
    let (addrs, script) = cluster_of(2, logs, Mode::Good, 1 << 20);
    {
        let mut sc = script.lock().unwrap();
        sc.leaders = vec![1, 2, 1, 2];
        sc.muted = vec![2];
    }
    let c = client(&addrs[0], Duration::from_secs(5));
    let t0 = Instant::now();
    let parts: Vec<(String, i32)> = (0..4).map(|p| ("t".to_string(), p)).collect();
    let got = c.offsets_many(&parts);
    let took = t0.elapsed();
    let mut read: Vec<i32> = got.keys().map(|(_, p)| *p).collect();
    read.sort();
    assert_eq!(read, vec![0, 2], "node 1's partitions");
    assert_eq!(got[&("t".to_string(), 0)].end, partition_log(0, 4).end);
    assert!(took < c.config.attempt_timeout + Duration::from_millis(500), "took {took:?}");
}

#[test]
fn a_leader_change_of_a_job_s_partitions_costs_one_metadata_refresh() {
    // 4 partitions led by node 1 move to node 2 (a new epoch) after each
    // read its first response: node 1 answers NOT_LEADER_OR_FOLLOWER, and
    // one metadata lookup sends all four to node 2.
    let logs: Vec<Log> = (0..4).map(|p| partition_log(p, 40)).collect();
    let end = logs[0].end;
    let (addrs, script) = cluster_of(2, logs, Mode::Good, 100);
    let c = client(&addrs.join(","), Duration::from_secs(5));
    let session = FetchSession::new(c);
    let mut cursors: Vec<FetchCursor> = (0..4).map(|p| FetchCursor::in_session(&session, "t", p, 0, None)).collect();
    let mut got: Vec<Vec<(i64, Vec<u8>)>> = vec![Vec::new(); 4];
    for (p, cur) in cursors.iter_mut().enumerate() {
        cur.prime(end);
        cur.read(end, 1, &mut |r| got[p].push((r.offset, r.value.unwrap().to_vec()))).unwrap();
    }
    let refreshes = {
        let mut sc = script.lock().unwrap();
        (sc.leader, sc.epoch) = (2, 1);
        sc.asked(ApiKey::Metadata).len()
    };
    let handles: Vec<_> = cursors
        .into_iter()
        .zip(got)
        .map(|(mut cur, mut got)| {
            thread::spawn(move || {
                while cur.read(end, 1 << 20, &mut |r| got.push((r.offset, r.value.unwrap().to_vec()))).unwrap() {}
                got
            })
        })
        .collect();
    for (p, h) in handles.into_iter().enumerate() {
        let got: std::collections::BTreeMap<Vec<u8>, Vec<u8>> =
            h.join().unwrap().into_iter().map(|(o, v)| (format!("k{o}").into_bytes(), v)).collect();
        assert_eq!(got, partition_store(p as i32, end), "t-{p}");
    }
    let sc = script.lock().unwrap();
    assert_eq!(sc.asked(ApiKey::Metadata).len() - refreshes, 1, "metadata refreshes after the move");
    let after: Vec<&(i32, usize, Vec<i32>)> = sc.fetched.iter().filter(|f| f.0 == 2).collect();
    assert!(after.iter().any(|f| f.2.len() > 1), "node 2 was sent no Fetch of several partitions");
    assert!(sc.asked(ApiKey::Fetch).iter().filter(|f| f.0 == 2).all(|f| f.2 == 1), "the new epoch is sent");
    drop(sc);
    let deadline = Instant::now() + Duration::from_secs(2);
    while session.threads() > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(session.threads(), 0, "the fetch threads end with the partitions they fetched");
}

#[test]
fn two_reads_of_one_partition_in_a_session_each_get_their_own_records() {
    // Two stores of one changelog partition restored in one job: their reads
    // share a session, and a Fetch naming the partition twice is answered
    // once (for the last entry's offset), so each read must go in a Fetch of
    // its own or one of them is handed the other's records as its own.
    let log = partition_log(0, 40);
    let end = log.end;
    let (addrs, _script) = cluster_of(1, vec![log], Mode::Good, 100);
    let c = client(&addrs[0], Duration::from_secs(5));
    let mut alone = FetchCursor::with_read_ahead(c.clone(), "t", 0, 0, false, None);
    let all = drain(&mut alone, end).unwrap();
    let session = FetchSession::new(c);
    let starts = [0, 60];
    let handles: Vec<_> = starts
        .iter()
        .map(|&start| {
            let mut cur = FetchCursor::in_session(&session, "t", 0, start, None);
            thread::spawn(move || drain(&mut cur, end).unwrap())
        })
        .collect();
    for (start, h) in starts.into_iter().zip(handles) {
        let want: Vec<i64> = all.iter().copied().filter(|&o| o >= start).collect();
        assert_eq!(h.join().unwrap(), want, "the read from {start}");
    }
}

#[test]
fn in_a_shared_fetch_one_partition_s_error_is_its_own() {
    // Two partitions of one broker in the same Fetches; from offset 200 on
    // t-1 is out of range (truncated behind its store), t-0 restores in full.
    use crate::restore::engine::{restore_many, RestoreSpec};
    use crate::restore::ErrorKind;
    let logs: Vec<Log> = (0..2).map(|p| partition_log(p, 100)).collect();
    let end = logs[0].end;
    let (addrs, script) = cluster_of(1, logs, Mode::Good, 100);
    {
        let mut sc = script.lock().unwrap();
        sc.partition_errors = vec![(1, 1, 200)];
        sc.fetch_time = Duration::from_millis(2);
    }
    let dir = tempfile::tempdir().unwrap();
    let specs = (0..2).map(|p| (RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p), None)).collect::<Vec<_>>();
    let out = restore_many(&super::client::KafkaLog(client(&addrs[0], Duration::from_secs(5))), specs, 2);
    let o = out[0].as_ref().unwrap();
    assert_eq!(o.end_offset, end);
    let store = crate::store::Store::open(&dir.path().join("s0"), false).unwrap();
    assert_eq!(crate::restore::testing::dump(&store), partition_store(0, end));
    let e = out[1].as_ref().unwrap_err();
    assert_eq!((e.kind, e.topic.as_deref(), e.partition), (ErrorKind::OutOfRange, Some("t"), Some(1)), "{e}");
    assert!(e.message.contains(&addrs[0]) && e.message.contains("offset 202 of t-1 is out of range"), "{e}");
    let sc = script.lock().unwrap();
    assert!(sc.fetched.iter().any(|f| f.2.len() == 2), "t-0 and t-1 were never fetched together");
}

#[test]
fn the_synthetic_producer_retries_its_first_batch_while_the_partition_has_no_leader() {
    // A topic just created: its leader answers NOT_LEADER_OR_FOLLOWER for a
    // moment. The first batch is retried alone; the rest follow it, in order.
    use crate::log::synthetic::{self, Synthetic};
    let (addrs, script) = cluster(1, Log::default(), Mode::Good, 1 << 20);
    script.lock().unwrap().errors.extend([(ApiKey::Produce, 6), (ApiKey::Produce, 6)]);
    let spec = Synthetic { records: 30_000, keys: 10_000, value_size: 100, seed: 3 };
    let written = super::produce::produce_synthetic(&client(&addrs[0], Duration::from_secs(5)), "t", 0, &spec, -1);
    assert_eq!(written.unwrap(), 30_000);
    let sc = script.lock().unwrap();
    assert!(sc.produced.len() > 3, "several batches: {}", sc.produced.len());
    assert_eq!(sc.asked(ApiKey::Produce).len(), sc.produced.len() + 2, "the first batch was sent three times");
    let mut want = Vec::new();
    synthetic::for_each_record(&spec, |_, k, _| {
        want.push(k.to_vec());
        Ok::<(), ()>(())
    })
    .unwrap();
    let mut got = Vec::new();
    for batch in &sc.produced {
        let h = codec::BatchHeader::parse(batch).unwrap();
        let mut scratch = Vec::new();
        for r in codec::batch_records(&h, batch, &mut scratch).unwrap() {
            got.push(r.unwrap().key.unwrap().to_vec());
        }
    }
    assert_eq!(got, want, "every record once, in the generator's order");
}

#[test]
fn a_job_of_stores_kept_open_a_few_records_behind_fetches_them_in_one_fetch_per_broker() {
    // 16 partitions, 8 led by each of 2 nodes, kept open between two rounds
    // on one thread (the state updater's standbys): the first round stops
    // 10 records short of the end, the second reads those 10. Each store's
    // offset is known before the second job starts, so its partitions are
    // primed at its start: one Fetch per node names all 8 of its partitions
    // (one after another, at each restore's turn, they took a Fetch or two
    // each).
    use crate::restore::engine::{restore_many, RestoreSpec};
    use crate::restore::open_stores::OpenStores;
    let leaders: Vec<i32> = (0..16).map(|p| 1 + p % 2).collect();
    let logs: Vec<Log> = (0..16).map(|p| partition_log(p, 4)).collect();
    let end = logs[0].end;
    let (addrs, script) = cluster_of(2, logs, Mode::Good, 1 << 20);
    script.lock().unwrap().leaders = leaders.clone();
    let log = super::client::KafkaLog(client(&addrs.join(","), Duration::from_secs(5)));
    let dir = tempfile::tempdir().unwrap();
    let kept = Arc::new(OpenStores::new(64 << 20));
    let round = |end_offset: Option<i64>| {
        let specs = (0..16)
            .map(|p| {
                let mut spec = RestoreSpec::new(dir.path().join(format!("s{p}")), "t", p);
                spec.kept_open = Some(kept.clone());
                spec.end_offset = end_offset;
                (spec, None)
            })
            .collect();
        for (p, o) in restore_many(&log, specs, 1).into_iter().enumerate() {
            let o = o.unwrap_or_else(|e| panic!("t-{p}: {e}"));
            assert_eq!(o.end_offset, end_offset.unwrap_or(end), "t-{p}");
        }
    };
    round(Some(end - 10));
    let before = script.lock().unwrap().fetched.len();
    round(None);
    let fetched = script.lock().unwrap().fetched[before..].to_vec();
    for node in [1, 2] {
        let fetches: Vec<&Vec<i32>> = fetched.iter().filter(|f| f.0 == node).map(|f| &f.2).collect();
        let led: Vec<i32> = (0..16).filter(|&p| leaders[p as usize] == node).collect();
        assert_eq!(fetches.len(), 1, "node {node}: {fetches:?}");
        let mut named = fetches[0].clone();
        named.sort_unstable();
        assert_eq!(named, led, "node {node}");
    }
    // Nothing new: no restore starts below the end, none is primed, nothing is fetched.
    let before = script.lock().unwrap().fetched.len();
    round(None);
    assert_eq!(script.lock().unwrap().fetched.len(), before);
    kept.close_all().unwrap();
    for p in 0..16 {
        let store = crate::store::Store::open(&dir.path().join(format!("s{p}")), false).unwrap();
        assert_eq!(crate::restore::testing::dump(&store), partition_store(p, end), "t-{p}");
    }
}

/// What the cluster did not answer is `Unavailable` (an application waits it out within its
/// `task_timeout`); what it answered wrongly, or refused, is not.
#[test]
fn only_a_cluster_that_gave_no_answer_is_unavailable() {
    use crate::source::{LogError, LogErrorKind};
    let kind = |e: KafkaError| LogError::from(e).kind;
    for e in [
        KafkaError::Timeout("broker b:1: no answer within 30 s".into()),
        KafkaError::Io("broker b:1: cannot connect: Connection refused".into()),
        KafkaError::Broker { code: 6, message: "NOT_LEADER_OR_FOLLOWER".into() },
        KafkaError::Broker { code: 78, message: "OFFSET_NOT_AVAILABLE".into() },
    ] {
        assert_eq!(kind(e), LogErrorKind::Unavailable);
    }
    for e in [
        KafkaError::Broker { code: 29, message: "TOPIC_AUTHORIZATION_FAILED".into() },
        KafkaError::Protocol("wrong correlation id".into()),
        KafkaError::Auth("SASL failed".into()),
        KafkaError::NoTopic("no topic t".into()),
        KafkaError::Config("no such file".into()),
    ] {
        assert_eq!(kind(e), LogErrorKind::Other);
    }
    assert_eq!(kind(KafkaError::Corrupt("bad crc".into())), LogErrorKind::Corrupt);
    assert_eq!(kind(KafkaError::OutOfRange("offset 9".into())), LogErrorKind::OutOfRange);
}
