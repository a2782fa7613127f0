//! A cluster as a restore sees it: which broker leads each changelog
//! partition (Metadata, refreshed when a broker says it no longer leads), the
//! partition's offsets (ListOffsets), and a small pool of authenticated
//! connections per broker, so chunked restores and standby updates do not
//! reconnect (and re-authenticate) for every chunk.
//!
//! Every call is bounded: retriable failures (a broken connection, a leader
//! change, `UNKNOWN_TOPIC_OR_PARTITION` while a topic is being created) are
//! retried after a metadata refresh until the request timeout, then reported
//! with the broker, topic and partition.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::config::ClientConfig;
use super::conn::{self, Conn};
use super::fetch::KafkaSource;
use super::frames::FramePool;
use super::KafkaError;
use crate::source::{Bounds, Changelog, ChangelogSource, LogError};

/// Idle connections kept per broker.
const POOL_PER_BROKER: usize = 8;
/// First pause between two tries; doubles up to [`MAX_BACKOFF`].
pub const FIRST_BACKOFF: Duration = Duration::from_millis(50);
pub const MAX_BACKOFF: Duration = Duration::from_secs(1);

#[derive(Default)]
struct State {
    /// node id -> `host:port`
    brokers: HashMap<i32, String>,
    /// (topic, partition) -> leader node id
    leaders: HashMap<(String, i32), i32>,
    /// `host:port` -> idle connections
    idle: HashMap<String, Vec<Conn>>,
}

/// A Kafka cluster for restores. Shared by every restore of a changelog (`Arc`).
pub struct KafkaClient {
    pub config: ClientConfig,
    state: Mutex<State>,
    /// Buffers for large responses, shared by the connections.
    pub frames: FramePool,
}

impl KafkaClient {
    pub fn new(config: ClientConfig) -> Arc<Self> {
        Arc::new(KafkaClient { config, state: Mutex::new(State::default()), frames: FramePool::default() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bootstrap list, for messages.
    pub fn servers(&self) -> String {
        self.config.bootstrap_servers()
    }

    /// A connection to `broker`: an idle one, else a new one.
    pub fn checkout(&self, broker: &str) -> Result<Conn, KafkaError> {
        if let Some(c) = self.state().idle.get_mut(broker).and_then(Vec::pop) {
            return Ok(c);
        }
        Conn::connect(broker, &self.config, self.frames.clone())
    }

    /// Give back a connection with no request in flight.
    pub fn checkin(&self, conn: Conn) {
        let mut st = self.state();
        let idle = st.idle.entry(conn.broker.clone()).or_default();
        if idle.len() < POOL_PER_BROKER {
            idle.push(conn);
        }
    }

    /// Any connection: to a known broker, else to the first bootstrap server that answers.
    fn any_conn(&self) -> Result<Conn, KafkaError> {
        let known: Vec<String> = {
            let st = self.state();
            if let Some(c) = st.idle.iter().find(|(_, v)| !v.is_empty()).map(|(b, _)| b.clone()) {
                drop(st);
                return self.checkout(&c);
            }
            st.brokers.values().cloned().collect()
        };
        let mut last = None;
        for b in self.config.bootstrap.iter().chain(known.iter()) {
            match Conn::connect(b, &self.config, self.frames.clone()) {
                Ok(c) => return Ok(c),
                Err(e) if e.retriable() => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| KafkaError::Config("no bootstrap server".into())))
    }

    /// Ask the cluster who leads the partitions of `topic`.
    pub fn refresh_metadata(&self, topic: &str) -> Result<(), KafkaError> {
        let mut c = self.any_conn()?;
        let v = c.version::<MetadataRequest>(12)?;
        let req = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(topic.to_string()))))
            ]))
            .with_allow_auto_topic_creation(false);
        let resp = c.call(&req, v)?;
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
                return Err(KafkaError::NoTopic(format!("broker {broker}: topic {topic} does not exist")));
            }
            if t.error_code != 0 {
                let e = conn::error_name(t.error_code);
                return Err(KafkaError::Broker {
                    code: t.error_code,
                    message: format!("broker {broker}: metadata of topic {topic}: {e} ({})", t.error_code),
                });
            }
            for p in &t.partitions {
                if p.error_code == 0 && p.leader_id.0 >= 0 {
                    st.leaders.insert((topic.to_string(), p.partition_index), p.leader_id.0);
                } else {
                    st.leaders.remove(&(topic.to_string(), p.partition_index));
                }
            }
        }
        Ok(())
    }

    /// Forget the leader of a partition (it said it no longer leads, or its connection broke).
    pub fn invalidate(&self, topic: &str, partition: i32) {
        self.state().leaders.remove(&(topic.to_string(), partition));
    }

    /// `host:port` of the leader of `topic-partition`, from the cache or a metadata refresh.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<String, KafkaError> {
        let cached = {
            let st = self.state();
            st.leaders.get(&(topic.to_string(), partition)).and_then(|id| st.brokers.get(id).cloned())
        };
        if let Some(b) = cached {
            return Ok(b);
        }
        self.refresh_metadata(topic)?;
        let st = self.state();
        st.leaders.get(&(topic.to_string(), partition)).and_then(|id| st.brokers.get(id).cloned()).ok_or_else(|| {
            KafkaError::Broker {
                code: 3,
                message: format!(
                    "cluster {}: partition {topic}-{partition} has no leader (UNKNOWN_TOPIC_OR_PARTITION or \
                     LEADER_NOT_AVAILABLE); does the topic exist?",
                    self.servers()
                ),
            }
        })
    }

    /// Run `f` on a connection to the leader of `topic-partition`, retrying
    /// retriable failures after a metadata refresh until `deadline`.
    pub fn with_leader<T>(
        &self,
        topic: &str,
        partition: i32,
        deadline: Instant,
        mut f: impl FnMut(&mut Conn) -> Result<T, KafkaError>,
    ) -> Result<T, KafkaError> {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let r = self.leader(topic, partition).and_then(|b| {
                let mut c = self.checkout(&b)?;
                let r = f(&mut c);
                if r.as_ref().is_ok() || matches!(r, Err(KafkaError::Broker { .. } | KafkaError::OutOfRange(_))) {
                    self.checkin(c); // the connection is in step: keep it
                }
                r
            });
            match r {
                Err(e) if e.retriable() && Instant::now() + backoff < deadline => {
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
        timestamp: i64,
        isolation: i8,
    ) -> Result<i64, KafkaError> {
        let v = c.version::<ListOffsetsRequest>(8)?;
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_isolation_level(isolation)
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let resp = c.call(&req, v)?;
        let p = resp
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| {
                KafkaError::Protocol(format!("broker {}: ListOffsets answered without {topic}-{partition}", c.broker))
            })?;
        if p.error_code != 0 {
            return Err(c.broker_error(&format!("ListOffsets of {topic}-{partition}"), p.error_code, None));
        }
        Ok(p.offset)
    }

    /// `(start, end, last_stable)` of `topic-partition`: earliest, latest, and
    /// latest under read_committed (the last stable offset).
    pub fn offsets(&self, topic: &str, partition: i32) -> Result<Bounds, KafkaError> {
        let deadline = Instant::now() + self.config.request_timeout;
        self.with_leader(topic, partition, deadline, |c| {
            let start = self.list_offset(c, topic, partition, -2, 0)?;
            let end = self.list_offset(c, topic, partition, -1, 0)?;
            let lso = self.list_offset(c, topic, partition, -1, 1)?;
            Ok(Bounds { start, end, last_stable: lso.max(start).min(end) })
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

/// A [`KafkaClient`] as the restore engine's changelog.
#[derive(Clone)]
pub struct KafkaLog(pub Arc<KafkaClient>);

impl Changelog for KafkaLog {
    fn bounds(&self, topic: &str, partition: i32) -> Result<Bounds, LogError> {
        Ok(self.0.offsets(topic, partition)?)
    }

    fn open(&self, topic: &str, partition: i32, start: i64) -> Result<Box<dyn ChangelogSource>, LogError> {
        Ok(Box::new(KafkaSource::new(self.0.clone(), topic, partition, start)))
    }
}
