"""The native Kafka fetcher over SSL and SASL, against an Apache Kafka 4.4 broker of its own.

The test makes a CA, a broker certificate (for 127.0.0.1) and a client
certificate with ``openssl``, and starts a broker (``scripts/kafka-broker.sh``)
with four listeners: PLAINTEXT (to write), SSL requiring a client certificate,
SASL_PLAINTEXT and SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512
(credentials made through the admin API). Each restores the same store as a
PLAINTEXT restore, through the native fetcher, from the same confluent-kafka
style configuration the rest of the library takes; a wrong password or an
unknown CA is a clear error naming the broker. A fifth listener, advertised as
``localhost``, serves a certificate that names its host only in its CN (no
subjectAltName): OpenSSL accepts it, rustls does not, so the changelog
restores through confluent-kafka, saying why once.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from statestore import TopicPartition, restore_store
from statestore.errors import LogError
from support.kafka_broker import Broker, BrokerUnavailable, start_broker
from support.kafka_writes import settle
from support.model import store_difference

kafka = pytest.importorskip("statestore.changelog.kafka")
ck = pytest.importorskip("confluent_kafka")
KafkaChangelog = kafka.KafkaChangelog


USER, PASSWORD = "alice", "alice-secret"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(d: Path) -> None:
    """ca.pem; broker.pem (key and certificate for 127.0.0.1/localhost); client.crt and client.key."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=statestore test CA",
        cwd=d,
    )
    for name, ext in (
        ("broker", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        _openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            f"/CN={name}",
            cwd=d,
        )
        (d / f"{name}.ext").write_text(ext + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
        # PKCS#8 keys (what Kafka's PEM key store and rustls both read)
        _openssl("pkcs8", "-topk8", "-nocrypt", "-in", f"{name}.key", "-out", f"{name}.p8", cwd=d)
    (d / "broker.pem").write_text((d / "broker.p8").read_text() + (d / "broker.crt").read_text())
    # A v3 certificate for localhost with no subjectAltName: the host only in the subject's CN.
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "cn.key",
        "-out",
        "cn.csr",
        "-subj",
        "/CN=localhost",
        cwd=d,
    )
    (d / "cn.ext").write_text("basicConstraints=CA:FALSE\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        "cn.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "cn.crt",
        "-days",
        "2",
        "-extfile",
        "cn.ext",
        cwd=d,
    )
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "cn.key", "-out", "cn.p8", cwd=d)
    (d / "cn.pem").write_text((d / "cn.p8").read_text() + (d / "cn.crt").read_text())


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, dict[str, str], Path]]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    certs = tmp_path_factory.mktemp("certs")
    _certificates(certs)
    jaas_plain = f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";'
    jaas_scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    props = [
        "listeners=PLAINTEXT://127.0.0.1:@PORT@,CONTROLLER://127.0.0.1:@CPORT@,SSL://127.0.0.1:@PORT1@,"
        "SASL_PLAINTEXT://127.0.0.1:@PORT2@,SASL_SSL://127.0.0.1:@PORT3@,SSL_CN://127.0.0.1:@PORT4@",
        "advertised.listeners=PLAINTEXT://127.0.0.1:@PORT@,SSL://127.0.0.1:@PORT1@,"
        "SASL_PLAINTEXT://127.0.0.1:@PORT2@,SASL_SSL://127.0.0.1:@PORT3@,SSL_CN://localhost:@PORT4@",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,"
        "SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,SSL_CN:SSL",
        "listener.name.ssl_cn.ssl.keystore.type=PEM",
        f"listener.name.ssl_cn.ssl.keystore.location={certs / 'cn.pem'}",
        "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={certs / 'broker.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={certs / 'ca.pem'}",
        "listener.name.ssl.ssl.client.auth=required",
    ]
    for listener in ("sasl_plaintext", "sasl_ssl"):
        props.append(f"listener.name.{listener}.plain.sasl.jaas.config={jaas_plain}")
        props.append(f"listener.name.{listener}.scram-sha-256.sasl.jaas.config={jaas_scram}")
        props.append(f"listener.name.{listener}.scram-sha-512.sasl.jaas.config={jaas_scram}")
    try:
        broker = start_broker(tmp_path_factory.mktemp("secure-broker"), props)
    except BrokerUnavailable as e:
        pytest.fail(f"the SSL/SASL broker did not start: {e}")
    text = (broker.dir / "server.properties").read_text()
    adv = next(line for line in text.splitlines() if line.startswith("advertised.listeners="))
    ports = {
        name: hostport.removeprefix("//")
        for name, hostport in (x.split(":", 1) for x in adv.split("=", 1)[1].split(","))
    }
    # SCRAM credentials, through the admin API on the PLAINTEXT listener.
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for m in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):  # one change per user and request
        up = UserScramCredentialUpsertion(USER, ScramCredentialInfo(m, 4096), PASSWORD.encode())
        for fut in admin.alter_user_scram_credentials([up]).values():
            fut.result(30)
    yield broker, ports, certs
    broker.stop()


def _same_store(a: Path, b: Path) -> None:
    diff = store_difference(a, b)
    assert diff is None, diff


def test_ssl_and_sasl_restores_are_native_and_equal_to_plaintext(secure_broker: Any, tmp_path: Path) -> None:
    broker, ports, certs = secure_broker
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    with KafkaChangelog(broker.bootstrap, request_timeout=20.0) as plain:
        plain.create_topics({topic: 1})
        p = plain.producer("sec")
        for t in range(20):
            p.begin()
            for i in range(200):
                p.send(topic, 0, b"k%04d" % ((t * 37 + i) % 500), b"v%d-%d" % (t, i))
            if t % 4 == 3:
                # delivered first: an abort before delivery can race the client's AddPartitionsToTxn
                # (INVALID_TXN_STATE), and would purge the records instead of aborting them in the log
                p.flush()
                p.abort()
            else:
                p.commit()
        p.close()
        settle(plain, tp)
        ref = restore_store(tmp_path / "plain", plain, tp)
    ssl = {"ssl.ca.location": str(certs / "ca.pem")}
    client_cert = {
        "ssl.certificate.location": str(certs / "client.crt"),
        "ssl.key.location": str(certs / "client.p8"),
    }
    sasl = {"sasl.username": USER, "sasl.password": PASSWORD}
    cases: dict[str, tuple[str, dict[str, str]]] = {
        "ssl-client-cert": (ports["SSL"], {"security.protocol": "SSL", **ssl, **client_cert}),
        "sasl-plain": (
            ports["SASL_PLAINTEXT"],
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", **sasl},
        ),
        "scram-256": (
            ports["SASL_PLAINTEXT"],
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-256", **sasl},
        ),
        "scram-512-ssl": (
            ports["SASL_SSL"],
            {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", **sasl, **ssl},
        ),
    }
    for name, (bootstrap, conf) in cases.items():
        with KafkaChangelog(bootstrap, request_timeout=10.0, restore_stall_timeout=10.0, **conf) as c:
            assert c.native is not None, name
            assert c.offsets(tp) == (0, ref.end_offset, ref.end_offset), name
            r = restore_store(tmp_path / name, c, tp)
            assert (r.records_applied, r.offset, r.records_skipped) == (
                ref.records_applied,
                ref.offset,
                ref.records_skipped,
            ), name
            _same_store(tmp_path / "plain", tmp_path / name)

    bad = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": USER,
        "sasl.password": "wrong",
        **ssl,
    }
    with KafkaChangelog(ports["SASL_SSL"], request_timeout=5.0, **bad) as c:
        with pytest.raises(LogError, match=r"SASL authentication failed") as e:
            c.offsets(tp)
        assert ports["SASL_SSL"] in str(e.value)
    other_ca = tmp_path / "other-ca"
    other_ca.mkdir()
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "k",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=another CA",
        cwd=other_ca,
    )
    with KafkaChangelog(
        ports["SSL"],
        request_timeout=5.0,
        **{"security.protocol": "SSL", "ssl.ca.location": str(other_ca / "ca.pem"), **client_cert},
    ) as c:
        with pytest.raises(LogError, match=r"TLS handshake failed") as e:
            c.offsets(tp)
        assert ports["SSL"] in str(e.value)


def test_a_tls_setup_rustls_refuses_restores_through_confluent_kafka_saying_why_once(
    secure_broker: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broker, ports, certs = secure_broker
    topic = f"cn-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    with KafkaChangelog(broker.bootstrap, request_timeout=20.0) as plain:
        plain.create_topics({topic: 1})
        p = plain.producer("cn")
        for t in range(6):
            p.begin()
            for i in range(100):
                p.send(topic, 0, b"k%03d" % ((t * 31 + i) % 150), b"v%d-%d" % (t, i))
            if t % 3 == 2:
                p.flush()  # delivered first, as above
                p.abort()
            else:
                p.commit()
        p.close()
        settle(plain, tp)
        ref = restore_store(tmp_path / "plain", plain, tp)
    conf = {"security.protocol": "SSL", "ssl.ca.location": str(certs / "ca.pem")}
    # The native fetcher alone: rustls refuses the certificate.
    from statestore import _native

    native = _native.KafkaClient({"bootstrap.servers": ports["SSL_CN"], **conf}, 5.0, 5.0)
    assert "subjectAltName" in (native.tls_refused() or "")
    with pytest.raises(LogError, match=r"TLS handshake failed"):
        native.offsets(topic, 0)
    # The changelog: confluent-kafka, one log line naming the server and the reason.
    with caplog.at_level(logging.WARNING, logger="statestore.changelog.kafka.source"):
        with KafkaChangelog(ports["SSL_CN"], request_timeout=10.0, restore_stall_timeout=10.0, **conf) as c:
            assert c.native is None
            assert c.offsets(tp) == (0, ref.end_offset, ref.end_offset)
            r = restore_store(tmp_path / "cn", c, tp)
            assert (r.records_applied, r.offset) == (ref.records_applied, ref.offset)
            _same_store(tmp_path / "plain", tmp_path / "cn")
    lines = [r.getMessage() for r in caplog.records if "through confluent-kafka" in r.getMessage()]
    assert len(lines) == 1, lines
    assert ports["SSL_CN"] in lines[0] and "subjectAltName" in lines[0], lines[0]
    # A CA directory (OpenSSL's hashed directory) is known to be unsupported without a connection.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="statestore.changelog.kafka.source"):
        with KafkaChangelog(ports["SSL"], **{"security.protocol": "SSL", "ssl.ca.location": str(certs)}) as c:
            assert c.native is None
    lines = [r.getMessage() for r in caplog.records if "through confluent-kafka" in r.getMessage()]
    assert len(lines) == 1 and "ssl.ca.location" in lines[0], lines
