//! A cluster as a restore sees it: which broker leads each changelog
//! partition and in which leader epoch (Metadata, refreshed when a broker
//! says it no longer leads), the partition's offsets (ListOffsets), and a
//! small pool of authenticated connections per broker, so chunked restores
//! and standby updates do not reconnect (and re-authenticate) for every
//! chunk. A pooled connection idle for `connections.max.idle.ms` (9 minutes
//! by default, below the broker's 10) or closed by the broker is dropped,
//! not reused. Each client tries the bootstrap servers in an order of its
//! own (shuffled, so that clients spread over them) and a broker that just
//! failed to connect last, for [`FAILED_BROKER_MEMORY`].
//!
//! Every call is bounded: retriable failures (a broken connection, the
//! errors of a leader election -- `NOT_LEADER_OR_FOLLOWER`,
//! `LEADER_NOT_AVAILABLE`, `REPLICA_NOT_AVAILABLE`, `OFFSET_NOT_AVAILABLE`,
//! a fenced or unknown leader epoch --, `UNKNOWN_SERVER_ERROR`, and
//! `UNKNOWN_TOPIC_OR_PARTITION`, also for the whole topic in Metadata, while
//! a topic is being created) are retried after a metadata refresh until the
//! request timeout, then reported with the broker, topic and partition. A
//! throttle the broker asks for (`throttle_time_ms`) is waited out before
//! the next request on that connection.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::config::ClientConfig;
use super::conn::{self, Conn};
use super::fetch::KafkaSource;
use super::frames::FramePool;
use super::session::FetchSession;
use super::KafkaError;
use crate::source::{Bounds, Changelog, ChangelogSource, JobPart, LogError};

/// Idle connections kept per broker.
const POOL_PER_BROKER: usize = 8;
/// First pause between two tries; doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a broker that could not be reached is tried after the others.
pub const FAILED_BROKER_MEMORY: Duration = Duration::from_secs(30);

/// The leader of a partition, as Metadata (or a broker's hint) last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// `host:port`
    pub broker: String,
    /// Its leader epoch, sent with every Fetch and ListOffsets so that a
    /// former leader answers `FENCED_LEADER_EPOCH` instead of serving as a
    /// follower (-1: the broker named none).
    pub epoch: i32,
}

#[derive(Default)]
struct State {
    /// node id -> `host:port`
    brokers: HashMap<i32, String>,
    /// (topic, partition) -> (leader node id, leader epoch)
    leaders: HashMap<(String, i32), (i32, i32)>,
    /// `host:port` -> idle connections, the most recently used last
    idle: HashMap<String, Vec<Conn>>,
    /// `host:port` -> when connecting to it last failed
    failed: HashMap<String, Instant>,
    /// topic -> its id, as Metadata (v10+) last named it (absent: none named)
    topic_ids: HashMap<String, Uuid>,
    /// (topic, partition) -> the topic id this client last read the
    /// partition under: a read that goes on from a store's offset must find
    /// the same id, or the topic was deleted and recreated meanwhile
    read_ids: HashMap<(String, i32), Uuid>,
    /// (topic, partition) -> its log start offset, as ListOffsets last said
    log_starts: HashMap<(String, i32), i64>,
}

/// A Kafka cluster for restores. Shared by every restore of a changelog (`Arc`).
pub struct KafkaClient {
    pub config: ClientConfig,
    /// The bootstrap servers in this client's order (shuffled).
    bootstrap: Vec<String>,
    state: Mutex<State>,
    /// Buffers for large responses, shared by the connections.
    pub frames: FramePool,
}

/// `items` in a random order (Fisher-Yates over a randomly seeded xorshift:
/// spreading clients over servers needs no better randomness).
fn shuffled(mut items: Vec<String>) -> Vec<String> {
    let mut h = RandomState::new().build_hasher();
    h.write_usize(items.len());
    let mut x = h.finish() | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        items.swap(i, (x % (i as u64 + 1)) as usize);
    }
    items
}

impl KafkaClient {
    pub fn new(config: ClientConfig) -> Arc<Self> {
        let bootstrap = shuffled(config.bootstrap.clone());
        Arc::new(KafkaClient { config, bootstrap, state: Mutex::new(State::default()), frames: FramePool::default() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bootstrap list, for messages.
    pub fn servers(&self) -> String {
        self.config.bootstrap_servers()
    }

    /// The bootstrap servers in the order this client tries them.
    pub fn bootstrap_order(&self) -> &[String] {
        &self.bootstrap
    }

    /// An idle connection to `broker` that is still good: one idle too long
    /// or closed by the broker is dropped (closed) instead.
    fn pooled(&self, broker: &str) -> Option<Conn> {
        let max_idle = self.config.connections_max_idle;
        loop {
            let c = self.state().idle.get_mut(broker).and_then(Vec::pop)?;
            if c.idle_for() < max_idle && c.looks_alive() {
                return Some(c);
            }
        }
    }

    /// A new connection to `broker`; a broker that cannot be reached is
    /// remembered, and tried last for a while.
    fn connect(&self, broker: &str) -> Result<Conn, KafkaError> {
        match Conn::connect(broker, &self.config, self.frames.clone()) {
            Ok(c) => {
                self.state().failed.remove(broker);
                Ok(c)
            }
            Err(e) => {
                if e.retriable() {
                    self.state().failed.insert(broker.to_string(), Instant::now());
                }
                Err(e)
            }
        }
    }

    /// A connection to `broker`: an idle one, else a new one.
    pub fn checkout(&self, broker: &str) -> Result<Conn, KafkaError> {
        match self.pooled(broker) {
            Some(c) => Ok(c),
            None => self.connect(broker),
        }
    }

    /// `broker` did not answer within an attempt's timeout (paused, black-holed,
    /// overloaded): its idle connections would not answer either, so they are
    /// closed, and it is asked for metadata after the others for a while. The
    /// caller refreshes metadata and tries the partition's leader again, as
    /// Kafka's clients disconnect a broker whose request timed out.
    pub fn unresponsive(&self, broker: &str) {
        let mut st = self.state();
        st.idle.remove(broker);
        st.failed.insert(broker.to_string(), Instant::now());
    }

    /// Note what an attempt at `broker` that failed with `e` says about it.
    pub fn failed_at(&self, broker: &str, e: &KafkaError) {
        if matches!(e, KafkaError::Timeout(_)) {
            self.unresponsive(broker);
        }
    }

    /// Give back a connection with no request in flight.
    pub fn checkin(&self, conn: Conn) {
        let max_idle = self.config.connections_max_idle;
        let mut st = self.state();
        let idle = st.idle.entry(conn.broker.clone()).or_default();
        idle.retain(|c| c.idle_for() < max_idle);
        if idle.len() < POOL_PER_BROKER {
            idle.push(conn);
        }
    }

    /// Brokers to ask for metadata, in order: the bootstrap servers (in this
    /// client's order), then the brokers metadata named; those that failed
    /// within [`FAILED_BROKER_MEMORY`] last, the longest ago first.
    fn candidates(&self) -> Vec<String> {
        let st = self.state();
        let mut all: Vec<String> = self.bootstrap.clone();
        let mut known: Vec<&String> = st.brokers.values().filter(|b| !all.contains(b)).collect();
        known.sort();
        known.dedup();
        all.extend(known.into_iter().cloned());
        let now = Instant::now();
        let failed_at =
            |b: &String| st.failed.get(b).copied().filter(|t| now.duration_since(*t) < FAILED_BROKER_MEMORY);
        let (mut bad, good): (Vec<String>, Vec<String>) = all.into_iter().partition(|b| failed_at(b).is_some());
        bad.sort_by_key(|b| failed_at(b));
        good.into_iter().chain(bad).collect()
    }

    /// Any connection: a pooled one, else to the first server that answers.
    fn any_conn(&self) -> Result<Conn, KafkaError> {
        let pooled: Vec<String> =
            self.state().idle.iter().filter(|(_, v)| !v.is_empty()).map(|(b, _)| b.clone()).collect();
        for b in pooled {
            if let Some(c) = self.pooled(&b) {
                return Ok(c);
            }
        }
        let mut last = None;
        for b in self.candidates() {
            match self.connect(&b) {
                Ok(c) => return Ok(c),
                Err(e) if e.retriable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| KafkaError::Config("no bootstrap server".into())))
    }

    /// Whether this client's TLS setup is one rustls refuses: the reason,
    /// from a connection to the first bootstrap server that accepts one
    /// (then pooled for the first request), or `None` when one was set up,
    /// when TLS is off, or when no server answered within an attempt's
    /// timeout (the requests will tell). The restore falls back to
    /// confluent-kafka (OpenSSL) on a reason.
    pub fn tls_refused(&self) -> Option<String> {
        if !self.config.protocol.tls() {
            return None;
        }
        let deadline = Instant::now() + self.config.attempt_timeout;
        for b in self.candidates() {
            match self.connect(&b) {
                Ok(c) => {
                    self.checkin(c);
                    return None;
                }
                Err(KafkaError::TlsRefused(why)) => return Some(why),
                Err(e) if e.retriable() && Instant::now() < deadline => continue,
                Err(_) => return None,
            }
        }
        None
    }

    /// Ask the cluster who leads the partitions of `topic`, in which epoch.
    pub fn refresh_metadata(&self, topic: &str) -> Result<(), KafkaError> {
        let mut c = self.any_conn()?;
        c.within(None);
        let v = c.version::<MetadataRequest>(12)?;
        let req = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))
            ]))
            .with_allow_auto_topic_creation(false);
        let resp = match c.call(&req, v) {
            Ok(r) => r,
            Err(e) => {
                self.failed_at(&c.broker, &e);
                return Err(e);
            }
        };
        c.throttle(resp.throttle_time_ms);
        let broker = c.broker.clone();
        self.checkin(c);
        let mut st = self.state();
        for b in &resp.brokers {
            st.brokers.insert(b.node_id.0, format!("{}:{}", b.host.as_str(), b.port));
        }
        for t in &resp.topics {
            let name = t.name.as_ref().map(|n| n.0.as_str().to_string()).unwrap_or_default();
            if name != topic {
                continue;
            }
            if t.error_code == 3 {
                // Retried until the request timeout: a topic being created
                // is unknown to a broker for a moment.
                return Err(KafkaError::NoTopic(format!(
                    "broker {broker}: topic {topic} does not exist (UNKNOWN_TOPIC_OR_PARTITION)"
                )));
            }
            if t.error_code != 0 {
                let e = conn::error_name(t.error_code);
                return Err(KafkaError::Broker {
                    code: t.error_code,
                    message: format!("broker {broker}: metadata of topic {topic}: {e} ({})", t.error_code),
                });
            }
            if t.topic_id.is_nil() {
                st.topic_ids.remove(topic);
            } else {
                st.topic_ids.insert(topic.to_string(), t.topic_id);
            }
            for p in &t.partitions {
                if p.error_code == 0 && p.leader_id.0 >= 0 {
                    st.leaders.insert((topic.to_string(), p.partition_index), (p.leader_id.0, p.leader_epoch));
                } else {
                    st.leaders.remove(&(topic.to_string(), p.partition_index));
                }
            }
        }
        Ok(())
    }

    /// The id of `topic` as Metadata last named it (None: not known, or a
    /// broker older than Kafka 2.8).
    pub fn topic_id(&self, topic: &str) -> Option<Uuid> {
        self.state().topic_ids.get(topic).copied()
    }

    /// The topic id a read of `topic-partition` from `start` must find:
    /// `held`, the one the store's records were read under, if its reader
    /// knows it, else the one this client last read the partition under;
    /// none when the read starts at the partition's log start (a store
    /// restored from scratch, which takes the topic as it is now). `None`:
    /// nothing to hold it to.
    pub fn expected_topic_id(&self, topic: &str, partition: i32, start: i64, held: Option<Uuid>) -> Option<Uuid> {
        let st = self.state();
        let key = (topic.to_string(), partition);
        let from_scratch = start <= 0 || st.log_starts.get(&key).is_some_and(|s| start <= *s);
        if from_scratch {
            None
        } else {
            held.or_else(|| st.read_ids.get(&key).copied())
        }
    }

    /// Remember that `topic-partition` was read under topic id `id`.
    pub fn read_under(&self, topic: &str, partition: i32, id: Uuid) {
        self.state().read_ids.insert((topic.to_string(), partition), id);
    }

    /// Forget the leader of a partition (it said it no longer leads, or its connection broke).
    pub fn invalidate(&self, topic: &str, partition: i32) {
        self.state().leaders.remove(&(topic.to_string(), partition));
    }

    /// Take a broker's word (KIP-951's `current_leader` in a Fetch
    /// response) that node `leader_id` leads `topic-partition` in `epoch`:
    /// used if the node's address is known and the epoch is newer than the
    /// one known (so that two brokers cannot send a fetch back and forth).
    /// Returns whether it was taken (no metadata refresh is needed then).
    pub fn hint_leader(&self, topic: &str, partition: i32, leader_id: i32, epoch: i32) -> bool {
        let mut st = self.state();
        if leader_id < 0 || epoch < 0 || !st.brokers.contains_key(&leader_id) {
            return false;
        }
        let key = (topic.to_string(), partition);
        if st.leaders.get(&key).is_some_and(|&(_, known)| known >= epoch) {
            return false;
        }
        st.leaders.insert(key, (leader_id, epoch));
        true
    }

    /// The leader of `topic-partition` as last known, without asking.
    pub fn cached_leader(&self, topic: &str, partition: i32) -> Option<Leader> {
        let st = self.state();
        let &(id, epoch) = st.leaders.get(&(topic.to_string(), partition))?;
        st.brokers.get(&id).map(|b| Leader { broker: b.clone(), epoch })
    }

    /// The leader of `topic-partition`, from the cache or a metadata refresh.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<Leader, KafkaError> {
        if let Some(l) = self.cached_leader(topic, partition) {
            return Ok(l);
        }
        self.refresh_metadata(topic)?;
        self.cached_leader(topic, partition).ok_or_else(|| KafkaError::Broker {
            code: 3,
            message: format!(
                "cluster {}: partition {topic}-{partition} has no leader (UNKNOWN_TOPIC_OR_PARTITION or \
                 LEADER_NOT_AVAILABLE); does the topic exist?",
                self.servers()
            ),
        })
    }

    /// Run `f` on a connection to the leader of `topic-partition` (with the
    /// leader's epoch), retrying retriable failures after a metadata refresh
    /// until `deadline`, or until `patience` once a broker left an attempt
    /// unanswered (a leader paused or cut off: what follows, an election,
    /// takes the cluster its own time; a refused connection keeps the
    /// deadline, so a wrong address fails fast). Each attempt waits at most
    /// an attempt's timeout for an answer; a leader that gave none is tried
    /// after the other brokers (its idle connections closed), so the refresh
    /// asks one that answers.
    pub fn with_leader<T>(
        &self,
        topic: &str,
        partition: i32,
        deadline: Instant,
        patience: Instant,
        mut f: impl FnMut(&mut Conn, i32) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaError> {
        let mut backoff = FIRST_BACKOFF;
        let mut until = deadline;
        loop {
            let r = self.leader(topic, partition).and_then(|l| {
                let mut c = self.checkout(&l.broker)?;
                c.within(Some(until));
                let r = f(&mut c, l.epoch);
                match &r {
                    Ok(_) | Err(KafkaError::Broker { .. } | KafkaError::OutOfRange(_)) => {
                        c.within(None);
                        self.checkin(c); // the connection is in step: keep it
                    }
                    Err(e) => self.failed_at(&l.broker, e),
                }
                r
            });
            if let Err(KafkaError::Timeout(_)) = &r {
                until = until.max(patience);
            }
            match r {
                Err(e) if e.retriable() && Instant::now() + backoff < until => {
                    self.invalidate(topic, partition);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                r => return r,
            }
        }
    }

    /// One ListOffsets answer: the offset for `timestamp` (-2 earliest, -1 latest) under `isolation`.
    fn list_offset(
        &self,
        c: &mut Conn,
        topic: &str,
        partition: i32,
        epoch: i32,
        timestamp: i64,
        isolation: i8,
    ) -> Result<i64, KafkaError> {
        let answers = self.list_offsets(c, &[(topic, partition, epoch)], timestamp, isolation)?;
        let &(code, offset) = answers.get(&(topic.to_string(), partition)).ok_or_else(|| {
            KafkaError::Protocol(format!("broker {}: ListOffsets answered without {topic}-{partition}", c.broker))
        })?;
        if code != 0 {
            return Err(c.broker_error(&format!("ListOffsets of {topic}-{partition}"), code, None));
        }
        Ok(offset)
    }

    /// One ListOffsets request for every `(topic, partition, leader epoch)`
    /// of `parts` (all led by the connection's broker): `(error code,
    /// offset)` of each partition the broker answered, by `(topic, partition)`.
    fn list_offsets(
        &self,
        c: &mut Conn,
        parts: &[(&str, i32, i32)],
        timestamp: i64,
        isolation: i8,
    ) -> Result<ListedOffsets, KafkaError> {
        let v = c.version::<ListOffsetsRequest>(8)?;
        let mut topics: Vec<ListOffsetsTopic> = Vec::new();
        for &(topic, partition, epoch) in parts {
            let asked = ListOffsetsPartition::default()
                .with_partition_index(partition)
                .with_current_leader_epoch(epoch)
                .with_timestamp(timestamp);
            match topics.iter_mut().find(|t| t.name.0.as_str() == topic) {
                Some(t) => t.partitions.push(asked),
                None => topics.push(
                    ListOffsetsTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(vec![asked]),
                ),
            }
        }
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation)
            .with_topics(topics);
        let resp = c.call(&req, v)?;
        c.throttle(resp.throttle_time_ms);
        Ok(resp
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| ((t.name.0.to_string(), p.partition_index), (p.error_code, p.offset)))
            })
            .collect())
    }

    /// The bounds ListOffsets' three answers make (the last stable offset
    /// within `[start, end]`), remembering the log start.
    fn bounds_of(&self, topic: &str, partition: i32, start: i64, end: i64, lso: i64) -> Bounds {
        self.state().log_starts.insert((topic.to_string(), partition), start);
        Bounds { start, end, last_stable: lso.max(start).min(end) }
    }

    /// [`Self::restore_offsets`] of many partitions at once, as the Java
    /// consumer asks for a restore's end offsets: three ListOffsets requests
    /// to each leader (earliest, latest, last stable), each naming every
    /// partition of `parts` it leads, instead of three per partition (100
    /// standby partitions' bounds took 40-50 ms a round on one broker), all
    /// leaders at once. Best effort, never retried, and within
    /// [`BOUNDS_AHEAD_BUDGET`] (or an attempt's timeout, if shorter), so
    /// that a leader that does not answer holds the job up no longer: a
    /// partition whose leader is
    /// unknown (its topic's other partitions are not looked up again), that
    /// its broker answered with an error, or whose broker failed or was not
    /// asked in time, is left out, and its restore reads its own bounds with
    /// the usual retries.
    pub fn offsets_many(&self, parts: &[(String, i32)]) -> HashMap<(String, i32), Bounds> {
        let deadline = Instant::now() + BOUNDS_AHEAD_BUDGET.min(self.config.attempt_timeout);
        let mut by_leader: HashMap<String, Vec<(&str, i32, i32)>> = HashMap::new();
        let mut unknown: Vec<&str> = Vec::new();
        for (topic, partition) in parts {
            if Instant::now() >= deadline {
                break; // a metadata lookup took the budget: the restores look up the rest
            }
            if unknown.contains(&topic.as_str()) {
                continue;
            }
            match self.leader(topic, *partition) {
                Ok(l) => by_leader.entry(l.broker).or_default().push((topic, *partition, l.epoch)),
                Err(_) => unknown.push(topic),
            }
        }
        // Every leader at once, each within the same deadline.
        std::thread::scope(|s| {
            let asked: Vec<_> = by_leader
                .iter()
                .map(|(broker, led)| s.spawn(move || self.leader_offsets(broker, led, deadline)))
                .collect();
            asked.into_iter().filter_map(|a| a.join().ok()).flatten().collect()
        })
    }

    /// [`Self::offsets_many`] of the partitions `led` by `broker`: those it
    /// answered without error by `deadline`.
    fn leader_offsets(
        &self,
        broker: &str,
        led: &[(&str, i32, i32)],
        deadline: Instant,
    ) -> Vec<((String, i32), Bounds)> {
        let Ok(mut c) = self.checkout(broker) else { return Vec::new() };
        c.within(Some(deadline));
        let mut ask = |timestamp, isolation| self.list_offsets(&mut c, led, timestamp, isolation);
        let answers = ask(-2, 0).and_then(|starts| Ok([starts, ask(-1, 0)?, ask(-1, 1)?]));
        let [starts, ends, stables] = match answers {
            Ok(answers) => answers,
            Err(KafkaError::Broker { .. } | KafkaError::OutOfRange(_)) => {
                c.within(None);
                self.checkin(c); // the connection is in step: keep it
                return Vec::new();
            }
            // Out of step (a request may still be answered): closed. Not held
            // against the broker: this budget is shorter than an attempt's,
            // and the restores' own attempts judge it.
            Err(_) => return Vec::new(),
        };
        c.within(None);
        self.checkin(c);
        led.iter()
            .filter_map(|&(topic, partition, _)| {
                let key = (topic.to_string(), partition);
                match (starts.get(&key), ends.get(&key), stables.get(&key)) {
                    (Some(&(0, start)), Some(&(0, end)), Some(&(0, lso))) => {
                        Some((key, self.bounds_of(topic, partition, start, end, lso)))
                    }
                    _ => None,
                }
            })
            .collect()
    }

    /// `(start, end, last_stable)` of `topic-partition`: earliest, latest, and
    /// latest under read_committed (the last stable offset).
    pub fn offsets(&self, topic: &str, partition: i32) -> Result<Bounds, KafkaError> {
        self.offsets_within(topic, partition, self.config.request_timeout)
    }

    /// [`Self::offsets`] of a partition a restore starts on: a leader that
    /// stops answering is waited out within the restore's stall timeout, as
    /// the restore's fetches wait for it (a leader paused past the request
    /// timeout failed the restore before its first fetch); an unknown topic
    /// or a refused connection still fails within the request timeout.
    pub fn restore_offsets(&self, topic: &str, partition: i32) -> Result<Bounds, KafkaError> {
        self.offsets_within(topic, partition, self.config.stall_timeout.max(self.config.request_timeout))
    }

    fn offsets_within(&self, topic: &str, partition: i32, patience: Duration) -> Result<Bounds, KafkaError> {
        let now = Instant::now();
        let deadline = now + self.config.request_timeout;
        self.with_leader(topic, partition, deadline, now + patience, |c, epoch| {
            let start = self.list_offset(c, topic, partition, epoch, -2, 0)?;
            let end = self.list_offset(c, topic, partition, epoch, -1, 0)?;
            let lso = self.list_offset(c, topic, partition, epoch, -1, 1)?;
            Ok(self.bounds_of(topic, partition, start, end, lso))
        })
        .map_err(|e| {
            e.context(&format!(
                "changelog {topic}-{partition} on {}: cannot read its offsets (does the topic exist and is the \
                 broker reachable?)",
                self.servers()
            ))
        })
    }
}

/// Longest [`KafkaClient::offsets_many`] takes for all the leaders it asks:
/// a job waits for it before its first restore.
pub const BOUNDS_AHEAD_BUDGET: Duration = Duration::from_secs(1);

/// A ListOffsets answer: `(error code, offset)` of each partition, by `(topic, partition)`.
type ListedOffsets = HashMap<(String, i32), (i16, i64)>;

/// A [`KafkaClient`] as the restore engine's changelog.
#[derive(Clone)]
pub struct KafkaLog(pub Arc<KafkaClient>);

impl Changelog for KafkaLog {
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
        Ok(self.0.restore_offsets(topic, partition)?)
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
        self.open_held(topic, partition, start, None)
    }

    fn open_held(
        &self,
        topic: &str,
        partition: i32,
        start: i64,
        held: Option<[u8; 16]>,
    ) -> Result<Box<dyn ChangelogSource>, LogError> {
        Ok(Box::new(KafkaSource::new(self.0.clone(), topic, partition, start, held.map(Uuid::from_bytes))))
    }

    fn buffered_bytes(&self) -> usize {
        super::fetch::RESPONSES_HELD * self.0.config.partition_max_bytes as usize
    }

    fn for_job(&self) -> Option<Box<dyn Changelog + Send>> {
        Some(Box::new(SessionLog::new(self.0.clone())))
    }
}

/// A [`KafkaClient`] as the changelog of the restores of one job: they
/// share one [`FetchSession`] (a fetch thread, a connection and one Fetch
/// at a time per broker), and what is read for the whole job at its start
/// ([`Changelog::read_ahead`]). Clones share both; the session ends with the
/// last.
#[derive(Clone)]
pub struct SessionLog(pub Arc<FetchSession>, Arc<Mutex<ReadAhead>>);

/// What a job read at its start: when, each partition's bounds, and the
/// partitions primed then, with the offset each was primed at.
#[derive(Default)]
struct ReadAhead {
    read_at: Option<Instant>,
    bounds: HashMap<(String, i32), Bounds>,
    primed: HashMap<(String, i32), (i64, KafkaSource)>,
}

impl ReadAhead {
    /// Whether what was read stands for a restore starting now.
    fn fresh(&self) -> bool {
        self.read_at.is_some_and(|t| t.elapsed() < BOUNDS_AHEAD_FOR)
    }
}

/// How long what was read ahead for a job stands for the restores that
/// start after it: a restore of a long job that starts later reads its own
/// bounds, so that it ends near the log's end as it then is, as it would
/// alone, and fetches on its own.
pub const BOUNDS_AHEAD_FOR: Duration = Duration::from_secs(5);

/// A partition whose restore starts at a known offset at most this many
/// offsets below the last stable offset is primed at its job's start
/// ([`Changelog::read_ahead`]): a standby's round, the last records of a
/// task restored in rounds. Primed together, the job's partitions share one
/// Fetch per broker instead of one each, one after another, at their turn.
pub const PRIME_AHEAD_OFFSETS: i64 = 1_000;

/// Most partitions a job primes at its start: each holds its first
/// response (64 KiB asked for) until its restore's turn, 32 MiB at most in
/// all unless single batches are larger.
pub const PRIME_AHEAD_MAX: usize = 512;

impl SessionLog {
    pub fn new(client: Arc<KafkaClient>) -> Self {
        SessionLog(FetchSession::new(client), Arc::default())
    }

    fn ahead(&self) -> MutexGuard<'_, ReadAhead> {
        self.1.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Changelog for SessionLog {
    /// The bounds read ahead for the job, each taken once while they stand
    /// ([`BOUNDS_AHEAD_FOR`]); else the partition's own.
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
        let ahead = {
            let mut a = self.ahead();
            let fresh = a.fresh();
            a.bounds.remove(&(topic.to_string(), partition)).filter(|_| fresh)
        };
        match ahead {
            Some(b) => Ok(b),
            None => Ok(self.0.client().restore_offsets(topic, partition)?),
        }
    }

    /// The bounds of every partition of the job in three ListOffsets
    /// requests per broker ([`KafkaClient::offsets_many`]); then the
    /// partitions whose restore starts at a known offset at most
    /// [`PRIME_AHEAD_OFFSETS`] below the last stable offset are primed (at
    /// most [`PRIME_AHEAD_MAX`]), so that their first records come in one
    /// Fetch per broker.
    fn read_ahead(&self, parts: &[JobPart]) {
        let tps: Vec<(String, i32)> = parts.iter().map(|p| (p.topic.clone(), p.partition)).collect();
        let bounds = self.0.client().offsets_many(&tps);
        let mut primed = HashMap::new();
        let together = self.0.priming();
        for p in parts {
            let key = (p.topic.clone(), p.partition);
            let (Some(start), Some(b)) = (p.start, bounds.get(&key)) else { continue };
            if primed.len() < PRIME_AHEAD_MAX
                && b.start <= start
                && start < b.last_stable
                && b.last_stable - start <= PRIME_AHEAD_OFFSETS
            {
                let mut source = KafkaSource::in_session(&self.0, &p.topic, p.partition, start, None);
                source.cursor().prime_ahead(b.last_stable);
                primed.insert(key, (start, source));
            }
        }
        drop(together);
        let stale = std::mem::replace(&mut *self.ahead(), ReadAhead { read_at: Some(Instant::now()), bounds, primed });
        drop(stale); // its primed partitions leave the session (outside the lock)
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
        self.open_held(topic, partition, start, None)
    }

    /// The partition primed at the job's start when it was primed at
    /// `start` and still stands ([`BOUNDS_AHEAD_FOR`]) and no topic id is
    /// `held` (priming is for stores kept open, which their reader holds to
    /// none); else a new one of the job's fetch session.
    fn open_held(
        &self,
        topic: &str,
        partition: i32,
        start: i64,
        held: Option<[u8; 16]>,
    ) -> Result<Box<dyn ChangelogSource>, LogError> {
        let (primed, fresh) = {
            let mut a = self.ahead();
            (a.primed.remove(&(topic.to_string(), partition)), a.fresh())
        };
        match primed {
            Some((at, source)) if fresh && at == start && held.is_none() => Ok(Box::new(source)),
            _ => Ok(Box::new(KafkaSource::in_session(&self.0, topic, partition, start, held.map(Uuid::from_bytes)))),
        }
    }

    /// A partition's queued responses and the one its restore reads.
    fn buffered_bytes(&self) -> usize {
        (super::session::QUEUED + 1) * self.0.client().config.partition_max_bytes as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_read_ahead_are_taken_once_and_only_while_they_stand() {
        // No broker: whatever is not taken from the bounds read ahead fails.
        let config =
            ClientConfig::parse([("bootstrap.servers", "127.0.0.1:1")], Duration::from_millis(300), Duration::ZERO)
                .unwrap();
        let log = SessionLog::new(KafkaClient::new(config));
        let b = Bounds { start: 0, end: 10, last_stable: 9 };
        let read_ahead = |at: Instant| {
            let bounds = HashMap::from([(("t".to_string(), 0), b), (("t".to_string(), 1), b)]);
            *log.ahead() = ReadAhead { read_at: Some(at), bounds, ..ReadAhead::default() };
        };
        read_ahead(Instant::now());
        assert_eq!(log.bounds("t", 0).unwrap(), b);
        assert!(log.bounds("t", 0).is_err(), "taken once: a later restore of it reads its own");
        assert!(log.bounds("t", 2).is_err(), "not read ahead");
        read_ahead(Instant::now() - BOUNDS_AHEAD_FOR);
        assert!(log.bounds("t", 1).is_err(), "read too long ago");
    }
}
