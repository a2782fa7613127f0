//! TLS for broker connections with rustls (ring as the crypto provider): the
//! broker's certificate checked against `ssl.ca.location` (else the system's
//! bundle), its name checked unless `ssl.endpoint.identification.algorithm`
//! is `none`, and a client certificate when `ssl.certificate.location` and
//! `ssl.key.location` name one.

use std::net::TcpStream;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, RootCertStore, SignatureScheme, StreamOwned};

use super::config::Tls;
use super::KafkaError;

/// Where Debian, Ubuntu, RHEL and Alpine keep the system's CA bundle.
const SYSTEM_BUNDLES: &[&str] =
    &["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"];

fn config_err(broker: &str, msg: String) -> KafkaError {
    KafkaError::Config(format!("TLS to broker {broker}: {msg}"))
}

fn certs(path: &str, broker: &str) -> Result<Vec<CertificateDer<'static>>, KafkaError> {
    let certs: Result<Vec<_>, _> = CertificateDer::pem_file_iter(path)
        .map_err(|e| config_err(broker, format!("cannot read certificates from {path}: {e}")))?
        .collect();
    let certs =
        certs.map_err(|e| config_err(broker, format!("{path} holds a certificate that does not parse: {e}")))?;
    if certs.is_empty() {
        return Err(config_err(broker, format!("{path} holds no PEM certificate")));
    }
    Ok(certs)
}

/// The relaxed certificate checks librdkafka's properties can ask for: with
/// `chain` (`ssl.endpoint.identification.algorithm=none`) a certificate signed
/// by the CAs is accepted whatever name it carries; without it
/// (`enable.ssl.certificate.verification=false`) any certificate is. Either
/// way the handshake's signatures are still checked.
#[derive(Debug)]
struct Relaxed {
    provider: Arc<rustls::crypto::CryptoProvider>,
    chain: Option<Arc<rustls::client::WebPkiServerVerifier>>,
}

impl ServerCertVerifier for Relaxed {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else { return Ok(ServerCertVerified::assertion()) };
        match chain.verify_server_cert(end_entity, intermediates, name, ocsp, now) {
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            r => r,
        }
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &CertificateDer<'_>,
        d: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.provider.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The rustls client configuration for `tls` (built per connection: cheap
/// next to the handshake, and files changed on disk are picked up).
pub fn client_config(tls: &Tls, broker: &str) -> Result<Arc<ClientConfig>, KafkaError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| config_err(broker, e.to_string()))?;
    let builder = if !tls.verify_certificate {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Relaxed { provider: provider.clone(), chain: None }))
    } else {
        let mut roots = RootCertStore::empty();
        let bundle = match &tls.ca_location {
            Some(p) => p.clone(),
            None => {
                SYSTEM_BUNDLES.iter().find(|p| std::path::Path::new(p).exists()).map(|p| p.to_string()).ok_or_else(
                    || config_err(broker, "ssl.ca.location is not set and no system CA bundle was found".into()),
                )?
            }
        };
        for c in certs(&bundle, broker)? {
            roots.add(c).map_err(|e| config_err(broker, format!("{bundle}: a CA certificate is not usable: {e}")))?;
        }
        let roots = Arc::new(roots);
        if tls.verify_hostname {
            builder.with_root_certificates(roots)
        } else {
            let v = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| config_err(broker, e.to_string()))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Relaxed { provider: provider.clone(), chain: Some(v) }))
        }
    };
    let config = match (&tls.certificate_location, &tls.key_location) {
        (Some(cert), Some(key)) => {
            let chain = certs(cert, broker)?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| config_err(broker, format!("cannot read a PEM private key from {key}: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| config_err(broker, e.to_string()))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// Run the TLS handshake on `tcp` to `host`.
pub fn connect(
    mut tcp: TcpStream,
    host: &str,
    tls: &Tls,
    broker: &str,
) -> Result<StreamOwned<ClientConnection, TcpStream>, KafkaError> {
    let config = client_config(tls, broker)?;
    let name = ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_string())
        .map_err(|e| config_err(broker, format!("{host} is not a server name: {e}")))?;
    let mut conn = ClientConnection::new(config, name).map_err(|e| config_err(broker, e.to_string()))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| handshake_error(&e, host, broker))?;
    }
    Ok(StreamOwned::new(conn, tcp))
}

/// A failed handshake as [`KafkaError::TlsRefused`] where rustls refused
/// what OpenSSL (librdkafka) may accept, else as [`KafkaError::Tls`] (a
/// certificate no client accepts: an unknown CA, expired, a bad signature).
#[allow(deprecated)] // rustls 0.23 still reports some signature algorithms with the unit variant
fn handshake_error(e: &std::io::Error, host: &str, broker: &str) -> KafkaError {
    use rustls::{AlertDescription as A, CertificateError as C, Error as E};
    let failed = format!("broker {broker}: TLS handshake failed: {e}");
    let Some(r) = e.get_ref().and_then(|i| i.downcast_ref::<E>()) else { return KafkaError::Tls(failed) };
    let why = match r {
        E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => format!(
            "the broker's certificate does not name {host} in a subjectAltName (rustls ignores the subject's CN, \
             which OpenSSL falls back to)"
        ),
        E::InvalidCertificate(
            C::BadEncoding
            | C::UnsupportedSignatureAlgorithm
            | C::UnsupportedSignatureAlgorithmContext { .. }
            | C::UnhandledCriticalExtension
            | C::Other(_),
        )
        | E::UnsupportedNameType
        | E::PeerIncompatible(_)
        | E::AlertReceived(A::HandshakeFailure | A::ProtocolVersion | A::InsufficientSecurity | A::IllegalParameter) => {
            "rustls refused the broker's TLS setup (a protocol version, cipher suite, signature algorithm or \
             certificate encoding it does not support)"
                .to_string()
        }
        _ => return KafkaError::Tls(failed),
    };
    KafkaError::TlsRefused(format!("{failed}: {why}"))
}
