//! A Kafka fetcher for restoration: the broker's bytes straight into the
//! restore engine.
//!
//! It does what a restore needs and nothing else -- ApiVersions, SASL,
//! Metadata (the leader of each changelog partition), ListOffsets (earliest,
//! latest, and the last stable offset under read_committed) and Fetch with
//! `isolation_level=read_committed` -- over the `kafka-protocol` crate's
//! messages. A fetch response's records stay one zero-copy slice of the
//! response buffer; [`fetch::FetchCursor`] walks its batches with the codec
//! the segment log uses (CRC-32C checked, every compression), drops the
//! transactions the broker lists as aborted and the control batches exactly
//! as Kafka's own consumer does, and feeds committed records to the engine's
//! sink. A restore's fetches run on a fetch thread per partition (a
//! client's network thread), ahead of the decoding; the restores of a
//! `restore_many` job share one per broker instead, and one Fetch names all
//! the job's partitions that broker leads ([`session`]). So
//! [`client::KafkaClient`] is a [`crate::source::Changelog`]
//! like the segment log: replay, bulk, the thread pool, the state updater and
//! Spark tasks all run on it unchanged.
//!
//! Module map: [`config`] (confluent-kafka style properties), [`conn`] (one
//! broker connection: framing, versions, SASL), [`scram`], `tls` (rustls),
//! [`client`] (metadata, leaders, offsets, connection pool, retries),
//! [`fetch`] (fetch responses -> committed records, one partition's
//! fetcher), [`session`] (the fetch threads a job's restores share, one per
//! broker), [`frames`] (reused buffers for large responses), [`produce`]
//! (synthetic changelogs written over Produce, for benchmarks and tests).

pub mod client;
pub mod config;
pub mod conn;
pub mod fetch;
pub mod frames;
pub mod produce;
pub mod scram;
pub mod session;
#[cfg(feature = "tls")]
pub mod tls;

#[cfg(test)]
mod tests;

pub use client::KafkaClient;
pub use config::{ClientConfig, ConfigError};

use crate::source::{LogError, LogErrorKind};

/// Why a Kafka call failed. Every message names the broker, and where known
/// the topic, partition and offset.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KafkaError {
    /// The configuration cannot be used (a file that does not read...).
    #[error("{0}")]
    Config(String),
    /// The connection failed or broke (retried until the deadline).
    #[error("{0}")]
    Io(String),
    /// No answer within the request timeout.
    #[error("{0}")]
    Timeout(String),
    /// The TLS handshake failed.
    #[error("{0}")]
    Tls(String),
    /// The TLS handshake failed on something rustls refuses and OpenSSL may
    /// accept (a certificate naming the host only in its CN, a protocol
    /// version or cipher suite rustls does not offer, a signature algorithm
    /// it does not verify): a reason to restore through confluent-kafka.
    #[error("{0}")]
    TlsRefused(String),
    /// SASL authentication failed.
    #[error("{0}")]
    Auth(String),
    /// The broker answered something that is not the Kafka protocol.
    #[error("{0}")]
    Protocol(String),
    /// The broker answered with an error code.
    #[error("{message}")]
    Broker { code: i16, message: String },
    /// The cluster does not know the topic (metadata says so): retried
    /// within the request budget (a topic being created), then reported.
    #[error("{0}")]
    NoTopic(String),
    /// The offset asked for is not in the log (truncated, deleted, recreated).
    #[error("{0}")]
    OutOfRange(String),
    /// A fetched batch is damaged (bad CRC, bad header, records that do not decode).
    #[error("{0}")]
    Corrupt(String),
    /// A fetched batch uses a codec this build cannot decode.
    #[error("{0}")]
    UnsupportedCompression(String),
}

impl KafkaError {
    /// Worth a metadata refresh, a reconnect and another try.
    pub fn retriable(&self) -> bool {
        match self {
            KafkaError::Io(_) | KafkaError::Timeout(_) | KafkaError::NoTopic(_) => true,
            KafkaError::Broker { code, .. } => conn::retriable(*code),
            _ => false,
        }
    }

    /// The same error with `context` in front of its message.
    pub fn context(self, context: &str) -> Self {
        let c = |m: String| format!("{context}: {m}");
        match self {
            KafkaError::Config(m) => KafkaError::Config(c(m)),
            KafkaError::Io(m) => KafkaError::Io(c(m)),
            KafkaError::Timeout(m) => KafkaError::Timeout(c(m)),
            KafkaError::Tls(m) => KafkaError::Tls(c(m)),
            KafkaError::TlsRefused(m) => KafkaError::TlsRefused(c(m)),
            KafkaError::Auth(m) => KafkaError::Auth(c(m)),
            KafkaError::Protocol(m) => KafkaError::Protocol(c(m)),
            KafkaError::Broker { code, message } => KafkaError::Broker { code, message: c(message) },
            KafkaError::OutOfRange(m) => KafkaError::OutOfRange(c(m)),
            KafkaError::NoTopic(m) => KafkaError::NoTopic(c(m)),
            KafkaError::Corrupt(m) => KafkaError::Corrupt(c(m)),
            KafkaError::UnsupportedCompression(m) => KafkaError::UnsupportedCompression(c(m)),
        }
    }
}

impl From<KafkaError> for LogError {
    fn from(e: KafkaError) -> Self {
        match e {
            KafkaError::Corrupt(m) => LogError::new(LogErrorKind::Corrupt, m),
            KafkaError::UnsupportedCompression(m) => LogError::new(LogErrorKind::UnsupportedCompression, m),
            KafkaError::OutOfRange(m) => LogError::new(LogErrorKind::OutOfRange, m),
            e @ (KafkaError::Io(_) | KafkaError::Timeout(_) | KafkaError::Broker { .. }) if e.retriable() => {
                LogError::new(LogErrorKind::Unavailable, e.to_string())
            }
            e => LogError::other(e.to_string()),
        }
    }
}
