"""Security for `mqcore serve`: TLS, SASL authentication and per-principal topic ACLs
(docs/server.md "Security").

- TLS: `tls_context` builds the server side's ssl.SSLContext (TLS 1.2 or later; with a CA,
  clients must present a certificate it signed).
- SASL: SaslHandshake (API 17) and SaslAuthenticate (API 36) with the mechanisms PLAIN and
  SCRAM-SHA-256 (RFC 5802 and 7677, server side over hashlib/hmac: the whole exchange is two
  messages and three HMACs, less than a dependency would cost to vet). `Sasl` holds the
  credentials file and answers both APIs; a `SaslState` is one connection's progress.
- The credentials file holds SCRAM's salted keys only, one JSON object a line:

      {"user": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096,
       "salt": "<base64>", "stored_key": "<base64>", "server_key": "<base64>"}

  PLAIN is checked against the same keys (the password is salted and hashed as SCRAM does
  and its StoredKey compared), so no password, plain or reversible, is ever on disk.
  `add_user` and `remove_user` change it (`mqcore server-user add|remove` from the shell).
- ACLs: `Authorizer` reads the ACL file, one grant a line, `USER OPERATIONS RESOURCES`:

      alice  read,write  orders.*          # every topic whose name starts with "orders."
      bob    read        orders.eu         # that topic only
      bob    read        group:billing     # consumer or share group "billing"
      ops    read        __consumer_offsets  # an internal topic: only a grant naming it
      *      describe    *                 # any authenticated user, every ordinary topic
      etl    write       transactional-id:etl-*  # Kafka transactions with these IDs

  A resource is a topic (`NAME`, or `topic:NAME`), a group (`group:NAME`) or a Kafka
  transactional ID (`transactional-id:NAME`); NAME is exact, a prefix ending in `*`, or `*`.
  Topic operations: read, write, describe, create (managing the topic: create, delete,
  alter, delete records), all; group operations: read (join, commit, consume a share group),
  describe, delete (delete the group or its offsets, reset them), all; transactional-ID
  operations (Kafka's): write (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn,
  TxnOffsetCommit, EndTxn, a transactional produce), describe (FindCoordinator,
  DescribeTransactions, ListTransactions), all. read and write imply describe, as delete
  does for groups (Kafka's implications). Only grants exist (no deny); what no line grants
  is refused. Internal topics (`__` names) are matched only by a pattern that itself starts
  with `__`, never by `*` or another prefix, and never for write or create: only mqcore
  writes them.
- `Access` is one principal's view of the grants: the check every interface makes (the Kafka
  listener, the HTTP API, the console), so they cannot drift apart.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import hmac
import json
import logging
import math
import os
import re
import secrets
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from mqcore.errors import (
    AuthenticationError,
    GroupAuthorizationError,
    InvalidConfigError,
    TopicAuthorizationError,
    TransactionalIdAuthorizationError,
)
from mqcore.log.internal import INTERNAL_PREFIX, is_internal
from mqcore.server.backoff import LoginBackoff
from mqcore.server.protocol import Api, build

_log = logging.getLogger("mqcore.server")

SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36
SCRAM_SHA_256 = "SCRAM-SHA-256"
PLAIN = "PLAIN"
MECHANISMS = (SCRAM_SHA_256, PLAIN)
_NO_LIFETIME = datetime.timedelta(0)  # SaslAuthenticate v1+: no re-authentication deadline
SCRAM_MIN_ITERATIONS = 4096  # RFC 7677's floor for SCRAM-SHA-256 (and Kafka's)

READ, WRITE, DESCRIBE, CREATE, DELETE = "read", "write", "describe", "create", "delete"
TOPIC, GROUP = "topic", "group"  # the resource types of an ACL line
TRANSACTIONAL_ID = "transactional-id"
CLUSTER = "cluster"  # Kafka's third resource type, which no ACL line names
OPERATIONS = {
    TOPIC: frozenset({READ, WRITE, DESCRIBE, CREATE}),
    GROUP: frozenset({READ, DESCRIBE, DELETE}),
    TRANSACTIONAL_ID: frozenset({WRITE, DESCRIBE}),
}
_IMPLIES = {  # what granting an operation grants with it (Kafka's AclEntry implications)
    READ: {READ, DESCRIBE},
    WRITE: {WRITE, DESCRIBE},
    DESCRIBE: {DESCRIBE},
    CREATE: {CREATE},
    DELETE: {DELETE, DESCRIBE},
}
# Kafka's AclOperation codes: an authorized-operations field (Metadata, DescribeCluster,
# DescribeGroups) sets bit i for operation i; NOT_ASKED when the request did not ask for it
KAFKA_READ, KAFKA_WRITE, KAFKA_CREATE, KAFKA_DELETE, KAFKA_ALTER, KAFKA_DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
NOT_ASKED = -(2**31)
# what each grant of an ACL file allows among the operations Kafka has for the resource
# (docs/server.md "ACL file": a topic's create is managing it: creating, deleting, growing and
# changing its settings; DescribeConfigs needs describe)
_KAFKA_OPERATIONS: dict[str, dict[str, tuple[int, ...]]] = {
    TOPIC: {
        READ: (KAFKA_READ,),
        WRITE: (KAFKA_WRITE,),
        DESCRIBE: (KAFKA_DESCRIBE, DESCRIBE_CONFIGS),
        CREATE: (KAFKA_CREATE, KAFKA_DELETE, KAFKA_ALTER, ALTER_CONFIGS),
    },
    GROUP: {READ: (KAFKA_READ,), DESCRIBE: (KAFKA_DESCRIBE,), DELETE: (KAFKA_DELETE,)},
    TRANSACTIONAL_ID: {WRITE: (KAFKA_WRITE,), DESCRIBE: (KAFKA_DESCRIBE,)},
}
# the cluster's operations (Kafka's AclEntry.supportedOperations); no ACL line grants them
_CLUSTER_OPERATIONS = (KAFKA_CREATE, KAFKA_ALTER, KAFKA_DESCRIBE, CLUSTER_ACTION,
                       DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE)  # fmt: skip
# gs2-header (no channel binding: "n" or "y"), then client-first-message-bare
_CLIENT_FIRST = re.compile(r"([ny]),(?:a=([^,]*))?,(n=([^,]*),r=([\x21-\x2b\x2d-\x7e]+)(?:,.*)?)")
_TOPIC_PATTERN = re.compile(r"[A-Za-z0-9._-]*\*?")
_GROUP_PATTERN = re.compile(r"[^\s#*]*\*?")  # a group name is any string; no space, '#', '*'


# -- TLS ----------------------------------------------------------------------------------------


def tls_context(cert: str, key: str | None = None, ca: str | None = None) -> ssl.SSLContext:
    """The server's TLS context: its certificate chain and key (PEM; `key` None when `cert`
    holds both), TLS 1.2 or later, and with `ca`, client certificates required and checked
    against it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key) if key is not None else None)
        if ca is not None:
            ctx.load_verify_locations(os.fspath(ca))
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfigError(f"TLS certificate {cert!r} / key {key!r} / CA {ca!r}: {e}") from e
    return ctx


# -- credentials --------------------------------------------------------------------------------


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of a password (RFC 5802 section 3): enough to check a proof or a
    password, not enough to recover the password or to log in as the user."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def from_password(
        cls, password: str, salt: bytes | None = None, iterations: int = SCRAM_MIN_ITERATIONS
    ) -> ScramCredential:
        salt = secrets.token_bytes(16) if salt is None else salt
        salted = hashlib.pbkdf2_hmac("sha256", _saslprep(password), salt, iterations)
        return cls(
            salt,
            iterations,
            _h(_hmac(salted, b"Client Key")),
            _hmac(salted, b"Server Key"),
        )

    def check_password(self, password: str) -> bool:
        """Whether `password` is the one these keys were made from (PLAIN's check)."""
        other = ScramCredential.from_password(password, self.salt, self.iterations)
        return hmac.compare_digest(other.stored_key, self.stored_key)


def _saslprep(password: str) -> bytes:
    """The password's bytes. RFC 7677 asks for SASLprep; librdkafka, kafka-python and Kafka's
    Java client all skip it and send UTF-8, and so does this side, so non-ASCII passwords
    match those clients (documented)."""
    return password.encode("utf-8")


def _credential_line(user: str, cred: ScramCredential) -> str:
    b64 = base64.b64encode
    return json.dumps(
        {
            "user": user,
            "mechanism": SCRAM_SHA_256,
            "iterations": cred.iterations,
            "salt": b64(cred.salt).decode(),
            "stored_key": b64(cred.stored_key).decode(),
            "server_key": b64(cred.server_key).decode(),
        }
    )


def load_credentials(path: str | os.PathLike[str]) -> dict[str, ScramCredential]:
    """The users of a credentials file. InvalidConfigError naming the line on anything else
    than the documented JSON lines (blank lines are skipped)."""
    path = os.fspath(path)
    users: dict[str, ScramCredential] = {}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidConfigError(f"credentials file {path!r}: {e}") from e
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict):
                raise ValueError("not a JSON object")
            user = entry["user"]
            if not isinstance(user, str) or not user:
                raise ValueError("user must be a non-empty string")
            if entry["mechanism"] != SCRAM_SHA_256:
                raise ValueError(f"mechanism {entry['mechanism']!r} is not {SCRAM_SHA_256}")
            iterations = entry["iterations"]
            if type(iterations) is not int or iterations < SCRAM_MIN_ITERATIONS:
                raise ValueError(f"iterations must be an integer >= {SCRAM_MIN_ITERATIONS}")
            salt, stored, server = (
                base64.b64decode(entry[k], validate=True)
                for k in ("salt", "stored_key", "server_key")
            )
            if len(stored) != 32 or len(server) != 32 or not salt:
                raise ValueError("stored_key and server_key are 32 bytes, salt not empty")
            if "password" in entry:
                raise ValueError("a plain password has no place in a credentials file")
        except (ValueError, KeyError, TypeError) as e:
            raise InvalidConfigError(
                f"credentials file {path!r} line {number}: {type(e).__name__}: {e}"
            ) from None
        if user in users:
            raise InvalidConfigError(f"credentials file {path!r} line {number}: {user!r} twice")
        users[user] = ScramCredential(salt, iterations, stored, server)
    return users


def add_user(
    path: str | os.PathLike[str],
    user: str,
    password: str,
    *,
    iterations: int = SCRAM_MIN_ITERATIONS,
) -> None:
    """Add `user` to a credentials file (made when missing), or change their password: the
    file is rewritten whole, atomically, readable by its owner only. The password itself is
    not written, only its salted SCRAM keys."""
    path = os.fspath(path)
    if not user or any(c.isspace() for c in user) or user == "*":
        raise InvalidConfigError(f"user name {user!r}: not empty, no spaces, not '*'")
    if not password:
        raise InvalidConfigError("an empty password is refused")
    if iterations < SCRAM_MIN_ITERATIONS:
        raise InvalidConfigError(f"iterations={iterations}: at least {SCRAM_MIN_ITERATIONS}")
    users = load_credentials(path) if os.path.exists(path) else {}
    users[user] = ScramCredential.from_password(password, iterations=iterations)
    _write_credentials(path, users)


def remove_user(path: str | os.PathLike[str], user: str) -> None:
    """Take `user` out of a credentials file; InvalidConfigError when they are not in it."""
    path = os.fspath(path)
    users = load_credentials(path)
    if users.pop(user, None) is None:
        raise InvalidConfigError(f"credentials file {path!r} has no user {user!r}")
    _write_credentials(path, users)


def _write_credentials(path: str, users: dict[str, ScramCredential]) -> None:
    """The file rewritten whole: a temporary file (mode 0600) fsync'd and renamed over it."""
    text = "".join(_credential_line(name, cred) + "\n" for name, cred in users.items())
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".credentials-", dir=directory)  # mode 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- SASL ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class SaslState:
    """One connection's SASL progress: the mechanism chosen by its handshake, the SCRAM
    exchange in flight, and once authenticated, the principal. `failed`: the response just
    sent refused the client, and the connection closes after it. `raw_tokens`: the handshake
    was v0, so the SASL messages that follow are bare size-prefixed tokens, not
    SaslAuthenticate requests (`Sasl.raw_token`)."""

    mechanism: str | None = None
    raw_tokens: bool = False
    scram: _ScramExchange | None = None
    principal: str | None = None
    failed: bool = False
    peer: str = ""  # the client's address, as login backoffs count it (backoff.peer_key)
    failure: str | None = None  # why it failed: what the refusal said (the server logs it)


@dataclass(slots=True)
class _ScramExchange:
    user: str
    credential: ScramCredential
    known: bool  # False: a decoy credential for a user not in the file
    gs2_header: str
    client_first_bare: str
    server_first: str
    nonce: str


class Sasl:
    """SASL over the credentials file at `path` with `mechanisms` enabled (a subset of
    MECHANISMS). Failed logins back off per peer and per user (`backoff`, server/backoff.py,
    shared with the HTTP server's Basic logins): an attempt during a backoff is refused
    before its password or proof is checked."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        mechanisms: Iterable[str] = MECHANISMS,
        backoff: LoginBackoff | None = None,
    ):
        self.mechanisms = tuple(mechanisms)
        unknown = [m for m in self.mechanisms if m not in MECHANISMS]
        if unknown or not self.mechanisms:
            raise InvalidConfigError(
                f"SASL mechanisms {list(self.mechanisms)}: choose from {list(MECHANISMS)}"
            )
        self.users = load_credentials(path)
        self._decoy_key = secrets.token_bytes(32)
        self.backoff = backoff if backoff is not None else LoginBackoff(logger=_log)

    def handle(self, found: Api, body: Any, state: SaslState) -> Any:
        """The response to a SaslHandshake or SaslAuthenticate request."""
        if found.key == SASL_HANDSHAKE:
            return self._handshake(found, body, state)
        code, message, out = ErrorCode.none, None, b""
        try:
            if state.mechanism is None or state.principal is not None:
                state.failed = True
                code = ErrorCode.illegal_sasl_state
                message = "SaslAuthenticate without a SaslHandshake before it"
                if state.principal is not None:
                    message = "already authenticated (re-authentication is not served)"
            else:
                out = self._step(body.auth_bytes, state)
        except AuthenticationError as e:
            state.failed = True
            code, message = ErrorCode.sasl_authentication_failed, str(e)
        if state.failed:
            state.failure = message
        return build(
            found.response, error_code=code, error_message=message, auth_bytes=out,
            session_lifetime=_NO_LIFETIME,
        )  # fmt: skip

    def _handshake(self, found: Api, body: Any, state: SaslState) -> Any:
        code = ErrorCode.none
        if state.mechanism is not None:
            code = ErrorCode.illegal_sasl_state
        elif body.mechanism not in self.mechanisms:
            code = ErrorCode.unsupported_sasl_mechanism
            state.failure = f"mechanism {body.mechanism!r} is not enabled ({list(self.mechanisms)})"
        else:
            state.mechanism = body.mechanism
            state.raw_tokens = found.version == 0
        state.failed = code != ErrorCode.none
        if state.failed and state.failure is None:
            state.failure = "a second SaslHandshake"
        return build(found.response, error_code=code, mechanisms=self.mechanisms)

    def raw_token(self, data: bytes, state: SaslState) -> bytes:
        """The answer to one bare SASL token after a v0 handshake (Kafka before 1.0): the
        mechanism's reply. AuthenticationError on a refusal, which such clients learn of by
        the connection closing."""
        assert state.raw_tokens and state.principal is None
        return self._step(data, state)

    def _step(self, data: bytes, state: SaslState) -> bytes:
        if state.mechanism == PLAIN:
            state.principal = "User:" + self._plain(data, state.peer)
            return b""
        if state.scram is None:
            exchange = self._scram_first(_text(data))
            self._may_try(state.peer, exchange.user)
            state.scram = exchange
            return exchange.server_first.encode()
        exchange, state.scram = state.scram, None
        try:
            reply = self._scram_final(exchange, _text(data))
        except AuthenticationError:
            self.backoff.failed(state.peer, exchange.user)
            raise
        self.backoff.succeeded(state.peer, exchange.user)
        state.principal = "User:" + exchange.user
        return reply

    def _may_try(self, peer: str, user: str) -> None:
        """AuthenticationError, before any password is checked, during a login backoff."""
        wait = self.backoff.wait(peer, user)
        if wait > 0:
            raise AuthenticationError(
                f"too many failed logins from {peer or 'this address'} or as {user!r}: "
                f"try again in {math.ceil(wait)} s"
            )

    def _plain(self, data: bytes, peer: str) -> str:
        """RFC 4616: authzid NUL authcid NUL passwd. The user's name when the password is
        theirs."""
        parts = _text(data).split("\0")
        if len(parts) != 3:
            raise AuthenticationError("PLAIN: not authzid NUL user NUL password")
        authzid, user, password = parts
        if authzid and authzid != user:
            raise AuthenticationError(f"PLAIN: {user!r} may not act as {authzid!r}")
        self._may_try(peer, user)
        if not self.check_password(user, password):
            self.backoff.failed(peer, user)
            raise AuthenticationError(f"PLAIN: wrong user name or password for {user!r}")
        self.backoff.succeeded(peer, user)
        return user

    def check_password(self, user: str, password: str) -> bool:
        """Whether `password` is `user`'s (PLAIN's check, and HTTP Basic's in httpauth.py)."""
        cred = self.users.get(user)
        # an unknown user's password is hashed too (against a decoy), so the time taken
        # does not tell which users exist
        matches = (cred or self._decoy(user)).check_password(password)
        return cred is not None and matches

    def _decoy(self, user: str) -> ScramCredential:
        """A credential no password matches, with a salt stable per name, for users not in
        the file: answered like the others, so probing does not tell which users exist (RFC
        5802 section 9)."""
        return ScramCredential(
            _hmac(self._decoy_key, user.encode())[:16],
            SCRAM_MIN_ITERATIONS,
            secrets.token_bytes(32),
            secrets.token_bytes(32),
        )

    def _scram_first(self, message: str) -> _ScramExchange:
        """client-first-message: gs2-header "n,," (or "n,a=USER,": no channel binding),
        then "n=USER,r=NONCE[,extensions]" (a mandatory extension, "m=..." before "n=", is
        refused with the rest)."""
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise AuthenticationError(
                "SCRAM: client-first-message is not 'n,,n=USER,r=NONCE' (channel binding "
                "is not served)"
            )
        _flag, authzid, bare, raw_user, client_nonce = m.groups()
        user = _sasl_name(raw_user)
        if authzid is not None and _sasl_name(authzid) != user:
            raise AuthenticationError(f"SCRAM: {user!r} may not act as another user")
        cred = self.users.get(user)
        known = cred is not None
        if cred is None:
            cred = self._decoy(user)
        nonce = client_nonce + secrets.token_urlsafe(24)
        salt = base64.b64encode(cred.salt).decode()
        server_first = f"r={nonce},s={salt},i={cred.iterations}"
        gs2 = message[: len(message) - len(bare)]
        return _ScramExchange(user, cred, known, gs2, bare, server_first, nonce)

    def _scram_final(self, ex: _ScramExchange, message: str) -> bytes:
        """client-final-message "c=B64(gs2-header),r=NONCE,p=B64(proof)": the proof checked
        against StoredKey; the answer is "v=B64(ServerSignature)"."""
        without_proof, sep, proof_text = message.rpartition(",p=")
        m = re.fullmatch(r"c=([A-Za-z0-9+/=]*),r=([^,]*)(?:,.*)?", without_proof)
        if not sep or m is None:
            raise AuthenticationError("SCRAM: client-final-message is not 'c=..,r=..,p=..'")
        binding, nonce = m.groups()
        try:
            if base64.b64decode(binding, validate=True) != ex.gs2_header.encode():
                raise AuthenticationError("SCRAM: channel binding does not match the header")
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise AuthenticationError("SCRAM: c= or p= is not base64") from None
        # Kafka (3.8.1+) checks that the nonce ends with the server's: librdkafka before 2.6.1
        # sends its own nonce again in front of it (librdkafka PR #4895)
        if not nonce.endswith(ex.nonce):
            raise AuthenticationError("SCRAM: the nonce does not end with the one the server sent")
        auth_message = f"{ex.client_first_bare},{ex.server_first},{without_proof}".encode()
        signature = _hmac(ex.credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationError("SCRAM: the proof is not 32 bytes")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(_h(client_key), ex.credential.stored_key) or not ex.known:
            raise AuthenticationError(f"SCRAM: wrong user name or password for {ex.user!r}")
        server_signature = _hmac(ex.credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


def sasl_not_enabled(found: Api) -> Any:
    """The answer to SaslHandshake/SaslAuthenticate on a server without SASL (Kafka's on a
    PLAINTEXT listener): ILLEGAL_SASL_STATE."""
    return build(
        found.response, error_code=ErrorCode.illegal_sasl_state, mechanisms=(),
        error_message="SASL is not enabled on this server", auth_bytes=b"",
        session_lifetime=_NO_LIFETIME,
    )  # fmt: skip


def _text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise AuthenticationError("SASL message is not UTF-8") from None


def _sasl_name(raw: str) -> str:
    """RFC 5802's saslname: "=2C" is ",", "=3D" is "=", any other "=" is an error."""
    if re.search(r"=(?!2C|3D)", raw):
        raise AuthenticationError(f"SCRAM: user name {raw!r} has a bad '=' escape")
    return raw.replace("=2C", ",").replace("=3D", "=")


# -- ACLs ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Grant:
    """One ACL line: `user` ("*": any authenticated user) may do `operations` on the resources
    of `kind` (TOPIC or GROUP) that `pattern` names ("*": all; "x*": names starting with "x";
    "x": that name)."""

    user: str
    operations: frozenset[str]
    pattern: str
    kind: str = TOPIC

    def covers(self, user: str, kind: str, operation: str, name: str) -> bool:
        if kind != self.kind or self.user not in ("*", user) or operation not in self.operations:
            return False
        if kind == TOPIC and is_internal(name):
            # an internal topic: never written by a client; read or described only under a
            # grant that names internal topics itself (a "*" must not hand out every group's
            # offsets in __consumer_offsets)
            if operation in (WRITE, CREATE) or not self.pattern.startswith(INTERNAL_PREFIX):
                return False
        if self.pattern.endswith("*"):
            return name.startswith(self.pattern[:-1])
        return name == self.pattern


@dataclass(frozen=True, slots=True)
class Authorizer:
    """The ACL check, in one place: `allows(principal, operation, topic)` and
    `allows_group(principal, operation, group)`."""

    grants: tuple[Grant, ...] = field(default=())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Authorizer:
        """The grants of an ACL file (see the module docstring; "#" starts a comment).
        InvalidConfigError naming the line on anything else."""
        path = os.fspath(path)
        try:
            with open(path, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidConfigError(f"ACL file {path!r}: {e}") from e
        grants = []
        for number, line in enumerate(lines, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            where = f"ACL file {path!r} line {number}"
            if len(words) != 3:
                raise InvalidConfigError(f"{where}: not 'USER OPERATIONS RESOURCES': {line!r}")
            grants.append(_grant(where, *words))
        return cls(tuple(grants))

    def allows(self, principal: str, operation: str, topic: str) -> bool:
        """Whether `principal` may do `operation` on the topic."""
        user = principal.removeprefix("User:")
        return any(g.covers(user, TOPIC, operation, topic) for g in self.grants)

    def allows_group(self, principal: str, operation: str, group: str) -> bool:
        """Whether `principal` may do `operation` on the consumer or share group."""
        user = principal.removeprefix("User:")
        return any(g.covers(user, GROUP, operation, group) for g in self.grants)

    def allows_transactional_id(self, principal: str, operation: str, tid: str) -> bool:
        """Whether `principal` may do `operation` with the Kafka transactional ID."""
        user = principal.removeprefix("User:")
        return any(g.covers(user, TRANSACTIONAL_ID, operation, tid) for g in self.grants)


def _grant(where: str, user: str, ops_text: str, resource: str) -> Grant:
    """One ACL line's grant; InvalidConfigError naming what is wrong in it."""
    kind, sep, pattern = resource.partition(":")
    if not sep:
        kind, pattern = TOPIC, resource
    if kind not in OPERATIONS:
        raise InvalidConfigError(
            f"{where}: resource {resource!r}: the type is 'topic:', 'group:' or "
            f"'transactional-id:', not {kind!r}"
        )
    allowed = OPERATIONS[kind]
    ops: set[str] = set()
    for op in ops_text.lower().split(","):
        if op in ("all", "*"):
            ops |= allowed
        elif op in allowed:
            ops |= _IMPLIES[op]
        else:
            raise InvalidConfigError(
                f"{where}: operation {op!r} is not one of {', '.join(sorted(allowed))}, all "
                f"(for a {kind})"
            )
    rule = _TOPIC_PATTERN if kind == TOPIC else _GROUP_PATTERN
    if not rule.fullmatch(pattern) or pattern == "":
        raise InvalidConfigError(
            f"{where}: {kind}s {pattern!r} is not a name, a prefix ending in '*', or '*'"
        )
    return Grant(user, frozenset(ops), pattern, kind)


@dataclass(frozen=True, slots=True)
class Access:
    """What one principal may do, as every interface asks it (the Kafka listener, the HTTP
    API, the console): `authorizer` None means no ACLs, so everything is allowed except what
    no client may ever do (writing an internal topic, refused where the write is made).
    The check_* methods raise TopicAuthorizationError / GroupAuthorizationError."""

    authorizer: Authorizer | None
    principal: str = "User:ANONYMOUS"

    def topic(self, operation: str, topic: str) -> bool:
        return self.authorizer is None or self.authorizer.allows(self.principal, operation, topic)

    def group(self, operation: str, group: str) -> bool:
        return self.authorizer is None or self.authorizer.allows_group(
            self.principal, operation, group
        )

    def kafka_operations(self, kind: str, name: str = "") -> int:
        """Kafka's authorized-operations bit field (Metadata, DescribeCluster, DescribeGroups)
        for a topic, a group or the cluster (`kind` TOPIC, GROUP or CLUSTER): the operations
        the principal's grants allow, each with what it implies (_KAFKA_OPERATIONS); without
        ACLs every operation Kafka has for the resource. No ACL line grants the cluster, and
        Kafka answers none to a principal without its DESCRIBE."""
        if kind == CLUSTER:
            return bit_field(_CLUSTER_OPERATIONS) if self.authorizer is None else 0
        allowed = self.topic if kind == TOPIC else self.group
        ops = _KAFKA_OPERATIONS[kind]
        return bit_field(code for op, codes in ops.items() if allowed(op, name) for code in codes)

    def check_topic(self, operation: str, topic: str) -> None:
        if not self.topic(operation, topic):
            raise TopicAuthorizationError(
                f"{self.principal} may not {operation} topic {topic!r}", topic, operation
            )

    def check_group(self, operation: str, group: str) -> None:
        if not self.group(operation, group):
            raise GroupAuthorizationError(
                f"{self.principal} may not {operation} group {group!r}", group, operation
            )

    def transactional_id(self, operation: str, tid: str) -> bool:
        return self.authorizer is None or self.authorizer.allows_transactional_id(
            self.principal, operation, tid
        )

    def check_transactional_id(self, operation: str, tid: str) -> None:
        if not self.transactional_id(operation, tid):
            raise TransactionalIdAuthorizationError(
                f"{self.principal} may not {operation} transactional ID {tid!r}", tid, operation
            )


def bit_field(codes: Iterable[int]) -> int:
    """Kafka's 32-bit field of operation codes (bit i for code i), as a signed int32."""
    bits = 0
    for code in codes:
        bits |= 1 << code
    return bits - (1 << 32) if bits >= 1 << 31 else bits
