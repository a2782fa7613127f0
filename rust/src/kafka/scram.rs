//! SASL SCRAM-SHA-256/512 (RFC 5802, RFC 7677) on the client side: the three
//! messages a Kafka broker expects, and the check of its final signature, so a
//! broker that does not know the password is refused too.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};

use super::config::Mechanism;

/// One SCRAM exchange.
pub struct Scram {
    mechanism: Mechanism,
    username: String,
    password: String,
    nonce: String,
    client_first_bare: String,
    /// `(auth message, salted password)` once the server's first message is in.
    state: Option<(String, Vec<u8>)>,
}

/// `=` and `,` escaped as RFC 5802 asks of a user name.
fn saslname(s: &str) -> String {
    s.replace('=', "=3D").replace(',', "=2C")
}

fn random_nonce() -> String {
    let mut b = [0u8; 24];
    // The kernel's random bytes; the time and the address of a local as a last resort.
    if std::fs::File::open("/dev/urandom").and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b)).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let x = &b as *const _ as usize as u128;
        b[..16].copy_from_slice(&(t ^ x.rotate_left(64)).to_le_bytes());
    }
    B64.encode(b).replace(['+', '/', '='], "x")
}

impl Scram {
    pub fn new(mechanism: Mechanism, username: &str, password: &str) -> Self {
        Self::with_nonce(mechanism, username, password, random_nonce())
    }

    pub fn with_nonce(mechanism: Mechanism, username: &str, password: &str, nonce: String) -> Self {
        let client_first_bare = format!("n={},r={nonce}", saslname(username));
        Scram {
            mechanism,
            username: username.to_string(),
            password: password.to_string(),
            nonce,
            client_first_bare,
            state: None,
        }
    }

    /// The client-first message.
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    fn hmac(&self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self.mechanism {
            Mechanism::ScramSha512 => {
                let mut m = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
            _ => {
                let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key");
                m.update(data);
                m.finalize().into_bytes().to_vec()
            }
        }
    }

    fn hash(&self, data: &[u8]) -> Vec<u8> {
        match self.mechanism {
            Mechanism::ScramSha512 => Sha512::digest(data).to_vec(),
            _ => Sha256::digest(data).to_vec(),
        }
    }

    fn salted(&self, salt: &[u8], iterations: u32) -> Vec<u8> {
        match self.mechanism {
            Mechanism::ScramSha512 => {
                let mut out = vec![0u8; 64];
                pbkdf2::pbkdf2::<Hmac<Sha512>>(self.password.as_bytes(), salt, iterations, &mut out)
                    .expect("HMAC takes any key");
                out
            }
            _ => {
                let mut out = vec![0u8; 32];
                pbkdf2::pbkdf2::<Hmac<Sha256>>(self.password.as_bytes(), salt, iterations, &mut out)
                    .expect("HMAC takes any key");
                out
            }
        }
    }

    /// The client-final message for the server-first message `server_first`.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, String> {
        let sf = std::str::from_utf8(server_first).map_err(|_| "the server's first SCRAM message is not UTF-8")?;
        let mut nonce = None;
        let mut salt = None;
        let mut iterations = None;
        for part in sf.split(',') {
            match part.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(B64.decode(v).map_err(|e| format!("the salt is not base64: {e}"))?),
                Some(("i", v)) => iterations = v.parse::<u32>().ok(),
                Some(("e", v)) => return Err(format!("the server refused: {v}")),
                _ => {}
            }
        }
        let (Some(nonce), Some(salt), Some(iterations)) = (nonce, salt, iterations) else {
            return Err(format!("the server's first SCRAM message {sf:?} lacks r, s or i"));
        };
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend the client's".into());
        }
        if !(1..=10_000_000).contains(&iterations) {
            return Err(format!("the server asks for {iterations} iterations"));
        }
        let salted = self.salted(&salt, iterations);
        let client_key = self.hmac(&salted, b"Client Key");
        let stored_key = self.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{sf},{without_proof}", self.client_first_bare);
        let signature = self.hmac(&stored_key, auth.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        self.state = Some((auth, salted));
        let _ = &self.username;
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Check the server-final message: the server proves it knows the password too.
    pub fn verify_server_final(&self, server_final: &[u8]) -> Result<(), String> {
        let Some((auth, salted)) = &self.state else { return Err("SCRAM messages out of order".into()) };
        let sf = std::str::from_utf8(server_final).map_err(|_| "the server's final SCRAM message is not UTF-8")?;
        if let Some(e) = sf.strip_prefix("e=") {
            return Err(format!("the server refused: {e}"));
        }
        let v =
            sf.split(',').find_map(|p| p.strip_prefix("v=")).ok_or("the server's final message has no signature")?;
        let server_key = self.hmac(salted, b"Server Key");
        let expected = self.hmac(&server_key, auth.as_bytes());
        if B64.decode(v).ok().as_deref() != Some(expected.as_slice()) {
            return Err("the server's signature is wrong: it does not know the password".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example.
    #[test]
    fn rfc7677_example() {
        let mut s = Scram::with_nonce(Mechanism::ScramSha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(s.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let fin = s
            .client_final(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert_eq!(
            String::from_utf8(fin).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        s.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
        assert!(s.verify_server_final(b"v=AAAA").is_err());
        assert!(s.verify_server_final(b"e=invalid-proof").is_err());
    }

    #[test]
    fn a_nonce_not_extending_ours_is_refused() {
        let mut s = Scram::with_nonce(Mechanism::ScramSha512, "a,b", "pw", "abc".into());
        assert_eq!(s.client_first(), b"n,,n=a=2Cb,r=abc");
        assert!(s.client_final(b"r=xyz,s=AAAA,i=4096").is_err());
    }
}
