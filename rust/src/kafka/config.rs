//! The fetcher's configuration, read from the same confluent-kafka (librdkafka)
//! style properties `statestore.kafka.KafkaChangelog` takes, so one dict
//! configures both the Python clients and the native fetcher.
//!
//! Only what a restore needs is read: `bootstrap.servers`, `client.id`,
//! `security.protocol`, `ssl.ca.location`, `ssl.certificate.location`,
//! `ssl.key.location`, `ssl.endpoint.identification.algorithm`,
//! `enable.ssl.certificate.verification`, `sasl.mechanism(s)`,
//! `sasl.username`, `sasl.password`, and of the tuning keys
//! `max.partition.fetch.bytes`, `connections.max.idle.ms` and
//! `socket.connection.setup.timeout.ms`. Producer and consumer tuning keys are
//! ignored. A security setting the fetcher cannot honour (another SASL
//! mechanism, a keystore, an encrypted key...) makes [`ClientConfig::parse`]
//! answer [`ConfigError::Unsupported`] naming it, and the caller falls back to
//! the confluent-kafka path: the fetcher never connects with less security
//! than was asked for.

use std::time::Duration;

/// How the connection is secured (Kafka's `security.protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl Protocol {
    pub fn tls(self) -> bool {
        matches!(self, Protocol::Ssl | Protocol::SaslSsl)
    }
    pub fn sasl(self) -> bool {
        matches!(self, Protocol::SaslPlaintext | Protocol::SaslSsl)
    }
}

/// A SASL mechanism the fetcher speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// SASL credentials.
#[derive(Clone, PartialEq, Eq)]
pub struct Sasl {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Sasl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("Sasl").field("mechanism", &self.mechanism).field("username", &self.username).finish()
    }
}

/// TLS settings (PEM files).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tls {
    /// CA bundle; `None`: the system's bundle.
    pub ca_location: Option<String>,
    /// Client certificate and key (both or neither).
    pub certificate_location: Option<String>,
    pub key_location: Option<String>,
    /// Check that the broker's certificate names the host we connect to.
    pub verify_hostname: bool,
    /// Check the broker's certificate at all.
    pub verify_certificate: bool,
}

/// Everything the fetcher needs to reach a cluster.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port` of the bootstrap brokers.
    pub bootstrap: Vec<String>,
    pub client_id: String,
    pub protocol: Protocol,
    pub sasl: Option<Sasl>,
    pub tls: Tls,
    /// Budget of one call (offsets, a metadata lookup): its attempts and
    /// the pauses between them (the Java clients' `default.api.timeout.ms`).
    pub request_timeout: Duration,
    /// Longest wait for one broker round trip (a request and its response,
    /// or setting up a connection): `socket.timeout.ms`, by default a third
    /// of the call's budget (as the Java clients' `request.timeout.ms` is
    /// below `default.api.timeout.ms`), so that a call whose broker stops
    /// answering (paused, black-holed) can still ask the cluster who leads
    /// now and retry there.
    pub attempt_timeout: Duration,
    /// Longest time a restore may make no progress before it gives up.
    pub stall_timeout: Duration,
    /// Bytes asked per partition in one fetch.
    pub partition_max_bytes: i32,
    /// Longest wait of the broker for data at the end of the log.
    pub fetch_max_wait: Duration,
    /// A pooled connection idle longer than this is closed rather than
    /// reused (`connections.max.idle.ms`): below the broker's own limit, so
    /// the client, not the broker, ends it.
    pub connections_max_idle: Duration,
    /// Longest wait for a TCP connection to be set up
    /// (`socket.connection.setup.timeout.ms`, at most an attempt's timeout):
    /// a host that drops packets (no RST) costs this, not a request timeout.
    pub connection_setup_timeout: Duration,
}

/// Why a configuration is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Valid, but the fetcher cannot honour it: use the confluent-kafka path.
    #[error("{0}")]
    Unsupported(String),
    /// Not valid at all.
    #[error("{0}")]
    Invalid(String),
}

/// Default bytes per partition per fetch (`max.partition.fetch.bytes`):
/// large responses, few round trips.
pub const DEFAULT_PARTITION_MAX_BYTES: i32 = 8 << 20;

/// Default `connections.max.idle.ms`: 9 minutes, the Java clients' default,
/// one minute below the broker's (10 minutes), so a pooled connection is
/// dropped before the broker reaps it.
pub const DEFAULT_CONNECTIONS_MAX_IDLE: Duration = Duration::from_secs(9 * 60);

/// Default `socket.connection.setup.timeout.ms`: 10 s, the Java clients' default.
pub const DEFAULT_CONNECTION_SETUP_TIMEOUT: Duration = Duration::from_secs(10);

/// A call's budget (`request_timeout`) allows at least this many attempts
/// by default: one attempt's timeout is a third of it, so that an attempt at
/// a leader that stopped answering leaves time for a metadata refresh and
/// tries at the leader the controller elects once it fenced the silent one
/// (`broker.session.timeout.ms`, 9 s by default, within the 30 s default).
pub const ATTEMPTS_PER_CALL: u32 = 3;

/// Keys of other clients' concerns the fetcher ignores, by prefix: a producer's
/// or consumer's tuning, logging and callbacks.
const IGNORED_SSL_SASL: &[&str] = &["sasl.kerberos.min.time.before.relogin", "ssl.endpoint.identification.algorithm"];

impl ClientConfig {
    /// Read a configuration from `(key, value)` pairs (dots or underscores).
    pub fn parse<'a>(
        pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
        request_timeout: Duration,
        stall_timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let mut bootstrap = None;
        let mut client_id = "statestore-restore".to_string();
        let mut protocol = Protocol::Plaintext;
        let mut mechanism: Option<String> = None;
        let mut username = None;
        let mut password = None;
        let mut tls = Tls { verify_hostname: true, verify_certificate: true, ..Tls::default() };
        let mut partition_max_bytes = DEFAULT_PARTITION_MAX_BYTES;
        let mut connections_max_idle = DEFAULT_CONNECTIONS_MAX_IDLE;
        let mut connection_setup_timeout = DEFAULT_CONNECTION_SETUP_TIMEOUT;
        let mut attempt_timeout = request_timeout / ATTEMPTS_PER_CALL;
        for (k, v) in pairs {
            let key = k.replace('_', ".");
            match key.as_str() {
                "bootstrap.servers" | "metadata.broker.list" => bootstrap = Some(v.to_string()),
                "client.id" => client_id = v.to_string(),
                "max.partition.fetch.bytes" => {
                    partition_max_bytes = v.parse::<i32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        ConfigError::Invalid(format!("max.partition.fetch.bytes must be a positive number, got {v:?}"))
                    })?
                }
                "connections.max.idle.ms" => {
                    // librdkafka's 0 means "never close": the default then, below the broker's limit.
                    let ms = v.parse::<u64>().map_err(|_| {
                        ConfigError::Invalid(format!(
                            "connections.max.idle.ms must be a number of milliseconds, got {v:?}"
                        ))
                    })?;
                    if ms > 0 {
                        connections_max_idle = Duration::from_millis(ms);
                    }
                }
                "socket.connection.setup.timeout.ms" => {
                    let ms = v.parse::<u64>().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "socket.connection.setup.timeout.ms must be a positive number of milliseconds, got {v:?}"
                        ))
                    })?;
                    connection_setup_timeout = Duration::from_millis(ms);
                }
                "socket.timeout.ms" => {
                    let ms = v.parse::<u64>().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "socket.timeout.ms must be a positive number of milliseconds, got {v:?}"
                        ))
                    })?;
                    attempt_timeout = Duration::from_millis(ms);
                }
                "security.protocol" => {
                    protocol = match v.to_ascii_lowercase().as_str() {
                        "plaintext" => Protocol::Plaintext,
                        "ssl" => Protocol::Ssl,
                        "sasl_plaintext" => Protocol::SaslPlaintext,
                        "sasl_ssl" => Protocol::SaslSsl,
                        other => return Err(ConfigError::Invalid(format!("unknown security.protocol {other:?}"))),
                    }
                }
                "sasl.mechanism" | "sasl.mechanisms" => mechanism = Some(v.trim().to_string()),
                "sasl.username" => username = Some(v.to_string()),
                "sasl.password" => password = Some(v.to_string()),
                "ssl.ca.location" if v == "probe" || std::path::Path::new(v).is_dir() => {
                    return Err(ConfigError::Unsupported(format!(
                        "ssl.ca.location is {v:?}, a directory of CA certificates or OpenSSL's probe, which the \
                         native fetcher does not read (it takes a PEM bundle)"
                    )))
                }
                "ssl.ca.location" => tls.ca_location = Some(v.to_string()),
                "ssl.certificate.location" => tls.certificate_location = Some(v.to_string()),
                "ssl.key.location" => tls.key_location = Some(v.to_string()),
                "ssl.endpoint.identification.algorithm" => {
                    tls.verify_hostname = match v.to_ascii_lowercase().as_str() {
                        "https" => true,
                        "none" | "" => false,
                        other => {
                            return Err(ConfigError::Invalid(format!(
                                "unknown ssl.endpoint.identification.algorithm {other:?}"
                            )))
                        }
                    }
                }
                "enable.ssl.certificate.verification" => tls.verify_certificate = truthy(&key, v)?,
                "ssl.key.password" if v.is_empty() => {}
                k if (k.starts_with("ssl.") || k.starts_with("sasl.")) && !IGNORED_SSL_SASL.contains(&k) => {
                    return Err(ConfigError::Unsupported(format!(
                        "{k} is set, which the native fetcher does not implement"
                    )))
                }
                _ => {} // other clients' settings (producer, consumer, logging)
            }
        }
        let bootstrap: Vec<String> = bootstrap
            .ok_or_else(|| ConfigError::Invalid("bootstrap.servers is not set".into()))?
            .split(',')
            .map(|s| s.trim().trim_start_matches("PLAINTEXT://").trim_start_matches("SSL://").to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if bootstrap.is_empty() {
            return Err(ConfigError::Invalid("bootstrap.servers names no broker".into()));
        }
        for b in &bootstrap {
            if b.rsplit_once(':').is_none_or(|(_, p)| p.parse::<u16>().is_err()) {
                return Err(ConfigError::Invalid(format!("bootstrap server {b:?} is not host:port")));
            }
        }
        let sasl = if protocol.sasl() {
            let m = mechanism.unwrap_or_else(|| "GSSAPI".into());
            let mechanism = match m.to_ascii_uppercase().as_str() {
                "PLAIN" => Mechanism::Plain,
                "SCRAM-SHA-256" => Mechanism::ScramSha256,
                "SCRAM-SHA-512" => Mechanism::ScramSha512,
                other => {
                    return Err(ConfigError::Unsupported(format!(
                        "SASL mechanism {other} is not implemented by the native fetcher (PLAIN, SCRAM-SHA-256 and \
                         SCRAM-SHA-512 are)"
                    )))
                }
            };
            let (Some(username), Some(password)) = (username, password) else {
                return Err(ConfigError::Invalid(format!("SASL {m} needs sasl.username and sasl.password")));
            };
            Some(Sasl { mechanism, username, password })
        } else {
            None
        };
        if tls.certificate_location.is_some() != tls.key_location.is_some() {
            return Err(ConfigError::Invalid(
                "ssl.certificate.location and ssl.key.location go together (a client certificate needs its key)".into(),
            ));
        }
        if protocol.tls() && !cfg!(feature = "tls") {
            return Err(ConfigError::Unsupported("this build of the native fetcher has no TLS".into()));
        }
        Ok(ClientConfig {
            bootstrap,
            client_id,
            protocol,
            sasl,
            tls,
            request_timeout,
            attempt_timeout: attempt_timeout.min(request_timeout),
            stall_timeout,
            partition_max_bytes,
            fetch_max_wait: Duration::from_millis(100),
            connections_max_idle,
            connection_setup_timeout: connection_setup_timeout.min(attempt_timeout).min(request_timeout),
        })
    }

    /// The bootstrap list as one string, for messages.
    pub fn bootstrap_servers(&self) -> String {
        self.bootstrap.join(",")
    }
}

fn truthy(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(ConfigError::Invalid(format!("{key} must be true or false, got {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<ClientConfig, ConfigError> {
        ClientConfig::parse(pairs.iter().copied(), Duration::from_secs(1), Duration::from_secs(1))
    }

    #[test]
    fn plaintext_and_sasl_ssl() {
        let c = parse(&[("bootstrap.servers", "a:1, b:2"), ("acks", "all")]).unwrap();
        assert_eq!(c.bootstrap, vec!["a:1", "b:2"]);
        assert_eq!(c.protocol, Protocol::Plaintext);
        let c = parse(&[
            ("bootstrap.servers", "a:1"),
            ("security_protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
            ("ssl.ca.location", "/ca.pem"),
        ])
        .unwrap();
        assert_eq!(c.protocol, Protocol::SaslSsl);
        assert_eq!(c.sasl.as_ref().unwrap().mechanism, Mechanism::ScramSha512);
        assert!(!format!("{c:?}").contains("\"p\""), "the password is never printed");
    }

    #[test]
    fn other_mechanisms_and_keystores_are_unsupported() {
        for (k, v) in [("sasl.mechanism", "GSSAPI"), ("sasl.mechanism", "OAUTHBEARER")] {
            let e = parse(&[("bootstrap.servers", "a:1"), ("security.protocol", "SASL_PLAINTEXT"), (k, v)]);
            assert!(matches!(e, Err(ConfigError::Unsupported(ref m)) if m.contains(v)), "{e:?}");
        }
        for (k, v) in [
            ("ssl.ca.location", "/"),
            ("ssl.ca.location", "probe"),
            ("ssl.cipher.suites", "RC4-SHA"),
            ("ssl.curves.list", "P-521"),
            ("ssl.sigalgs.list", "RSA+SHA1"),
            ("ssl.key.password", "x"),
        ] {
            let e = parse(&[("bootstrap.servers", "a:1"), ("security.protocol", "SSL"), (k, v)]);
            assert!(matches!(e, Err(ConfigError::Unsupported(ref m)) if m.contains(k)), "{k}={v}: {e:?}");
        }
        let e = parse(&[("bootstrap.servers", "a:1"), ("ssl.keystore.location", "/k.p12")]);
        assert!(matches!(e, Err(ConfigError::Unsupported(ref m)) if m.contains("ssl.keystore.location")), "{e:?}");
        assert!(matches!(parse(&[("acks", "all")]), Err(ConfigError::Invalid(_))));
        assert!(matches!(parse(&[("bootstrap.servers", "nohost")]), Err(ConfigError::Invalid(_))));
    }

    #[test]
    fn connections_max_idle_defaults_below_the_broker_s_limit() {
        let c = parse(&[("bootstrap.servers", "a:1")]).unwrap();
        assert_eq!(c.connections_max_idle, Duration::from_secs(540));
        let c = parse(&[("bootstrap.servers", "a:1"), ("connections.max.idle.ms", "30000")]).unwrap();
        assert_eq!(c.connections_max_idle, Duration::from_secs(30));
        let c = parse(&[("bootstrap.servers", "a:1"), ("connections.max.idle.ms", "0")]).unwrap();
        assert_eq!(c.connections_max_idle, Duration::from_secs(540), "0 (librdkafka: never) is the default");
        assert!(matches!(
            parse(&[("bootstrap.servers", "a:1"), ("connections.max.idle.ms", "soon")]),
            Err(ConfigError::Invalid(_))
        ));
    }

    #[test]
    fn an_attempt_takes_a_third_of_a_call_s_budget_or_socket_timeout_ms() {
        let c = parse(&[("bootstrap.servers", "a:1")]).unwrap();
        assert_eq!((c.request_timeout, c.attempt_timeout), (Duration::from_secs(1), Duration::from_secs(1) / 3));
        let c = parse(&[("bootstrap.servers", "a:1"), ("socket.timeout.ms", "500")]).unwrap();
        assert_eq!(c.attempt_timeout, Duration::from_millis(500));
        let c = parse(&[("bootstrap.servers", "a:1"), ("socket.timeout.ms", "60000")]).unwrap();
        assert_eq!(c.attempt_timeout, Duration::from_secs(1), "at most the call's budget");
        assert!(matches!(
            parse(&[("bootstrap.servers", "a:1"), ("socket.timeout.ms", "0")]),
            Err(ConfigError::Invalid(_))
        ));
    }

    #[test]
    fn connection_setup_timeout_is_at_most_the_request_timeout() {
        let long = |pairs: &[(&str, &str)]| {
            ClientConfig::parse(pairs.iter().copied(), Duration::from_secs(30), Duration::from_secs(60)).unwrap()
        };
        assert_eq!(long(&[("bootstrap.servers", "a:1")]).connection_setup_timeout, Duration::from_secs(10));
        let c = long(&[("bootstrap.servers", "a:1"), ("socket.connection.setup.timeout.ms", "2500")]);
        assert_eq!(c.connection_setup_timeout, Duration::from_millis(2500));
        let c = parse(&[("bootstrap.servers", "a:1"), ("socket.connection.setup.timeout.ms", "2500")]).unwrap();
        assert_eq!(c.connection_setup_timeout, Duration::from_secs(1) / 3, "capped at an attempt's timeout");
    }
}
