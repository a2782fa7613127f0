//! A producer for benchmarks and tests: a synthetic changelog
//! ([`crate::log::synthetic`]) written to one Kafka partition over Produce at
//! the speed the broker takes it -- batches built by the codec, up to
//! [`IN_FLIGHT`] requests on one connection -- where a Python loop over
//! confluent-kafka manages a few hundred thousand records a second.
//!
//! Not a client for applications: no idempotence, and no retries but of
//! the first batch, which is sent alone and retried while the partition has
//! no leader that takes it (a topic just created answers
//! `NOT_LEADER_OR_FOLLOWER` for a moment): the batches after it follow only
//! once it is written, so the log keeps their order. Any other request that
//! fails fails the call, naming the broker, the partition and the first
//! record of the batch; the caller writes to a fresh topic again.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::client::KafkaClient;
use super::conn::Conn;
use super::KafkaError;
use crate::codec::{BatchBuilder, BatchMeta, Compression};
use crate::log::synthetic::{self, Synthetic};

/// Requests sent before the first answer is awaited (the Java producer's
/// `max.in.flight.requests.per.connection`). A broker handles one
/// connection's requests in order, so the log keeps the records' order.
pub const IN_FLIGHT: usize = 5;
/// Bytes of a batch at most: below the broker's default `message.max.bytes`
/// (1 MiB + 12). A Produce request carries one batch per partition.
pub const BATCH_BYTES: usize = 1_000_000;
/// Highest Produce version used: 12 names topics (13 names them by id).
const PRODUCE_VERSION: i16 = 12;

/// One partition's Produce requests on a connection, at most [`IN_FLIGHT`] unanswered.
struct Sender {
    version: i16,
    topic: TopicName,
    partition: i32,
    acks: i16,
    timeout_ms: i32,
    /// Correlation ids of the unanswered requests, with the index of their first record.
    unanswered: VecDeque<(i32, u64)>,
}

impl Sender {
    fn send(&mut self, conn: &mut Conn, batch: &BatchBuilder, first: u64) -> Result<(), KafkaError> {
        if self.unanswered.len() == IN_FLIGHT {
            self.answer(conn)?;
        }
        let req =
            ProduceRequest::default().with_acks(self.acks).with_timeout_ms(self.timeout_ms).with_topic_data(vec![
                TopicProduceData::default().with_name(self.topic.clone()).with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(self.partition)
                        .with_records(Some(Bytes::from(batch.finish(Compression::None)))),
                ]),
            ]);
        let corr = conn.send(&req, self.version)?;
        self.unanswered.push_back((corr, first));
        Ok(())
    }

    /// Wait for the oldest unanswered request's answer; an error code fails.
    fn answer(&mut self, conn: &mut Conn) -> Result<(), KafkaError> {
        let Some((corr, first)) = self.unanswered.pop_front() else { return Ok(()) };
        let resp = conn.recv::<ProduceRequest>(corr, self.version)?;
        conn.throttle(resp.throttle_time_ms);
        let (topic, partition) = (self.topic.0.as_str(), self.partition);
        let p = resp
            .responses
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partition_responses.iter())
            .find(|p| p.index == partition)
            .ok_or_else(|| {
                KafkaError::Protocol(format!("broker {}: Produce answered without {topic}-{partition}", conn.broker))
            })?;
        if p.error_code != 0 {
            let what = format!("Produce to {topic}-{partition} of the batch from record {first}");
            let message = p.error_message.as_ref().map(|m| m.as_str());
            return Err(conn.broker_error(&what, p.error_code, message));
        }
        Ok(())
    }
}

/// Write the changelog `spec` describes to `topic-partition` through its
/// leader, waiting for `acks` (1: the leader, -1: every in-sync replica) of
/// every batch. Returns the records written; they take the offsets after
/// the partition's end, in order.
pub fn produce_synthetic(
    client: &KafkaClient,
    topic: &str,
    partition: i32,
    spec: &Synthetic,
    acks: i16,
) -> Result<u64, KafkaError> {
    if let Some(why) = spec.invalid() {
        return Err(KafkaError::Config(why.to_string()));
    }
    if acks != 1 && acks != -1 {
        return Err(KafkaError::Config(format!("acks must be 1 or -1 (an answer for every batch), not {acks}")));
    }
    let mut s = Sender {
        version: 0,
        timeout_ms: 0,
        topic: TopicName(StrBytes::from_string(topic.to_string())),
        partition,
        acks,
        unanswered: VecDeque::with_capacity(IN_FLIGHT),
    };
    let mut conn: Option<Conn> = None;
    let mut send = |s: &mut Sender, batch: &BatchBuilder, first: u64| -> Result<(), KafkaError> {
        if let Some(c) = conn.as_mut() {
            return s.send(c, batch, first);
        }
        let deadline = Instant::now() + client.config.request_timeout;
        client.with_leader(topic, partition, deadline, deadline, |c, _epoch| {
            s.version = c.version::<ProduceRequest>(PRODUCE_VERSION)?;
            // half the request timeout: the broker answers (or gives up) before this side stops waiting
            s.timeout_ms = i32::try_from(c.request_timeout().as_millis() / 2).unwrap_or(i32::MAX);
            s.unanswered.clear();
            s.send(c, batch, first)?;
            s.answer(c)
        })?;
        conn = Some(client.checkout(&client.leader(topic, partition)?.broker)?);
        Ok(())
    };
    let mut batch = BatchBuilder::new(0, BatchMeta::default());
    let mut first = 0u64;
    let written = synthetic::for_each_record(spec, |i, key, value| {
        if batch.count() > 0 && batch.size() + key.len() + value.len() + 32 > BATCH_BYTES {
            send(&mut s, &batch, first)?;
            batch = BatchBuilder::new(0, BatchMeta::default());
            first = i;
        }
        // offsets relative to the batch: the broker assigns the partition's
        batch.append(batch.count() as i64, synthetic::timestamp_of(i), Some(key), Some(value), &[]);
        Ok::<(), KafkaError>(())
    })?;
    if batch.count() > 0 {
        send(&mut s, &batch, first)?;
    }
    if let Some(mut c) = conn {
        while !s.unanswered.is_empty() {
            s.answer(&mut c)?;
        }
        client.checkin(c);
    }
    Ok(written)
}
