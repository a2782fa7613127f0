//! One connection to one broker: TCP (optionally TLS), the ApiVersions
//! exchange, SASL authentication, and framed requests and responses encoded
//! and decoded by the `kafka-protocol` crate.
//!
//! Every wait is bounded: connect, write and read each time out after an
//! attempt's timeout (`socket.timeout.ms`, a third of a call's budget by
//! default), so a broker that goes silent is an error naming it, never a
//! hang, and leaves the call time to try the partition's next leader. A response is read whole (its 4-byte length first,
//! refused beyond [`MAX_RESPONSE_BYTES`]) into one buffer (a reused one
//! for a large response, see [`super::frames`]); decoding hands out
//! the fetched records as slices of that buffer, without copying them.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, RequestHeader, ResponseHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

use super::config::{ClientConfig, Mechanism, Sasl};
use super::frames::FramePool;
use super::KafkaError;

/// Largest response accepted: a fetch asks for far less; anything larger is
/// not a Kafka response.
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// A byte stream to a broker.
pub enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.get_ref(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A connection to one broker, authenticated and with the broker's API
/// versions known.
pub struct Conn {
    stream: Stream,
    /// `host:port` of the broker, for messages.
    pub broker: String,
    correlation: i32,
    /// Broker's `(min, max)` version per API key.
    versions: HashMap<i16, (i16, i16)>,
    client_id: StrBytes,
    /// One attempt's timeout (a request and its answer).
    timeout: Duration,
    /// Longest throttle waited out before a request: a call's budget (the
    /// broker mutes a throttled connection on its side; a request sent
    /// earlier would only wait there, and time out as if unanswered).
    max_throttle: Duration,
    out: Vec<u8>,
    /// Where large responses are read: buffers reused from one response to
    /// the next, shared by the client's connections.
    frames: FramePool,
    /// No request goes out before this: the broker asked for a pause
    /// (`throttle_time_ms` of a quota, KIP-219) and mutes the connection
    /// until then on its side, as Kafka's clients do on theirs.
    throttled_until: Option<Instant>,
    /// When the last response arrived (or the connection was made): an idle
    /// connection older than `connections.max.idle.ms` is not reused.
    last_used: Instant,
}

impl Conn {
    /// Connect to `broker` (`host:port`), secure and authenticate the
    /// connection as `cfg` says, and learn the broker's API versions.
    pub fn connect(broker: &str, cfg: &ClientConfig, frames: FramePool) -> Result<Self, KafkaError> {
        let timeout = cfg.attempt_timeout;
        let addrs: Vec<_> = broker
            .to_socket_addrs()
            .map_err(|e| KafkaError::Io(format!("broker {broker}: cannot resolve its address: {e}")))?
            .collect();
        let mut last = None;
        let mut tcp = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, cfg.connection_setup_timeout) {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(tcp) = tcp else {
            let why = last.map_or_else(|| "no address".to_string(), |e| e.to_string());
            return Err(KafkaError::Io(format!("broker {broker}: cannot connect: {why}")));
        };
        let io = |e: io::Error| KafkaError::Io(format!("broker {broker}: {e}"));
        tcp.set_nodelay(true).map_err(io)?;
        tcp.set_read_timeout(Some(timeout)).map_err(io)?;
        tcp.set_write_timeout(Some(timeout)).map_err(io)?;
        let stream = if cfg.protocol.tls() {
            #[cfg(feature = "tls")]
            {
                let host = broker.rsplit_once(':').map_or(broker, |(h, _)| h);
                Stream::Tls(Box::new(super::tls::connect(tcp, host, &cfg.tls, broker)?))
            }
            #[cfg(not(feature = "tls"))]
            return Err(KafkaError::Config("this build has no TLS".into()));
        } else {
            Stream::Plain(tcp)
        };
        let mut c = Conn {
            stream,
            broker: broker.to_string(),
            correlation: 0,
            versions: HashMap::new(),
            client_id: StrBytes::from_string(cfg.client_id.clone()),
            timeout,
            max_throttle: cfg.request_timeout,
            out: Vec::with_capacity(4096),
            frames,
            throttled_until: None,
            last_used: Instant::now(),
        };
        c.api_versions()?;
        if let Some(sasl) = &cfg.sasl {
            c.authenticate(sasl)?;
        }
        Ok(c)
    }

    /// Wrap an already connected stream (tests: a fake broker).
    #[cfg(test)]
    pub fn over(stream: TcpStream, broker: &str, timeout: Duration) -> Result<Self, KafkaError> {
        stream.set_read_timeout(Some(timeout)).ok();
        let mut c = Conn {
            stream: Stream::Plain(stream),
            broker: broker.to_string(),
            correlation: 0,
            versions: HashMap::new(),
            client_id: StrBytes::from_static_str("test"),
            timeout,
            max_throttle: timeout,
            out: Vec::new(),
            frames: FramePool::default(),
            throttled_until: None,
            last_used: Instant::now(),
        };
        c.api_versions()?;
        Ok(c)
    }

    fn api_versions(&mut self) -> Result<(), KafkaError> {
        // v3 is what every broker since 2.4 answers; its response header is v0.
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("statestore"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let resp: ApiVersionsResponse = self.call(&req, 3)?;
        if resp.error_code != 0 {
            return Err(self.broker_error("ApiVersions", resp.error_code, None));
        }
        self.versions = resp.api_keys.iter().map(|k| (k.api_key, (k.min_version, k.max_version))).collect();
        Ok(())
    }

    /// The version of `R` to use: the highest both sides speak, at most `highest`.
    pub fn version<R: Request>(&self, highest: i16) -> Result<i16, KafkaError> {
        let name = ApiKey::try_from(R::KEY).map_or_else(|_| R::KEY.to_string(), |k| format!("{k:?}"));
        let (bmin, bmax) = *self
            .versions
            .get(&R::KEY)
            .ok_or_else(|| KafkaError::Protocol(format!("broker {}: does not offer the {name} API", self.broker)))?;
        let v = highest.min(bmax).min(R::VERSIONS.max);
        if v < bmin.max(R::VERSIONS.min) {
            return Err(KafkaError::Protocol(format!(
                "broker {}: speaks {name} versions {bmin}..={bmax}, none of which this client speaks (up to {highest})",
                self.broker
            )));
        }
        Ok(v)
    }

    fn io(&self, what: &str, e: io::Error) -> KafkaError {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => KafkaError::Timeout(format!(
                "broker {}: no answer to {what} within {:.1} s",
                self.broker,
                self.timeout.as_secs_f64()
            )),
            io::ErrorKind::UnexpectedEof => {
                KafkaError::Io(format!("broker {}: closed the connection in the middle of {what}", self.broker))
            }
            _ => KafkaError::Io(format!("broker {}: {what}: {e}", self.broker)),
        }
    }

    /// A broker error code, named.
    pub fn broker_error(&self, what: &str, code: i16, message: Option<&str>) -> KafkaError {
        broker_error(&self.broker, what, code, message)
    }

    /// Send `req` as `version`; returns its correlation id. A throttle the
    /// broker asked for is waited out first (at most a call's budget).
    pub fn send<R: Request>(&mut self, req: &R, version: i16) -> Result<i32, KafkaError> {
        if let Some(until) = self.throttled_until.take() {
            let wait = until.saturating_duration_since(Instant::now()).min(self.max_throttle);
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        self.correlation = self.correlation.wrapping_add(1);
        let corr = self.correlation;
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(corr)
            .with_client_id(Some(self.client_id.clone()));
        self.out.clear();
        self.out.extend_from_slice(&[0; 4]);
        header
            .encode(&mut self.out, R::header_version(version))
            .and_then(|()| req.encode(&mut self.out, version))
            .map_err(|e| KafkaError::Protocol(format!("encoding a request: {e}")))?;
        let n = (self.out.len() - 4) as u32;
        self.out[..4].copy_from_slice(&n.to_be_bytes());
        let out = std::mem::take(&mut self.out);
        let r = self.stream.write_all(&out).and_then(|()| self.stream.flush());
        self.out = out;
        r.map_err(|e| self.io("a request", e))?;
        Ok(corr)
    }

    /// Read the response of the request sent with `corr` as `version`.
    pub fn recv<R: Request>(&mut self, corr: i32, version: i16) -> Result<R::Response, KafkaError> {
        let frame = self.read_frame()?;
        decode_response::<R>(frame, corr, version)
            .map_err(|e| KafkaError::Protocol(format!("broker {}: {e}", self.broker)))
    }

    /// One request and its response.
    pub fn call<R: Request>(&mut self, req: &R, version: i16) -> Result<R::Response, KafkaError> {
        let corr = self.send(req, version)?;
        self.recv::<R>(corr, version)
    }

    /// The broker answered with `throttle_time_ms`: send nothing on this
    /// connection before it has passed.
    pub fn throttle(&mut self, throttle_time_ms: i32) {
        if throttle_time_ms > 0 {
            let until = Instant::now() + Duration::from_millis(throttle_time_ms as u64);
            self.throttled_until = Some(self.throttled_until.map_or(until, |u| u.max(until)));
        }
    }

    /// Time left of a throttle the broker asked for.
    pub fn throttled_for(&self) -> Duration {
        self.throttled_until.map_or(Duration::ZERO, |u| u.saturating_duration_since(Instant::now()))
    }

    /// How long the connection has had nothing to do.
    pub fn idle_for(&self) -> Duration {
        self.last_used.elapsed()
    }

    /// Whether an idle connection still looks usable: the broker has not
    /// closed it (an idle broker-side reaper, a restart) and has sent nothing
    /// unasked. A non-blocking peek, no round trip.
    pub fn looks_alive(&self) -> bool {
        let tcp = self.stream.tcp();
        if tcp.set_nonblocking(true).is_err() {
            return false;
        }
        let mut b = [0u8; 1];
        let alive = matches!(tcp.peek(&mut b), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock);
        tcp.set_nonblocking(false).is_ok() && alive
    }

    fn read_frame(&mut self) -> Result<Bytes, KafkaError> {
        let mut len = [0u8; 4];
        self.stream.read_exact(&mut len).map_err(|e| self.io("a response", e))?;
        self.last_used = Instant::now();
        let n = i32::from_be_bytes(len);
        if n < 4 || n as usize > MAX_RESPONSE_BYTES {
            return Err(KafkaError::Protocol(format!(
                "broker {}: answered a frame of {n} bytes, which is no Kafka response",
                self.broker
            )));
        }
        let stream = &mut self.stream;
        let read = self.frames.read(n as usize, |buf| stream.read_exact(buf));
        read.map_err(|e| self.io("a response", e))
    }

    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), KafkaError> {
        let v = self.version::<SaslHandshakeRequest>(1)?;
        let hs = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(sasl.mechanism.name()));
        let resp = self.call(&hs, v)?;
        if resp.error_code != 0 {
            let offered: Vec<&str> = resp.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(KafkaError::Auth(format!(
                "broker {}: SASL mechanism {} refused ({}); the broker offers {offered:?}",
                self.broker,
                sasl.mechanism.name(),
                error_name(resp.error_code)
            )));
        }
        match sasl.mechanism {
            Mechanism::Plain => {
                let mut msg = Vec::new();
                msg.push(0);
                msg.extend_from_slice(sasl.username.as_bytes());
                msg.push(0);
                msg.extend_from_slice(sasl.password.as_bytes());
                self.sasl_round(msg)?;
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let mut scram = super::scram::Scram::new(sasl.mechanism, &sasl.username, &sasl.password);
                let first = scram.client_first();
                let server_first = self.sasl_round(first)?;
                let fin = scram.client_final(&server_first).map_err(|e| self.auth_err(&e))?;
                let server_final = self.sasl_round(fin)?;
                scram.verify_server_final(&server_final).map_err(|e| self.auth_err(&e))?;
            }
        }
        Ok(())
    }

    fn auth_err(&self, e: &str) -> KafkaError {
        KafkaError::Auth(format!("broker {}: SASL authentication failed: {e}", self.broker))
    }

    fn sasl_round(&mut self, bytes: Vec<u8>) -> Result<Vec<u8>, KafkaError> {
        let v = self.version::<SaslAuthenticateRequest>(2)?;
        let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(bytes));
        let resp = self.call(&req, v)?;
        if resp.error_code != 0 {
            let m = resp.error_message.as_ref().map(|m| m.as_str().to_string()).unwrap_or_default();
            return Err(self.auth_err(&format!("{} ({m})", error_name(resp.error_code))));
        }
        Ok(resp.auth_bytes.to_vec())
    }

    /// Wait for a request to go out and its response at most an attempt's
    /// timeout, and no longer than until `deadline` (the end of a call's
    /// budget; `None`: an attempt's timeout).
    pub fn within(&mut self, deadline: Option<Instant>) {
        let d = deadline.map_or(self.timeout, |d| self.timeout.min(left(d)));
        self.set_read_timeout(d);
        let _ = self.stream.tcp().set_write_timeout(Some(d.max(Duration::from_millis(1))));
    }

    /// Wait at most `d` for the next response (the fetch long poll adds to the request timeout).
    pub fn set_read_timeout(&mut self, d: Duration) {
        let _ = self.stream.tcp().set_read_timeout(Some(d.max(Duration::from_millis(1))));
    }

    /// One attempt's timeout (a request and its response).
    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }
}

/// Decode one response frame (header and body) of `R` sent with `corr`.
pub fn decode_response<R: Request>(mut frame: Bytes, corr: i32, version: i16) -> Result<R::Response, String> {
    let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
        .map_err(|e| format!("a response header that does not decode: {e}"))?;
    if header.correlation_id != corr {
        return Err(format!(
            "answered request {} where {corr} was expected: the connection is out of step",
            header.correlation_id
        ));
    }
    let name = ApiKey::try_from(R::KEY).map_or_else(|_| R::KEY.to_string(), |k| format!("{k:?}"));
    if R::KEY == ApiKey::Fetch as i16 {
        // The crate reserves memory for an array's claimed length before it
        // reads a single element: a fetch response (the one that carries
        // user data, in bulk) is walked first, so no count exceeds its bytes.
        check_fetch_body(&frame, version)
            .map_err(|e| format!("a {name} v{version} response that does not parse: {e}"))?;
    }
    R::Response::decode(&mut frame, version)
        .map_err(|e| format!("a {name} v{version} response that does not decode: {e}"))
}

/// A cursor over a response body that only checks its structure.
struct Walk<'a> {
    b: &'a [u8],
}

impl Walk<'_> {
    fn skip(&mut self, n: usize) -> Result<(), String> {
        if self.b.len() < n {
            return Err(format!("{n} bytes needed, {} left", self.b.len()));
        }
        self.b = &self.b[n..];
        Ok(())
    }
    fn int(&mut self, n: usize) -> Result<i64, String> {
        let v = self.b.get(..n).ok_or_else(|| format!("{n} bytes needed, {} left", self.b.len()))?;
        let v = v.iter().fold(0i64, |a, &x| (a << 8) | x as i64);
        self.b = &self.b[n..];
        // sign-extend
        let shift = 64 - 8 * n as u32;
        Ok((v << shift) >> shift)
    }
    fn uvarint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for i in 0..5 {
            let x = *self.b.first().ok_or("a varint runs past the end")?;
            self.b = &self.b[1..];
            v |= ((x & 0x7f) as u64) << (7 * i);
            if x & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint longer than 5 bytes".into())
    }
    /// Element count of an array (0 for null).
    fn array(&mut self, flexible: bool) -> Result<u64, String> {
        let n = if flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            let n = self.int(4)?;
            if n < -1 {
                return Err(format!("array length {n}"));
            }
            n.max(0) as u64
        };
        if n > self.b.len() as u64 {
            return Err(format!("an array of {n} elements in {} bytes", self.b.len()));
        }
        Ok(n)
    }
    fn bytes(&mut self, flexible: bool, len_bytes: usize) -> Result<(), String> {
        let n = if flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            let n = self.int(len_bytes)?;
            if n < -1 {
                return Err(format!("length {n}"));
            }
            n.max(0) as u64
        };
        self.skip(usize::try_from(n).map_err(|_| "a length beyond memory")?)
    }
    fn tagged(&mut self) -> Result<(), String> {
        let n = self.uvarint()?;
        for _ in 0..n {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(usize::try_from(size).map_err(|_| "a length beyond memory")?)?;
        }
        Ok(())
    }
}

/// Check the structure of a Fetch response body of `version` (4..=15): every
/// array, string and byte field fits the bytes that follow, so decoding it
/// reserves no more memory than the frame could fill.
pub fn check_fetch_body(body: &[u8], version: i16) -> Result<(), String> {
    if !(4..=15).contains(&version) {
        return Err(format!("version {version} is not one this client asks for"));
    }
    let flex = version >= 12;
    let mut w = Walk { b: body };
    w.skip(4)?; // throttle_time_ms
    if version >= 7 {
        w.skip(6)?; // error_code, session_id
    }
    for _ in 0..w.array(flex)? {
        if version >= 13 {
            w.skip(16)?; // topic id
        } else {
            w.bytes(flex, 2)?; // topic name
        }
        for _ in 0..w.array(flex)? {
            w.skip(4 + 2 + 8 + 8)?; // partition, error, high watermark, last stable offset
            if version >= 5 {
                w.skip(8)?; // log start offset
            }
            for _ in 0..w.array(flex)? {
                w.skip(16)?; // producer id, first offset
                if flex {
                    w.tagged()?;
                }
            }
            if version >= 11 {
                w.skip(4)?; // preferred read replica
            }
            w.bytes(flex, 4)?; // records
            if flex {
                w.tagged()?;
            }
        }
        if flex {
            w.tagged()?;
        }
    }
    if flex {
        w.tagged()?;
    }
    Ok(())
}

/// Error `code` that `broker` answered to `what`, named.
pub fn broker_error(broker: &str, what: &str, code: i16, message: Option<&str>) -> KafkaError {
    let name = error_name(code);
    let more = message.map(|m| format!(": {m}")).unwrap_or_default();
    KafkaError::Broker { code, message: format!("broker {broker}: {what} failed with {name} ({code}){more}") }
}

/// Kafka's name of an error code (the ones a restore meets; others by number).
pub fn error_name(code: i16) -> &'static str {
    match code {
        -1 => "UNKNOWN_SERVER_ERROR",
        0 => "NONE",
        1 => "OFFSET_OUT_OF_RANGE",
        2 => "CORRUPT_MESSAGE",
        3 => "UNKNOWN_TOPIC_OR_PARTITION",
        5 => "LEADER_NOT_AVAILABLE",
        6 => "NOT_LEADER_OR_FOLLOWER",
        7 => "REQUEST_TIMED_OUT",
        8 => "BROKER_NOT_AVAILABLE",
        9 => "REPLICA_NOT_AVAILABLE",
        13 => "NETWORK_EXCEPTION",
        29 => "TOPIC_AUTHORIZATION_FAILED",
        31 => "CLUSTER_AUTHORIZATION_FAILED",
        33 => "UNSUPPORTED_SASL_MECHANISM",
        34 => "ILLEGAL_SASL_STATE",
        35 => "UNSUPPORTED_VERSION",
        56 => "KAFKA_STORAGE_ERROR",
        58 => "SASL_AUTHENTICATION_FAILED",
        74 => "FENCED_LEADER_EPOCH",
        75 => "UNKNOWN_LEADER_EPOCH",
        78 => "OFFSET_NOT_AVAILABLE",
        100 => "UNKNOWN_TOPIC_ID",
        103 => "INCONSISTENT_TOPIC_ID",
        _ => "an error",
    }
}

/// Codes after which a metadata refresh and a retry may succeed: those of a
/// leader election or a broker restart (the leader moved or is not ready,
/// `REPLICA_NOT_AVAILABLE`, `OFFSET_NOT_AVAILABLE` from ListOffsets right
/// after an election, a stale or too new leader epoch), and
/// `UNKNOWN_SERVER_ERROR`, which brokers answer for a failure of theirs
/// (Kafka's consumer retries all of these), and `UNKNOWN_TOPIC_ID` and
/// `INCONSISTENT_TOPIC_ID`, after which the refreshed metadata tells a
/// recreated topic (a new id: the fetcher's `OutOfRange`) from a broker
/// that has not caught up.
pub fn retriable(code: i16) -> bool {
    matches!(code, -1 | 3 | 5 | 6 | 7 | 8 | 9 | 13 | 56 | 74 | 75 | 78 | 100 | 103)
}

/// `Instant` helpers for bounded retries.
pub fn left(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}
