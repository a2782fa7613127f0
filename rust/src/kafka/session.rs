//! One fetch session per `restore_many` job: the restores of a job that
//! read from the same cluster share one fetch thread and one connection per
//! broker, and each Fetch a broker gets names every partition it leads that
//! a restore of the job is reading, as the Java consumer and librdkafka
//! fetch.
//!
//! Each partition keeps its own [`Fetcher`] (offset, response size, leader
//! epoch, topic id, stall deadline) and a short queue of responses its
//! restore decodes from. A broker's thread takes the fetchers of its
//! partitions whose queue has room, sends them one Fetch, hands each
//! partition its part of the answer (with the aborted transactions of its
//! own response; where to fetch next decided by the batch headers) and puts
//! the fetchers back: a partition whose restore is slow is left out of the
//! next requests, not the others. The restore checks its batches (CRC-32C,
//! markers) as it takes a response, so the broker's thread only receives,
//! and sends the next Fetch without waiting for a check. The
//! thread ends when no partition of the job is led by its broker any more,
//! giving its connection back to the client's pool.
//!
//! A partition joins when its restore opens it, or at the job's start when
//! its restore will start a few records below the end (a store kept open:
//! [`crate::kafka::client::SessionLog`]'s `read_ahead`). Those are primed
//! together, the Fetches held until all are ([`FetchSession::priming`]), so
//! one Fetch per broker names them all; each asks for a little
//! ([`PRIMED_FETCH_BYTES`]) and holds one response until its restore reads.
//!
//! Faults are the single fetcher's, taken per partition or per connection:
//! an error a partition answered (a leader that moved, a fenced epoch, an
//! offset out of range, a recreated topic) is that partition's; a connection
//! that breaks or goes silent, or a response error, concerns every partition
//! of the request. A retriable one sends the partition to a metadata lookup
//! (or, with a KIP-951 hint, straight to the new leader) after a backoff,
//! within its stall timeout; the lookups are made one at a time, so the
//! partitions that lost their leader together share one metadata refresh.
//! A throttle is waited out on the connection before its next request, as
//! the broker mutes it. Every wait is bounded: a request by the attempt
//! timeout, a partition without progress by its stall timeout, and the
//! restore waiting for a response by that timeout and one attempt more.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kafka_protocol::messages::fetch_request::FetchTopic;
use kafka_protocol::messages::FetchRequest;
use uuid::Uuid;

use super::client::{KafkaClient, FIRST_BACKOFF, MAX_BACKOFF};
use super::conn::{self, Conn, MAX_RESPONSE_BYTES};
use super::fetch::{
    fetch_request, fetch_topic, find_partition, Fetcher, Response, Step, FETCH_VERSION, FETCH_VERSION_TOPIC_IDS,
};
use super::KafkaError;

/// Responses a partition may have waiting to be decoded (besides the one
/// being decoded): as many as a fetcher of its own holds (one handed over,
/// one checked, one on the wire), so that a restore waits no more often.
pub(super) const QUEUED: usize = 3;

/// Bytes asked for by the first Fetch of a partition primed at its job's
/// start ([`Member::prime_ahead`]): each holds its response until its
/// restore's turn, so it is a small one (a standby's few records).
pub(super) const PRIMED_FETCH_BYTES: i32 = 64 << 10;

/// Longest a waiting thread sleeps before it looks again (it is woken on
/// every change; this only bounds a missed one).
const POLL: Duration = Duration::from_millis(100);

/// The fetch session of one job: see the module documentation. Dropping it
/// ends its broker threads (each after the request it may be waiting for).
pub struct FetchSession {
    inner: Arc<Inner>,
}

struct Inner {
    client: Arc<KafkaClient>,
    state: Mutex<State>,
    /// Notified on every change of `state`.
    changed: Condvar,
    /// Held while a partition's leader is looked up: the partitions that
    /// lost their leader together share one metadata refresh.
    resolving: Mutex<()>,
}

#[derive(Default)]
struct State {
    parts: HashMap<u64, Part>,
    next_id: u64,
    /// Brokers whose fetch thread runs.
    threads: Vec<String>,
    closed: bool,
    /// Partitions are being primed together ([`FetchSession::priming`]): no
    /// Fetch is sent until they all are, so that one names them all.
    priming: usize,
    /// Fetch requests sent, and the partitions they named in all.
    requests: u64,
    partitions_fetched: u64,
}

/// One partition of the session.
struct Part {
    /// `None` while its broker's thread has it in a request.
    fetcher: Option<Box<Fetcher>>,
    /// The broker it is fetched from (its leader); `None`: to be looked up.
    broker: Option<String>,
    /// Responses (or the error that ended the fetching) for its restore.
    queue: VecDeque<Result<Response, KafkaError>>,
    /// Not fetched, nor its leader looked up, before this.
    not_before: Instant,
    /// Pause before the next try after a retriable error.
    backoff: Duration,
    /// The read fails when it has made no progress by then.
    deadline: Instant,
    /// Its fetching ended with the error queued last.
    failed: bool,
    /// Responses it may have queued: one while it is primed ahead of its
    /// restore ([`Member::prime_ahead`]), [`QUEUED`] once the restore reads.
    room: usize,
}

impl Part {
    /// Progress: the stall deadline starts again, and so does the backoff.
    fn progressed(&mut self, stall: Duration) {
        self.deadline = Instant::now() + stall;
        self.backoff = FIRST_BACKOFF;
    }

    fn fail(&mut self, e: KafkaError) {
        self.queue.push_back(Err(e));
        self.failed = true;
    }
}

/// What a request did for one partition.
enum Got {
    /// A response, and what it means for the fetching.
    Response(Response, Step),
    /// Nothing: a throttled answer without the partition.
    Nothing,
    Failed(KafkaError),
}

impl FetchSession {
    pub fn new(client: Arc<KafkaClient>) -> Arc<Self> {
        let inner =
            Inner { client, state: Mutex::new(State::default()), changed: Condvar::new(), resolving: Mutex::new(()) };
        Arc::new(FetchSession { inner: Arc::new(inner) })
    }

    pub fn client(&self) -> &Arc<KafkaClient> {
        &self.inner.client
    }

    /// Fetch requests sent so far, and the partitions they named in all.
    pub fn requests(&self) -> (u64, u64) {
        let st = self.inner.lock();
        (st.requests, st.partitions_fetched)
    }

    /// Fetch threads running now.
    pub fn threads(&self) -> usize {
        self.inner.lock().threads.len()
    }

    /// Hold every Fetch of the session back until the guard is dropped:
    /// partitions primed meanwhile go out together, one Fetch per broker.
    pub fn priming(&self) -> Priming<'_> {
        self.inner.lock().priming += 1;
        Priming(self)
    }

    /// A partition of this session, to be read from `start` (held to topic
    /// id `held`, see [`Fetcher::new`]).
    pub fn member(self: &Arc<Self>, topic: &str, partition: i32, start: i64, held: Option<Uuid>) -> Member {
        let fetcher = Box::new(Fetcher::new(self.inner.client.clone(), topic, partition, start, held));
        let stall = self.inner.client.config.stall_timeout;
        let now = Instant::now();
        let mut st = self.inner.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.parts.insert(
            id,
            Part {
                fetcher: Some(fetcher),
                broker: None,
                queue: VecDeque::new(),
                not_before: now,
                backoff: FIRST_BACKOFF,
                deadline: now + stall,
                failed: false,
                room: QUEUED,
            },
        );
        Member { session: self.clone(), id, topic: topic.to_string(), partition }
    }
}

/// Fetches held back while it lives ([`FetchSession::priming`]).
pub struct Priming<'a>(&'a FetchSession);

impl Drop for Priming<'_> {
    fn drop(&mut self) {
        self.0.inner.lock().priming -= 1;
        self.0.inner.changed.notify_all();
    }
}

impl Drop for FetchSession {
    fn drop(&mut self) {
        self.inner.lock().closed = true;
        self.inner.changed.notify_all();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, st: MutexGuard<'a, State>, at_most: Duration) -> MutexGuard<'a, State> {
        let d = at_most.clamp(Duration::from_millis(1), POLL);
        self.changed.wait_timeout(st, d).unwrap_or_else(|p| p.into_inner()).0
    }

    /// Fetch partition `id` from `broker` (its leader, in `epoch`), starting
    /// the broker's thread if it has none.
    fn assign(self: &Arc<Self>, st: &mut State, id: u64, broker: String, epoch: i32) {
        let Some(part) = st.parts.get_mut(&id) else { return };
        if let Some(f) = part.fetcher.as_mut() {
            f.leader_epoch = epoch;
        }
        part.broker = Some(broker.clone());
        if !st.threads.contains(&broker) {
            st.threads.push(broker.clone());
            let inner = self.clone();
            std::thread::Builder::new()
                .name(format!("fetch {broker}"))
                .spawn(move || inner.run(&broker))
                .expect("spawning a fetch thread");
        }
    }

    /// A broker's fetch thread: one Fetch at a time for the partitions it
    /// leads that have room, until none is left.
    fn run(self: &Arc<Self>, broker: &str) {
        let mut conn: Option<Conn> = None;
        while let Some(mut taken) = self.take_ready(broker) {
            let got = self.fetch(broker, &mut conn, &mut taken);
            self.put_back(broker, taken, got);
        }
        if let Some(c) = conn {
            self.client.checkin(c);
        }
    }

    /// The fetchers of `broker`'s partitions to fetch now, with their
    /// session ids: waits until there are some; `None` once the session is
    /// closed or no partition is left at the broker (the thread ends).
    fn take_ready(&self, broker: &str) -> Option<Vec<(u64, Box<Fetcher>)>> {
        let mut st = self.lock();
        loop {
            let now = Instant::now();
            if st.priming > 0 && !st.closed {
                st = self.wait(st, POLL);
                continue;
            }
            let (mut any, mut ready, mut wake) = (false, Vec::new(), POLL);
            if !st.closed {
                for (&id, p) in &st.parts {
                    if p.broker.as_deref() != Some(broker) || p.failed {
                        continue;
                    }
                    any = true;
                    let Some(f) = &p.fetcher else { continue };
                    if f.offset >= f.end || p.queue.len() >= p.room {
                        continue;
                    }
                    if p.not_before > now {
                        wake = wake.min(p.not_before - now);
                        continue;
                    }
                    ready.push(id);
                }
            }
            if !ready.is_empty() {
                ready.sort_unstable(); // the order the restores began in
                                       // One entry per partition: a broker keeps only the last of two for the same
                                       // partition and answers it once, so two reads of one partition (two stores of one
                                       // changelog partition in a job) would both be handed the other's records. The
                                       // later read waits for the next Fetch.
                let mut named = HashSet::new();
                ready.retain(|id| {
                    let f = st.parts[id].fetcher.as_ref().expect("a ready fetcher");
                    named.insert((f.topic.clone(), f.partition))
                });
                let taken = ready
                    .into_iter()
                    .map(|id| (id, st.parts.get_mut(&id).and_then(|p| p.fetcher.take()).expect("a ready fetcher")))
                    .collect();
                return Some(taken);
            }
            if !any {
                st.threads.retain(|b| b != broker);
                return None;
            }
            st = self.wait(st, wake);
        }
    }

    /// One Fetch of the `taken` partitions from `broker` on `conn` (made
    /// first if there is none; dropped when it fails out of step): what it
    /// did for each. Called without the session's lock.
    fn fetch(&self, broker: &str, conn: &mut Option<Conn>, taken: &mut [(u64, Box<Fetcher>)]) -> Vec<Got> {
        let mut got: Vec<Option<Got>> = taken.iter().map(|_| None).collect();
        let all = |e: KafkaError, got: &mut Vec<Option<Got>>| {
            for g in got.iter_mut().filter(|g| g.is_none()) {
                *g = Some(Got::Failed(e.clone()));
            }
        };
        let mut ids: Vec<Option<Uuid>> = Vec::with_capacity(taken.len());
        for (i, (_, f)) in taken.iter_mut().enumerate() {
            match f.check_topic_id() {
                Ok(id) => ids.push(id),
                Err(e) => {
                    ids.push(None);
                    got[i] = Some(Got::Failed(e));
                }
            }
        }
        let live: Vec<usize> = (0..taken.len()).filter(|&i| got[i].is_none()).collect();
        if live.is_empty() {
            return got.into_iter().flatten().collect();
        }
        match self.request(broker, conn, taken, &ids, &live) {
            Err(e) => all(e, &mut got),
            Ok((resp, by_id, answered_in)) => {
                let throttled = conn.as_ref().is_some_and(|c| !c.throttled_for().is_zero());
                for &i in &live {
                    let f = &mut taken[i].1;
                    f.answered_in = answered_in;
                    let id = if by_id { ids[i] } else { None };
                    got[i] = Some(match find_partition(&resp, &f.topic, id, f.partition) {
                        None if resp.throttle_time_ms > 0 => Got::Nothing,
                        None => Got::Failed(KafkaError::Protocol(format!(
                            "broker {broker}: a Fetch response without {} (fetched at offset {})",
                            f.tp(),
                            f.offset
                        ))),
                        Some(p) => match f.take_partition(p, f.offset, broker) {
                            Ok(r) => Got::Response(r, Step::Deliver), // decided below
                            Err(e) => Got::Failed(e),
                        },
                    });
                }
                // What each response means, by its batch headers; its
                // batches are checked by the restore that takes it.
                for (i, g) in got.iter_mut().enumerate() {
                    if let Some(Got::Response(r, step)) = g {
                        let f = &mut taken[i].1;
                        let mut stuck = f.stuck;
                        *step = f.step(r, &mut stuck, throttled);
                        f.stuck = stuck;
                    }
                }
            }
        }
        got.into_iter().map(|g| g.expect("every partition has an outcome")).collect()
    }

    /// Send one Fetch of the `live` partitions of `taken` to `broker` and
    /// read its answer: the response, whether it named topics by id, and how
    /// long the broker took.
    fn request(
        &self,
        broker: &str,
        conn: &mut Option<Conn>,
        taken: &[(u64, Box<Fetcher>)],
        ids: &[Option<Uuid>],
        live: &[usize],
    ) -> Result<(kafka_protocol::messages::FetchResponse, bool, Duration), KafkaError> {
        if conn.is_none() {
            *conn = Some(self.client.checkout(broker)?);
        }
        let c = conn.as_mut().expect("connected above");
        let all_ids = live.iter().all(|&i| ids[i].is_some());
        let version = match c.version::<FetchRequest>(if all_ids { FETCH_VERSION_TOPIC_IDS } else { FETCH_VERSION }) {
            Ok(v) => v,
            Err(e) => {
                *conn = None;
                return Err(e);
            }
        };
        let by_id = all_ids && version >= 13;
        let mut topics: Vec<(String, FetchTopic)> = Vec::new();
        let mut max_bytes = 0i64;
        for &i in live {
            let f = &taken[i].1;
            let entry = f.fetch_partition(f.offset, f.leader_epoch);
            match topics.iter_mut().find(|(t, _)| *t == f.topic) {
                Some((_, t)) => t.partitions.push(entry),
                None => {
                    let t = fetch_topic(&f.topic, if by_id { ids[i] } else { None }).with_partitions(vec![entry]);
                    topics.push((f.topic.clone(), t));
                }
            }
            max_bytes += f.fetch_bytes as i64;
        }
        let max_bytes = max_bytes.min(MAX_RESPONSE_BYTES as i64 / 2) as i32;
        let req = fetch_request(&self.client, topics.into_iter().map(|(_, t)| t).collect(), max_bytes);
        {
            let mut st = self.lock();
            st.requests += 1;
            st.partitions_fetched += live.len() as u64;
        }
        let sent = Instant::now();
        let wait = self.client.config.fetch_max_wait;
        let r = c.send(&req, version).and_then(|corr| {
            c.set_read_timeout(c.request_timeout() + wait);
            c.recv::<FetchRequest>(corr, version)
        });
        let resp = match r {
            Ok(resp) => resp,
            Err(e) => {
                // Out of step, or the broker is gone: its connection too.
                self.client.failed_at(broker, &e);
                *conn = None;
                return Err(e);
            }
        };
        let answered_in = sent.elapsed();
        c.throttle(resp.throttle_time_ms);
        if resp.error_code != 0 {
            let tps: Vec<String> = live.iter().map(|&i| taken[i].1.tp()).collect();
            let what = format!("Fetch of {}", tps.join(", "));
            return Err(conn::broker_error(broker, &what, resp.error_code, None));
        }
        Ok((resp, by_id, answered_in))
    }

    /// Give the `taken` fetchers back with what their request did: a
    /// response to hand out, a pause, a retry elsewhere, or an error.
    fn put_back(self: &Arc<Self>, broker: &str, taken: Vec<(u64, Box<Fetcher>)>, got: Vec<Got>) {
        let stall = self.client.config.stall_timeout;
        let mut st = self.lock();
        let now = Instant::now();
        let mut moved: Vec<(u64, String, i32)> = Vec::new();
        for ((id, mut f), g) in taken.into_iter().zip(got) {
            let Some(part) = st.parts.get_mut(&id) else { continue }; // its restore ended meanwhile
            match g {
                Got::Nothing => {}
                Got::Response(r, Step::Deliver) => {
                    part.queue.push_back(Ok(r));
                    part.progressed(stall);
                }
                Got::Response(r, Step::Again(wait)) => {
                    if now >= part.deadline {
                        part.fail(f.stalled(&r));
                    } else {
                        part.not_before = now + wait;
                    }
                }
                Got::Response(_, Step::Fail(e)) => part.fail(e),
                Got::Failed(e) if e.retriable() && now + part.backoff < part.deadline => {
                    // Another broker may lead now, or this one restarted. To
                    // the leader the client knows if it is another broker
                    // (the one the broker named, KIP-951, or one a lookup for
                    // another partition found meanwhile); else a lookup after
                    // a pause, which the partitions that failed together share.
                    f.hinted = false;
                    part.broker = None;
                    match self.client.cached_leader(&f.topic, f.partition).filter(|l| l.broker != broker) {
                        Some(l) => moved.push((id, l.broker, l.epoch)),
                        None => {
                            self.client.invalidate(&f.topic, f.partition);
                            part.not_before = now + part.backoff;
                            part.backoff = (part.backoff * 2).min(MAX_BACKOFF);
                        }
                    }
                }
                Got::Failed(e) => {
                    f.hinted = false;
                    let e = e.context(&f.context());
                    part.fail(e);
                }
            }
            part.fetcher = Some(f);
        }
        for (id, broker, epoch) in moved {
            self.assign(&mut st, id, broker, epoch);
        }
        drop(st);
        self.changed.notify_all();
    }
}

/// One partition of a [`FetchSession`], as its restore's cursor reads it.
/// Dropping it takes the partition out of the session.
pub struct Member {
    session: Arc<FetchSession>,
    id: u64,
    topic: String,
    partition: i32,
}

impl Member {
    fn inner(&self) -> &Arc<Inner> {
        &self.session.inner
    }

    /// Fetch from `position` towards `end` from now on, before the first
    /// read (the restore creates its store meanwhile): the partition's
    /// leader is looked up here, on the caller's thread.
    pub(super) fn prime(&mut self, position: i64, end: i64) {
        self.aim(position, end);
        self.resolve();
    }

    /// Fetch from `position` towards `end` from the start of a job, before
    /// its restore's turn ([`crate::source::Changelog::read_ahead`]): the
    /// first request asks for [`PRIMED_FETCH_BYTES`], and one response is
    /// queued until the restore reads, so that a partition primed ahead holds
    /// about that much (a first batch larger than it comes whole).
    pub(super) fn prime_ahead(&mut self, position: i64, end: i64) {
        if let Some(f) = self.inner().lock().parts.get_mut(&self.id).and_then(|p| p.fetcher.as_mut()) {
            f.fetch_bytes = f.fetch_bytes.min(PRIMED_FETCH_BYTES);
        }
        self.seek(position, end, 1);
        self.resolve();
    }

    /// Point the fetcher at `[position, end)` unless it is fetching there
    /// (responses for another position are dropped), the restore reading:
    /// [`QUEUED`] responses may wait for it.
    fn aim(&self, position: i64, end: i64) {
        self.seek(position, end, QUEUED);
    }

    fn seek(&self, position: i64, end: i64, room: usize) {
        let inner = self.inner();
        let stall = inner.client.config.stall_timeout;
        let mut st = inner.lock();
        let Some(part) = st.parts.get_mut(&self.id) else { return };
        if part.room != room {
            part.room = room;
            inner.changed.notify_all();
        }
        let Some(f) = part.fetcher.as_mut() else { return };
        if part.queue.is_empty() && (f.offset != position || f.end != end) {
            f.seek(position, end);
            part.failed = false;
            part.progressed(stall);
            drop(st);
            inner.changed.notify_all();
        }
    }

    /// Look the partition's leader up (from the client's cache, or one
    /// metadata refresh shared with the others that need it) and fetch
    /// from it; a failure is retried after a backoff within the stall
    /// timeout, then queued as the read's error.
    fn resolve(&self) {
        let inner = self.inner();
        let r = {
            let _one_at_a_time = inner.resolving.lock().unwrap_or_else(|p| p.into_inner());
            inner.client.leader(&self.topic, self.partition)
        };
        let mut st = inner.lock();
        let now = Instant::now();
        let Some(part) = st.parts.get_mut(&self.id) else { return };
        if part.broker.is_some() {
            return;
        }
        match r {
            Ok(l) => inner.assign(&mut st, self.id, l.broker, l.epoch),
            Err(e) if e.retriable() && now + part.backoff < part.deadline => {
                part.not_before = now + part.backoff;
                part.backoff = (part.backoff * 2).min(MAX_BACKOFF);
            }
            Err(e) => {
                let context = part.fetcher.as_ref().map(|f| f.context()).unwrap_or_default();
                part.fail(e.context(&context));
            }
        }
        drop(st);
        inner.changed.notify_all();
    }

    /// The response at `position`, reading below `end`: waits for the
    /// partition's broker thread (looking its leader up when it has none),
    /// at most the stall timeout and an attempt's time more.
    pub(super) fn next(&mut self, position: i64, end: i64) -> Result<Response, KafkaError> {
        let inner = self.inner().clone();
        let config = &inner.client.config;
        let grace = config.attempt_timeout + config.fetch_max_wait;
        loop {
            self.aim(position, end);
            let mut st = inner.lock();
            let now = Instant::now();
            let Some(part) = st.parts.get_mut(&self.id) else {
                return Err(KafkaError::Protocol(format!(
                    "{}-{} is not in its fetch session",
                    self.topic, self.partition
                )));
            };
            // Responses for another position (the reads changed course) are dropped.
            while part.queue.front().is_some_and(|r| r.as_ref().is_ok_and(|r| r.offset != position)) {
                part.queue.pop_front();
            }
            if let Some(r) = part.queue.pop_front() {
                match &r {
                    Ok(_) => part.progressed(config.stall_timeout),
                    Err(_) => part.failed = false, // a read after an error starts again
                }
                drop(st);
                inner.changed.notify_all();
                // Checked here, on the restore's thread: the broker's
                // thread goes on to its next Fetch meanwhile.
                return r.map(|mut r| {
                    r.check();
                    r
                });
            }
            let (deadline, needs_leader) = (part.deadline, part.broker.is_none() && !part.failed);
            if needs_leader && now >= part.not_before {
                drop(st);
                self.resolve();
                continue;
            }
            if now >= deadline + grace {
                let at = part.fetcher.as_ref().map_or(position, |f| f.offset);
                return Err(KafkaError::Timeout(format!(
                    "reading {}-{} on {} at offset {at}: no response for {:.1} s",
                    self.topic,
                    self.partition,
                    inner.client.servers(),
                    (config.stall_timeout + grace).as_secs_f64()
                )));
            }
            let wake = if needs_leader { part.not_before.saturating_duration_since(now) } else { POLL };
            drop(inner.wait(st, wake));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let inner = self.inner();
        inner.lock().parts.remove(&self.id);
        inner.changed.notify_all();
    }
}
