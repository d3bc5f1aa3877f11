"""Signed messages from the controller to one node's agent (Ed25519, `cryptography`).

Kubernetes lets many accounts write Node objects (every node agent, node-problem-detector,
device plugins, autoscalers): an annotation alone does not say who wrote it. So what the
controller asks of an agent (`core.wire.REQUEST_ANNOTATION`, `RELEASED_ANNOTATION`) carries
a signature made with the controller's private key; agents hold only the public key
(`agent.sinks.kubernetes.trust`) and act on nothing that does not verify. The other way,
each agent signs its remediation results with a key of its own (kept in its state dir),
which the controller pins for that Node (`platform.clusters.k8s_pins`).

The signature covers a purpose, the node's name and the exact annotation text, so a message
for one node is worthless on another, and a request cannot pass for a release. It lives in
a separate annotation (`<annotation>-sig`, value `<key id>.<base64url signature>`), so the
message itself stays plain JSON for people and other tools. Freshness and "once per id" are
the agent's job (`node.sinks.remediation`). docs/security.md has the whole trust model.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

CONTEXT = b"gpuvigil.io/v1"
SIG_SUFFIX = "-sig"


class BadKey(ValueError):
    """A key file or text that is not an Ed25519 key in PEM."""


def sig_annotation(annotation: str) -> str:
    return annotation + SIG_SUFFIX


def _message(purpose: str, node: str, text: str) -> bytes:
    return b"\0".join((CONTEXT, purpose.encode(), node.encode(), text.encode()))


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """The controller's side: signs what it writes for an agent."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.public = private.public_key()
        self.kid = key_id(self.public)

    @classmethod
    def generate(cls) -> Signer:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_pem(cls, pem: bytes) -> Signer:
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as e:
            raise BadKey(f"not a PEM private key: {e}") from e
        if not isinstance(key, Ed25519PrivateKey):
            raise BadKey("the controller's key must be Ed25519")
        return cls(key)

    def private_pem(self) -> bytes:
        return self.private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public_pem(self) -> bytes:
        return self.public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, purpose: str, node: str, text: str) -> str:
        """The value of the signature annotation for `text` written on `node`."""
        return f"{self.kid}.{_b64(self.private.sign(_message(purpose, node, text)))}"

    def public_b64(self) -> str:
        """The public key as one short line (raw, base64url): what an agent publishes."""
        return _b64(self.public.public_bytes(serialization.Encoding.Raw,
                                             serialization.PublicFormat.Raw))  # fmt: skip

    def tag(self, text: str) -> str:
        """An unguessable, stable tag of `text` (HMAC-SHA256 under a key derived from the
        private key, 128 bits): nobody without the key can compute it, and the same key
        always gives the same tag, so a request re-sent after a restart keeps its id."""
        raw = self.private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        secret = hashlib.sha256(CONTEXT + b"\0request-id\0" + raw).digest()
        return _b64(hmac.new(secret, text.encode(), hashlib.sha256).digest()[:16])

    def check_tag(self, text: str, tag: str) -> bool:
        return hmac.compare_digest(self.tag(text), tag)


class Verifier:
    """An agent's side: the controller's public key(s); `verify` never raises."""

    def __init__(self, keys: list[Ed25519PublicKey]) -> None:
        self.keys = {key_id(k): k for k in keys}

    @classmethod
    def from_pem(cls, pem: bytes) -> Verifier:
        """Every PUBLIC KEY block in `pem` (several during a key rotation)."""
        keys: list[Ed25519PublicKey] = []
        marker = b"-----END PUBLIC KEY-----"
        for block in pem.split(marker):
            if b"-----BEGIN PUBLIC KEY-----" not in block:
                continue
            try:
                key = serialization.load_pem_public_key(block.strip() + b"\n" + marker + b"\n")
            except (ValueError, TypeError) as e:
                raise BadKey(f"not a PEM public key: {e}") from e
            if not isinstance(key, Ed25519PublicKey):
                raise BadKey("the controller's public key must be Ed25519")
            keys.append(key)
        if not keys:
            raise BadKey("no PUBLIC KEY block found")
        return cls(keys)

    @classmethod
    def from_b64(cls, text: str) -> Verifier:
        """One raw public key, base64url (`Signer.public_b64`)."""
        try:
            return cls([Ed25519PublicKey.from_public_bytes(_unb64(text.strip()))])
        except (ValueError, TypeError) as e:
            raise BadKey(f"not an Ed25519 public key: {e}") from e

    @classmethod
    def from_file(cls, path: Path) -> Verifier:
        try:
            return cls.from_pem(path.read_bytes())
        except OSError as e:
            raise BadKey(f"cannot read {path}: {e}") from e

    def verify(self, purpose: str, node: str, text: str | None, signature: str | None) -> str:
        """ "" when `signature` is the controller's over (purpose, node, text); else why not."""
        if not text:
            return "no message"
        if not signature:
            return "not signed"
        kid, _, sig = signature.partition(".")
        key = self.keys.get(kid)
        if key is None:
            return f"signed with unknown key {kid[:16]!r}"
        try:
            key.verify(_unb64(sig), _message(purpose, node, text))
        except (InvalidSignature, ValueError):
            return "bad signature"
        return ""
