"""`mqcore serve` with TLS, SASL (PLAIN, SCRAM-SHA-256) and topic ACLs, proven with clients we
did not write (confluent-kafka/librdkafka and kafka-python over SASL_SSL, against certificates
made here by trustme), and at the frame level over raw sockets for what a client library would
never send: requests before authentication, a bad SCRAM proof, malformed SASL bytes."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import secrets
import socket
import ssl
import struct
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafkaclients
import pytest
from conftest import child_env
from kafkaclients import recv_exactly

import mqcore
from mqcore.errors import InvalidConfigError

server_mod = pytest.importorskip("mqcore.server", reason="the server extra (kio) is missing")
ck = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
trustme = pytest.importorskip("trustme")
from confluent_kafka.admin import AdminClient  # noqa: E402

from mqcore.server import Server  # noqa: E402
from mqcore.server.auth import Authorizer, ScramCredential, add_user, load_credentials  # noqa: E402

WAIT = 30.0
PASSWORDS = {"alice": "alice-secret-Pa55", "reader": "reader-secret-9x", "nobody": "n0-b0dy-pw"}
ACL = """
# user   operations          resources
alice    read,write,create   *
alice    all                 group:*
reader   read                orders*     # a prefix: describe comes with read
reader   read                group:*     # any consumer group
nobody   describe            elsewhere   # an exact name
"""
TOPIC_AUTHORIZATION_FAILED = 29
SASL_AUTHENTICATION_FAILED = 58
ILLEGAL_SASL_STATE = 34


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA and a server certificate for 127.0.0.1 and localhost, as PEM files."""
    d = tmp_path_factory.mktemp("certs")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(d / "cert.pem"), append=True)
    return {"ca": str(d / "ca.pem"), "cert": str(d / "cert.pem"), "key": str(d / "key.pem")}


@pytest.fixture
def security_files(tmp_path: Path) -> dict[str, str]:
    users = tmp_path / "users.jsonl"
    for user, password in PASSWORDS.items():
        add_user(users, user, password)
    acl = tmp_path / "acl.txt"
    acl.write_text(ACL)
    return {"users": str(users), "acl": str(acl)}


@pytest.fixture
def secure_server(
    store: mqcore.Store, certs: dict[str, str], security_files: dict[str, str]
) -> Iterator[Any]:
    """SASL_SSL: TLS, SASL (both mechanisms) and the ACL above."""
    with Server(
        store, "127.0.0.1:0", tls_cert=certs["cert"], tls_key=certs["key"],
        sasl_credentials=security_files["users"], acl=security_files["acl"],
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture
def sasl_server(store: mqcore.Store, security_files: dict[str, str]) -> Iterator[Any]:
    """SASL without TLS (SASL_PLAINTEXT), for the raw-socket tests."""
    with Server(
        store, "127.0.0.1:0", sasl_credentials=security_files["users"], acl=security_files["acl"]
    ) as srv:
        yield srv


def confluent_config(
    srv: Any, certs: dict[str, str], user: str, password: str, mechanism: str
) -> dict[str, Any]:
    return {
        "bootstrap.servers": srv.bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": certs["ca"],
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


def produce_confluent(config: dict[str, Any], topic: str, values: list[bytes]) -> list[Any]:
    """Produce `values`; the delivery reports (each a KafkaError or None) in order."""
    reports: list[Any] = []
    p = ck.Producer({**config, "message.timeout.ms": int(WAIT * 1000)})
    for v in values:
        p.produce(topic, v, partition=0, on_delivery=lambda err, msg: reports.append(err))
    left = p.flush(WAIT)
    assert left == 0, f"{left} messages undelivered"
    return reports


def consume_confluent(config: dict[str, Any], topic: str, n: int) -> list[bytes]:
    """The values of the first `n` messages of partition 0."""
    return [m.value() for m in kafkaclients.consume_confluent(config, topic, 1, n)]


def first_error(config: dict[str, Any]) -> Any:
    """The first error librdkafka reports for a client that tries to connect (via error_cb)."""
    errors: list[Any] = []
    p = ck.Producer({**config, "error_cb": errors.append})
    try:
        deadline = time.monotonic() + WAIT
        while not errors and time.monotonic() < deadline:
            p.poll(0.2)
        assert errors, "no error reported"
        return errors[0]
    finally:
        p.flush(0)


# -- real clients over SASL_SSL -----------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_right_credentials_produce_and_consume_over_sasl_ssl(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store, mechanism: str
) -> None:
    config = confluent_config(secure_server, certs, "alice", PASSWORDS["alice"], mechanism)
    values = [f"value-{i}".encode() for i in range(50)]
    assert produce_confluent(config, "secure", values) == [None] * 50
    assert [m.value for m in store.read("secure", 0, 0, 100)] == values
    assert consume_confluent(config, "secure", 50) == values


def test_kafka_python_produces_and_consumes_over_sasl_ssl_with_scram(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store
) -> None:
    options = {
        "bootstrap_servers": secure_server.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": certs["ca"],
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORDS["alice"],
    }
    producer = kafka.KafkaProducer(**options)
    try:
        for i in range(10):
            producer.send("kp", f"kp-{i}".encode(), partition=0).get(timeout=WAIT)
    finally:
        producer.close()
    values = [f"kp-{i}".encode() for i in range(10)]
    assert [m.value for m in store.read("kp", 0, 0, 100)] == values
    consumer = kafka.KafkaConsumer(
        **options, auto_offset_reset="earliest", enable_auto_commit=False,
        consumer_timeout_ms=int(WAIT * 1000),
    )  # fmt: skip
    try:
        consumer.assign([kafka.TopicPartition("kp", 0)])
        got = []
        for m in consumer:
            got.append(m.value)
            if len(got) == 10:
                break
    finally:
        consumer.close()
    assert got == values


def test_aiokafka_produces_and_consumes_over_sasl_ssl_with_scram(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store
) -> None:
    aiokafka = pytest.importorskip("aiokafka")
    from aiokafka.helpers import create_ssl_context

    options = {
        "bootstrap_servers": secure_server.bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=certs["ca"]),
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORDS["alice"],
    }
    values = [f"aio-{i}".encode() for i in range(10)]

    async def run() -> list[bytes]:
        producer = aiokafka.AIOKafkaProducer(**options)
        await producer.start()
        try:
            for v in values:
                await producer.send_and_wait("aio", v, partition=0)
        finally:
            await producer.stop()
        consumer = aiokafka.AIOKafkaConsumer(**options, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition("aio", 0)])
            await consumer.seek_to_beginning()
            got: list[bytes] = []
            while len(got) < len(values):
                batch = await consumer.getmany(timeout_ms=int(WAIT * 1000))
                assert batch, "no messages within WAIT"
                got += [m.value for msgs in batch.values() for m in msgs]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == values
    assert [m.value for m in store.read("aio", 0, 0, 100)] == values


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_kafka_python_as_a_0_11_client_authenticates_with_bare_tokens(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store, mechanism: str
) -> None:
    """kafka-python told the broker is Kafka 0.11 uses SaslHandshake v0 and bare tokens."""
    producer = kafka.KafkaProducer(
        bootstrap_servers=secure_server.bootstrap, api_version=(0, 11),
        security_protocol="SASL_SSL", ssl_cafile=certs["ca"], sasl_mechanism=mechanism,
        sasl_plain_username="alice", sasl_plain_password=PASSWORDS["alice"],
    )  # fmt: skip
    try:
        producer.send("legacy", b"old-client", partition=0).get(timeout=WAIT)
    finally:
        producer.close()
    assert [m.value for m in store.read("legacy", 0, 0, 10)] == [b"old-client"]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_a_wrong_password_is_refused_with_an_authentication_error(
    secure_server: Any, certs: dict[str, str], mechanism: str
) -> None:
    config = confluent_config(secure_server, certs, "alice", "not-her-password", mechanism)
    assert first_error(config).name() == "_AUTHENTICATION"  # librdkafka's local code


def test_an_unknown_user_is_refused_with_an_authentication_error(
    secure_server: Any, certs: dict[str, str]
) -> None:
    config = confluent_config(secure_server, certs, "mallory", "whatever", "SCRAM-SHA-256")
    assert first_error(config).name() == "_AUTHENTICATION"  # librdkafka's local code


def test_a_client_without_tls_is_refused(secure_server: Any, certs: dict[str, str]) -> None:
    """librdkafka speaking SASL_PLAINTEXT to the TLS port gets no answer, only a closed
    connection; so does a raw Kafka request in clear text."""
    config = confluent_config(secure_server, certs, "alice", PASSWORDS["alice"], "PLAIN")
    config["security.protocol"] = "SASL_PLAINTEXT"
    del config["ssl.ca.location"]
    with pytest.raises(ck.KafkaException):
        AdminClient(config).list_topics(timeout=5)
    with socket.create_connection(secure_server.address, timeout=WAIT) as sock:
        sock.sendall(frame(api_versions_request(1)))
        data = read_until_closed(sock)
        # whatever comes back is a TLS alert (record type 21), never a Kafka response
        assert data == b"" or data[0] == 21


def test_a_principal_with_read_only_acls_gets_topic_authorization_failed_on_produce(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store
) -> None:
    store.create_topic("orders", 1)
    store.append("orders", b"from-the-api", partition=0)
    reader = confluent_config(secure_server, certs, "reader", PASSWORDS["reader"], "PLAIN")
    reports = produce_confluent(reader, "orders", [b"x", b"y"])
    assert [r.code() for r in reports] == [ck.KafkaError.TOPIC_AUTHORIZATION_FAILED] * 2
    assert [m.value for m in store.read("orders", 0, 0, 100)] == [b"from-the-api"]
    # what it may do, it can: read
    assert consume_confluent(reader, "orders", 1) == [b"from-the-api"]


def test_metadata_leaves_out_topics_a_principal_may_not_describe(
    secure_server: Any, certs: dict[str, str], store: mqcore.Store
) -> None:
    for name in ("orders-eu", "elsewhere", "secret"):
        store.create_topic(name, 1)

    def visible(user: str) -> set[str]:
        config = confluent_config(secure_server, certs, user, PASSWORDS[user], "SCRAM-SHA-256")
        return set(AdminClient(config).list_topics(timeout=WAIT).topics)

    assert visible("alice") == {"orders-eu", "elsewhere", "secret"}
    assert visible("reader") == {"orders-eu"}
    assert visible("nobody") == {"elsewhere"}


# -- raw frames ---------------------------------------------------------------------------------


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def header(key: int, version: int, correlation: int) -> bytes:
    return struct.pack(">hhih", key, version, correlation, 1) + b"t"


def api_versions_request(correlation: int) -> bytes:
    return header(18, 0, correlation)


def call(sock: socket.socket, payload: bytes) -> bytes:
    """Send one request, return the response's payload after its correlation ID."""
    sock.sendall(frame(payload))
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)[4:]


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as closed)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def handshake(sock: socket.socket, mechanism: str) -> int:
    """SaslHandshake v1; its error code."""
    m = mechanism.encode()
    body = call(sock, header(17, 1, 7) + struct.pack(">h", len(m)) + m)
    return int(struct.unpack_from(">h", body)[0])


def authenticate(sock: socket.socket, data: bytes) -> tuple[int, str | None, bytes]:
    """SaslAuthenticate v0: (error code, error message, server's bytes)."""
    body = call(sock, header(36, 0, 8) + struct.pack(">i", len(data)) + data)
    code, size = struct.unpack_from(">hh", body)
    message = None if size < 0 else body[4 : 4 + size].decode()
    at = 4 + max(size, 0)
    (n,) = struct.unpack_from(">i", body, at)
    return code, message, body[at + 4 : at + 4 + n]


def metadata_request(correlation: int) -> bytes:
    return header(3, 1, correlation) + struct.pack(">i", -1)  # v1: all topics


def scram_client_final(
    first_bare: str, server_first: str, password: str, nonce_prefix: str = ""
) -> tuple[str, bytes]:
    """RFC 5802's client side, written from the RFC for these tests: the client-final-message
    and the ServerSignature a genuine server must send back. `nonce_prefix` goes before the
    nonce in r= (librdkafka before 2.6.1 repeated its own nonce there)."""
    parts = dict(p.split("=", 1) for p in server_first.split(","))
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(parts["s"]), int(parts["i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={nonce_prefix}{parts['r']}"
    auth_message = f"{first_bare},{server_first},{without_proof}".encode()
    signature = hmac.new(stored_key, auth_message, hashlib.sha256).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    server_signature = hmac.new(server_key, auth_message, hashlib.sha256).digest()
    return (
        f"{without_proof},p={base64.b64encode(proof).decode()}",
        b"v=" + base64.b64encode(server_signature),
    )


def test_a_request_before_authentication_closes_the_connection(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        # ApiVersions is answered before authentication (clients need it to pick versions)
        assert call(sock, api_versions_request(1))[:2] == b"\0\0"
        sock.sendall(frame(metadata_request(2)))
        assert read_until_closed(sock) == b""


def test_raw_scram_exchange_authenticates_and_proves_the_server(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake(sock, "SCRAM-SHA-256") == 0
        first_bare = f"n=alice,r={secrets.token_urlsafe(18)}"
        code, _, server_first = authenticate(sock, f"n,,{first_bare}".encode())
        assert code == 0
        final, expected_signature = scram_client_final(
            first_bare, server_first.decode(), PASSWORDS["alice"]
        )
        code, message, server_final = authenticate(sock, final.encode())
        assert (code, message, server_final) == (0, None, expected_signature)
        body = call(sock, metadata_request(3))  # now answered
        assert len(body) > 0


@pytest.mark.parametrize(("prefix", "accepted"), [("", True), ("*", False)])
def test_a_client_final_nonce_is_taken_as_kafka_takes_it(
    sasl_server: Any, prefix: str, accepted: bool
) -> None:
    """librdkafka before 2.6.1 (kcat 1.7.1, rsyslog's omkafka: every Debian 12 program) sends
    its own nonce again in front of the server's in the client-final message (librdkafka PR
    #4895). Kafka 3.8.1+ checks that the nonce ends with the server's, so takes it: so does
    mqcore (it wanted equality and refused them). A nonce that does not end with the
    server's is refused."""
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake(sock, "SCRAM-SHA-256") == 0
        client_nonce = secrets.token_urlsafe(18)
        first_bare = f"n=alice,r={client_nonce}"
        code, _, server_first = authenticate(sock, f"n,,{first_bare}".encode())
        assert code == 0
        repeated = client_nonce if accepted else client_nonce + prefix
        final, signature = scram_client_final(
            first_bare, server_first.decode(), PASSWORDS["alice"], nonce_prefix=repeated
        )
        if not accepted:  # a nonce that no longer ends with the server's
            final = final.replace(",p=", "x,p=", 1)
        code, message, server_final = authenticate(sock, final.encode())
        if accepted:
            assert (code, server_final) == (0, signature)
        else:
            assert code == SASL_AUTHENTICATION_FAILED and "nonce" in (message or "")


def handshake_v0(sock: socket.socket, mechanism: str) -> int:
    m = mechanism.encode()
    body = call(sock, header(17, 0, 9) + struct.pack(">h", len(m)) + m)
    return int(struct.unpack_from(">h", body)[0])


def raw_token(sock: socket.socket, data: bytes) -> bytes:
    """A bare size-prefixed SASL token (after SaslHandshake v0) and the server's reply."""
    sock.sendall(frame(data))
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def test_handshake_v0_takes_bare_tokens_for_both_mechanisms(sasl_server: Any) -> None:
    """Kafka before 1.0: after SaslHandshake v0 the SASL messages are bare tokens."""
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake_v0(sock, "PLAIN") == 0
        assert raw_token(sock, b"\0reader\0" + PASSWORDS["reader"].encode()) == b""
        assert len(call(sock, metadata_request(2))) > 0
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake_v0(sock, "SCRAM-SHA-256") == 0
        first_bare = f"n=alice,r={secrets.token_urlsafe(18)}"
        server_first = raw_token(sock, f"n,,{first_bare}".encode()).decode()
        final, signature = scram_client_final(first_bare, server_first, PASSWORDS["alice"])
        assert raw_token(sock, final.encode()) == signature
        assert len(call(sock, metadata_request(3))) > 0


def test_handshake_v0_with_a_wrong_password_closes_without_a_reply(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake_v0(sock, "PLAIN") == 0
        sock.sendall(frame(b"\0reader\0not-the-password"))
        assert read_until_closed(sock) == b""


def test_scram_with_a_bad_proof_is_refused_and_closed(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake(sock, "SCRAM-SHA-256") == 0
        first_bare = f"n=alice,r={secrets.token_urlsafe(18)}"
        _, _, server_first = authenticate(sock, f"n,,{first_bare}".encode())
        final, _ = scram_client_final(first_bare, server_first.decode(), "wrong password")
        code, message, _ = authenticate(sock, final.encode())
        assert code == SASL_AUTHENTICATION_FAILED
        assert message is not None and "alice" in message
        assert read_until_closed(sock) == b""


@pytest.mark.parametrize(
    ("mechanism", "data"),
    [
        ("SCRAM-SHA-256", b"\xff\xfe not utf-8"),
        ("SCRAM-SHA-256", b"n=alice,r=abc"),  # no gs2 header
        ("SCRAM-SHA-256", b"p=tls-unique,,n=alice,r=abc"),  # channel binding
        ("SCRAM-SHA-256", b"n,,n=al=ice,r=abc"),  # a bad saslname escape
        ("SCRAM-SHA-256", b"n,,m=ext,n=alice,r=abc"),  # a mandatory extension
        ("SCRAM-SHA-256", b""),
        ("PLAIN", b"alice"),
        ("PLAIN", b"\0alice\0" + PASSWORDS["alice"].encode() + b"\0extra"),
        ("PLAIN", b"bob\0alice\0" + PASSWORDS["alice"].encode()),  # acting as another user
    ],
)
def test_malformed_sasl_bytes_are_refused_and_closed(
    sasl_server: Any, mechanism: str, data: bytes
) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake(sock, mechanism) == 0
        code, message, _ = authenticate(sock, data)
        assert code == SASL_AUTHENTICATION_FAILED and message
        assert read_until_closed(sock) == b""


def test_malformed_scram_final_message_is_refused_and_closed(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert handshake(sock, "SCRAM-SHA-256") == 0
        assert authenticate(sock, b"n,,n=alice,r=abc")[0] == 0
        code, _, _ = authenticate(sock, b"c=biws,r=not-the-nonce,p=AAAA")
        assert code == SASL_AUTHENTICATION_FAILED
        assert read_until_closed(sock) == b""


def test_authenticate_without_handshake_is_an_illegal_state(sasl_server: Any) -> None:
    with socket.create_connection(sasl_server.address, timeout=WAIT) as sock:
        assert authenticate(sock, b"\0alice\0x")[0] == ILLEGAL_SASL_STATE
        assert read_until_closed(sock) == b""


def test_an_unsupported_mechanism_is_refused(store: mqcore.Store, tmp_path: Path) -> None:
    add_user(tmp_path / "u", "alice", "pw-alice")
    with (
        Server(
            store, "127.0.0.1:0", sasl_credentials=tmp_path / "u", sasl_mechanisms=("PLAIN",)
        ) as srv,
        socket.create_connection(srv.address, timeout=WAIT) as sock,
    ):
        assert handshake(sock, "SCRAM-SHA-256") == 33  # UNSUPPORTED_SASL_MECHANISM
        assert read_until_closed(sock) == b""


def test_a_stalled_tls_handshake_does_not_hold_up_other_clients_or_stop(
    store: mqcore.Store, certs: dict[str, str]
) -> None:
    """A client that stalls mid-handshake holds neither accept (another client is served
    meanwhile) nor stop(), which shuts its socket down rather than waiting out the request
    timeout (bounded: well under the 120 s timeout)."""
    srv = Server(
        store, "127.0.0.1:0", tls_cert=certs["cert"], tls_key=certs["key"], request_timeout=120
    ).start()
    try:
        with socket.create_connection(srv.address, timeout=WAIT) as stalled:
            stalled.sendall(b"\x16\x03")  # the first bytes of a ClientHello, then nothing
            ctx = ssl.create_default_context(cafile=certs["ca"])
            with (
                socket.create_connection(srv.address, timeout=WAIT) as raw,
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                assert call(tls, api_versions_request(5))[:2] == b"\0\0"
            deadline = time.monotonic() + WAIT  # the served client's thread ends on its own
            while srv.connection_count() > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert srv.connection_count() == 1  # the stalled one
            started = time.monotonic()
            srv.stop()
            assert time.monotonic() - started < 60
            assert srv.connection_count() == 0
    finally:
        srv.stop()


def test_with_a_ca_client_certificates_are_required(
    store: mqcore.Store, certs: dict[str, str], tmp_path: Path
) -> None:
    """tls_ca: a client with a certificate the CA signed is served; one without is refused."""
    client_ca = trustme.CA()
    client_ca.cert_pem.write_to_path(str(tmp_path / "client-ca.pem"))
    client = client_ca.issue_cert("client.example")
    client.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "client.pem"))
    with Server(
        store, "127.0.0.1:0", tls_cert=certs["cert"], tls_key=certs["key"],
        tls_ca=tmp_path / "client-ca.pem",
    ) as srv:  # fmt: skip
        for with_cert in (True, False):
            ctx = ssl.create_default_context(cafile=certs["ca"])
            if with_cert:
                ctx.load_cert_chain(str(tmp_path / "client.pem"))
            with (
                socket.create_connection(srv.address, timeout=WAIT) as raw,
                ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
            ):
                if with_cert:
                    assert call(tls, api_versions_request(5))[:2] == b"\0\0"
                else:  # TLS 1.3 reports the refused certificate at the first read
                    with pytest.raises((ssl.SSLError, ConnectionError)):
                        call(tls, api_versions_request(5))


def test_sasl_apis_without_sasl_answer_illegal_state(kafka_server: Any) -> None:
    with socket.create_connection(kafka_server.address, timeout=WAIT) as sock:
        assert handshake(sock, "PLAIN") == ILLEGAL_SASL_STATE
        # and the connection goes on serving: no SASL means no authentication required
        assert len(call(sock, metadata_request(2))) > 0


# -- files --------------------------------------------------------------------------------------


def test_the_credentials_file_holds_no_plain_password(security_files: dict[str, str]) -> None:
    text = Path(security_files["users"]).read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert [e["user"] for e in lines] == list(PASSWORDS)
    for entry in lines:
        assert set(entry) == {"user", "mechanism", "iterations", "salt", "stored_key", "server_key"}
    for password in PASSWORDS.values():
        assert password not in text
        assert base64.b64encode(password.encode()).decode() not in text
    assert Path(security_files["users"]).stat().st_mode & 0o077 == 0


def test_stored_keys_are_rfc_5802s(tmp_path: Path) -> None:
    """The keys on disk are what RFC 5802 derives (computed here from the RFC with hashlib);
    changing a password replaces the line and the old password stops working."""
    path = tmp_path / "users"
    add_user(path, "alice", "first")
    add_user(path, "alice", "second")
    cred = load_credentials(path)["alice"]
    salted = hashlib.pbkdf2_hmac("sha256", b"second", cred.salt, cred.iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert cred.stored_key == hashlib.sha256(client_key).digest()
    assert cred.server_key == hmac.new(salted, b"Server Key", hashlib.sha256).digest()
    assert cred.check_password("second") and not cred.check_password("first")
    assert len(path.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        '{"user": "a", "mechanism": "SCRAM-SHA-512", "iterations": 4096, "salt": "AA==", '
        '"stored_key": "", "server_key": ""}',
        '{"user": "a", "password": "plain"}',
        "[1, 2]",
    ],
)
def test_a_bad_credentials_file_is_refused_naming_the_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "users"
    path.write_text("\n" + line + "\n")
    with pytest.raises(InvalidConfigError, match="line 2"):
        load_credentials(path)


def test_acl_grants_match_by_user_prefix_exact_name_and_wildcard(tmp_path: Path) -> None:
    path = tmp_path / "acl"
    path.write_text(ACL + "*  describe  public.*\nops  all  *\n")
    acl = Authorizer.load(path)
    topics = ["orders", "orders-eu", "order", "elsewhere", "elsewhere2", "public.x", "secret"]
    ops = ["read", "write", "describe", "create"]
    # the truth table, written out from the file's meaning
    expected = {
        "alice": {(op, t) for op in ["read", "write", "create", "describe"] for t in topics},
        "reader": {(op, t) for op in ["read", "describe"] for t in ["orders", "orders-eu"]},
        "nobody": {("describe", "elsewhere")},
        "ops": {(op, t) for op in ops for t in topics},
        "carol": set(),
    }
    for user, granted in expected.items():
        granted |= {("describe", "public.x")}  # the "*" user line
        got = {(op, t) for op in ops for t in topics if acl.allows(f"User:{user}", op, t)}
        assert got == granted, user


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        ("alice read", "USER OPERATIONS RESOURCES"),
        ("alice delete orders", "operation 'delete'"),
        ("alice read ord*ers", "topics 'ord\\*ers'"),
    ],
)
def test_a_bad_acl_line_is_refused_naming_it(tmp_path: Path, line: str, complaint: str) -> None:
    path = tmp_path / "acl"
    path.write_text("# first\n" + line + "\n")
    with pytest.raises(InvalidConfigError, match=f"line 2: .*{complaint}"):
        Authorizer.load(path)


def test_security_options_are_checked_before_the_store_opens(
    tmp_path: Path, certs: dict[str, str]
) -> None:
    target = tmp_path / "never-made"
    with pytest.raises(InvalidConfigError, match="needs SASL"):
        Server(target, "127.0.0.1:0", acl=tmp_path / "acl")
    with pytest.raises(InvalidConfigError, match="need tls_cert"):
        Server(target, "127.0.0.1:0", tls_key=certs["key"])
    with pytest.raises(InvalidConfigError, match="TLS certificate"):
        Server(target, "127.0.0.1:0", tls_cert=tmp_path / "missing.pem")
    with pytest.raises(InvalidConfigError, match="SASL mechanisms"):
        add_user(tmp_path / "u", "a", "pw")
        Server(target, "127.0.0.1:0", sasl_credentials=tmp_path / "u", sasl_mechanisms=("GSSAPI",))
    assert not target.exists()


def test_add_user_refuses_bad_names_and_empty_passwords(tmp_path: Path) -> None:
    for user, password in [("", "pw"), ("a b", "pw"), ("*", "pw"), ("a", "")]:
        with pytest.raises(InvalidConfigError):
            add_user(tmp_path / "u", user, password)
    with pytest.raises(InvalidConfigError, match="iterations"):
        add_user(tmp_path / "u", "a", "pw", iterations=100)
    assert not (tmp_path / "u").exists()
    assert ScramCredential.from_password("pw").iterations == 4096


def test_cli_server_user_adds_and_removes_users_without_a_plain_password(
    tmp_path: Path, store: mqcore.Store
) -> None:
    """`mqcore server-user add` as a subprocess, password on stdin; the user it made logs in
    (SCRAM over a raw socket); `remove` takes it out; a missing user is one error line."""
    path = tmp_path / "users"

    def cli(*argv: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "mqcore.cli", "server-user", *argv], input=stdin,
            env=child_env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    added = cli("add", str(path), "alice", "--password-stdin", stdin="cli-Secret-1\n")
    assert added.returncode == 0, added.stderr
    assert "cli-Secret-1" not in path.read_text()
    with (
        Server(store, "127.0.0.1:0", sasl_credentials=path) as srv,
        socket.create_connection(srv.address, timeout=WAIT) as sock,
    ):
        assert handshake(sock, "PLAIN") == 0
        assert authenticate(sock, b"\0alice\0cli-Secret-1")[0] == 0
    assert cli("remove", str(path), "alice").returncode == 0
    assert load_credentials(path) == {}
    missing = cli("remove", str(path), "alice")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"mqcore: error: credentials file {str(path)!r} has no user 'alice'"
    ]


def test_mqcore_serve_with_tls_sasl_and_acls_from_the_command_line(
    tmp_path: Path, certs: dict[str, str], security_files: dict[str, str]
) -> None:
    """`mqcore serve --tls-cert --tls-key --sasl-credentials --acl` in its own process: alice
    produces and consumes over SASL_SSL, reader is refused the write."""
    path = str(tmp_path / "store")
    with mqcore.open(path) as s:
        s.create_topic("orders.cli")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mqcore.cli", "serve", path, "--listen", "127.0.0.1:0",
         "--tls-cert", certs["cert"], "--tls-key", certs["key"],
         "--sasl-credentials", security_files["users"], "--acl", security_files["acl"]],
        env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        srv = types.SimpleNamespace(bootstrap=proc.stdout.readline().split()[-1])
        alice = confluent_config(srv, certs, "alice", PASSWORDS["alice"], "SCRAM-SHA-256")
        assert produce_confluent(alice, "orders.cli", [b"a", b"b"]) == [None, None]
        assert consume_confluent(alice, "orders.cli", 2) == [b"a", b"b"]
        reader = confluent_config(srv, certs, "reader", PASSWORDS["reader"], "PLAIN")
        refused = produce_confluent(reader, "orders.cli", [b"c"])
        assert (
            refused[0] is not None and refused[0].code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
        )
    finally:
        proc.terminate()
        proc.wait(WAIT)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def test_offset_commits_and_fetches_follow_the_topic_acls(
    sasl_server: Any, store: mqcore.Store
) -> None:
    """A consumer's offsets are its topic's: committing needs `read`, fetching `describe`
    (reader may read orders*, not elsewhere), over SASL_PLAINTEXT with kafka-python."""
    kafka = pytest.importorskip("kafka")
    store.create_topic("orders.x")
    store.create_topic("elsewhere")
    config = dict(bootstrap_servers=sasl_server.bootstrap, security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="reader",
                  sasl_plain_password=PASSWORDS["reader"])  # fmt: skip
    consumer = kafka.KafkaConsumer(group_id="g1", enable_auto_commit=False, **config)
    try:
        allowed = kafka.TopicPartition("orders.x", 0)
        denied = kafka.TopicPartition("elsewhere", 0)
        consumer.commit({allowed: kafka.OffsetAndMetadata(7, "", -1)})
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            consumer.commit({denied: kafka.OffsetAndMetadata(3, "", -1)})
        assert consumer.committed(allowed) == 7
    finally:
        consumer.close()
    committed = store.offset_store().group_offsets("g1")
    assert {tp: om.offset for tp, om in committed.items()} == {("orders.x", 0): 7}
