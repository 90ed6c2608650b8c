"""How a person's decision was authenticated, and operator keys that sign decisions.

A decision on an approval comes one of five ways, and the audit records which
(`authenticated_by`):

* ``elicitation`` — the person answered the MCP client's own prompt;
* ``tool-confirmation`` — the operator chose to trust the client's per-tool
  confirmation (``--approval tool-confirmation``);
* ``tty`` — ``pollwarden approve``/``deny`` at an interactive terminal, where the
  person saw the question and typed the approval id;
* ``console`` — the operator console (``pollwarden console``), which starts
  only at an interactive terminal and shows its one-time login URL only there;
* ``operator-key:<key id>`` — ``pollwarden approve``/``deny --operator-key FILE``
  (or a console started with ``--operator-key FILE``):
  the decision is signed with an Ed25519 private key the operator keeps out of
  the agent's reach, and verified against the public keys the operator
  configured (``POLLWARDEN_OPERATOR_PUBKEYS``).

The signature covers the approval id, the operation, the kind, the operation
version the question was bound to, a SHA-256 of the recorded request (what
would be added), the decision, when and by whom — so a signed decision cannot
be moved to another approval or to an edited request. The controller verifies
it again before applying it. With ``POLLWARDEN_REQUIRE_OPERATOR_KEY`` set, an
operator decision without a valid signature (a ``tty`` decision, or a row
written into the database by hand) is refused when the controller would apply
it. See SECURITY.md for what each of these stops and what it cannot.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pollwarden.core.canonical import canonical_json
from pollwarden.core.errors import ConfigError
from pollwarden.core.files import create_private_file, trust_file_problem

__all__ = [
    "METHOD_APP",
    "METHOD_CONSOLE",
    "METHOD_ELICITATION",
    "METHOD_HTTP_OPERATOR",
    "METHOD_TASK_INPUT",
    "METHOD_TOOL_CONFIRMATION",
    "METHOD_TTY",
    "PUBKEYS_ENV",
    "REQUIRE_ENV",
    "DecisionFacts",
    "OperatorKey",
    "OperatorPolicy",
    "PublicKey",
    "Verdict",
    "authenticate",
    "generate_key_file",
    "load_operator_key",
    "load_policy",
    "load_public_keys",
    "operator_key_method",
]

PUBKEYS_ENV = "POLLWARDEN_OPERATOR_PUBKEYS"
"""A file of operator public keys (one per line, as `pollwarden operator-key init` prints them)."""
REQUIRE_ENV = "POLLWARDEN_REQUIRE_OPERATOR_KEY"
"""Set to 1: an operator decision is applied only with a valid signature from a configured key."""

METHOD_ELICITATION = "elicitation"
METHOD_TOOL_CONFIRMATION = "tool-confirmation"
METHOD_TTY = "tty"
METHOD_CONSOLE = "console"
METHOD_HTTP_OPERATOR = "http-operator"  # an authenticated pollwarden:operator over HTTP (issue 19)
METHOD_APP = "app"  # Approve/Deny on the MCP App card in the agent's chat (issue 32; app_card)
# A person's answer to a task's input request (MCP tasks): the client's trust, as elicitation.
METHOD_TASK_INPUT = "task-input"
_KEY_METHOD = "operator-key:"
_PUBLIC_KEY_TYPE = "pollwarden-ed25519"
_SIGNED_FORMAT = "pollwarden-decision/1"


def operator_key_method(key_id: str) -> str:
    """The `authenticated_by` value of a decision signed with key `key_id`."""
    return _KEY_METHOD + key_id


def _key_id(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class PublicKey:
    """One operator public key the server trusts."""

    key_id: str
    key: Ed25519PublicKey
    comment: str = ""

    @classmethod
    def from_key(cls, key: Ed25519PublicKey, comment: str = "") -> PublicKey:
        """Wrap a public key; its id is the first 16 hex digits of the SHA-256 of the raw key."""
        raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return cls(_key_id(raw), key, comment)

    def line(self) -> str:
        """The line to put in the public keys file."""
        raw = self.key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        text = f"{_PUBLIC_KEY_TYPE} {base64.b64encode(raw).decode('ascii')}"
        return f"{text} {self.comment}" if self.comment else text


@dataclass(frozen=True)
class OperatorKey:
    """A private operator key loaded from its file."""

    private: Ed25519PrivateKey
    public: PublicKey

    @property
    def method(self) -> str:
        """The `authenticated_by` value of decisions signed with this key."""
        return operator_key_method(self.public.key_id)


@dataclass(frozen=True)
class OperatorPolicy:
    """The operator's public keys, and whether an operator decision must be signed by one."""

    keys: tuple[PublicKey, ...] = ()
    require_key: bool = False

    def find(self, key_id: str) -> PublicKey | None:
        """The configured key with this id, or None."""
        return next((k for k in self.keys if k.key_id == key_id), None)


@dataclass(frozen=True)
class DecisionFacts:
    """What a signature on a decision covers."""

    approval_id: str
    operation_id: str
    kind: str
    bound_version: int
    request_json: str
    decision: str  # "approved" or "denied"
    decided_at: float
    decided_by: str

    def message(self) -> bytes:
        """The canonical bytes that are signed."""
        document: Mapping[str, object] = {
            "format": _SIGNED_FORMAT,
            "approval_id": self.approval_id,
            "operation_id": self.operation_id,
            "kind": self.kind,
            "bound_version": self.bound_version,
            "request_sha256": hashlib.sha256(self.request_json.encode("utf-8")).hexdigest(),
            "decision": self.decision,
            "decided_at": repr(float(self.decided_at)),
            "decided_by": self.decided_by,
        }
        return canonical_json(document).encode("utf-8")

    def sign(self, key: OperatorKey) -> str:
        """The base64 Ed25519 signature of these facts."""
        return base64.b64encode(key.private.sign(self.message())).decode("ascii")


@dataclass(frozen=True)
class Verdict:
    """Whether a recorded operator decision may be applied, and how it was authenticated."""

    ok: bool
    method: str
    reason: str = ""


def authenticate(
    facts: DecisionFacts, method: str | None, signature: str | None, policy: OperatorPolicy
) -> Verdict:
    """Check a decision recorded outside the MCP client before it is applied.

    * A claimed operator-key signature must verify against the configured key
      with that id; a signature that does not is refused whatever the policy
      (it is a forgery or an edit after signing). When this server has no keys
      configured it cannot be checked and is refused: the keys file a CLI caller
      named proves nothing, since the caller may be the agent.
    * With `policy.require_key`, anything without a verified signature is refused.
    * Otherwise a ``tty``, ``console``, ``http-operator``, ``task-input`` or ``app`` decision (or one
      recorded before methods were recorded) is applied as what it claims to be.
    """
    claimed = method or "unrecorded"
    if claimed.startswith(_KEY_METHOD) and not policy.keys:
        # Whoever ran the CLI chose the key and the public keys file it was checked against; only
        # keys this server was configured with prove anything, and it has none.
        return Verdict(
            False,
            claimed,
            f"it is signed with an operator key, but this server has no operator public keys configured "
            f"({PUBKEYS_ENV}) to verify it against; a person must decide at an interactive terminal, or "
            f"the operator must configure {PUBKEYS_ENV} for the server",
        )
    if claimed.startswith(_KEY_METHOD):
        key = policy.find(claimed.removeprefix(_KEY_METHOD))
        if key is None:
            return Verdict(False, claimed, "signed with a key that is not among the operator's public keys")
        try:
            key.key.verify(base64.b64decode(signature or "", validate=True), facts.message())
        except (InvalidSignature, binascii.Error, ValueError):
            return Verdict(False, claimed, "its signature does not verify (forged, or edited after signing)")
        return Verdict(True, claimed)
    if policy.require_key:
        return Verdict(
            False,
            claimed,
            f"it is not signed with an operator key, and the operator requires one ({REQUIRE_ENV})",
        )
    if claimed == METHOD_ELICITATION:
        # A person's answer that reached this server after the client stopped waiting.
        return Verdict(True, f"{METHOD_ELICITATION} (answered after the client stopped waiting)")
    known = (METHOD_TTY, METHOD_CONSOLE, METHOD_HTTP_OPERATOR, METHOD_TASK_INPUT, METHOD_APP)
    return Verdict(True, claimed if claimed in known else f"cli ({claimed})")


# -- files ------------------------------------------------------------------------------------


def parse_public_keys(text: str, source: str) -> tuple[PublicKey, ...]:
    """Parse a public keys file: ``pollwarden-ed25519 <base64> [comment]`` per line; ``#`` comments."""
    keys: list[PublicKey] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(maxsplit=2)
        if len(parts) < 2 or parts[0] != _PUBLIC_KEY_TYPE:
            raise ConfigError(
                f"{source} line {number}: expected '{_PUBLIC_KEY_TYPE} <base64 key> [comment]', as "
                "`pollwarden operator-key init` prints it"
            )
        try:
            raw = base64.b64decode(parts[1], validate=True)
            key = Ed25519PublicKey.from_public_bytes(raw)
        except (binascii.Error, ValueError) as exc:
            raise ConfigError(f"{source} line {number}: not an Ed25519 public key ({exc})") from exc
        keys.append(PublicKey.from_key(key, parts[2] if len(parts) > 2 else ""))
    return tuple(keys)


def load_public_keys(path: Path) -> tuple[PublicKey, ...]:
    """The operator public keys in `path` (a `ConfigError` naming the file when it cannot be used)."""
    grants = "could add a key whose signed decisions are applied"
    if (problem := trust_file_problem(path, "the operator public keys file", grants)) is not None:
        raise ConfigError(f"refusing {problem}")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the operator public keys file {path}: {exc.strerror}") from exc
    keys = parse_public_keys(text, str(path))
    if not keys:
        raise ConfigError(f"the operator public keys file {path} holds no key")
    return keys


def load_policy(
    environ: Mapping[str, str], *, pubkeys: str | None = None, require: bool | None = None
) -> OperatorPolicy:
    """The operator policy from flags (which win) and the environment.

    Requiring a key without configuring any is a `ConfigError`: no decision
    outside the client could ever be applied.
    """
    path = pubkeys or environ.get(PUBKEYS_ENV) or None
    keys = load_public_keys(Path(path).expanduser()) if path else ()
    if require is None:
        flag = environ.get(REQUIRE_ENV, "").strip().lower()
        if flag not in ("", "0", "1", "true", "false", "yes", "no"):
            raise ConfigError(f"{REQUIRE_ENV}={flag!r}: use 1 (required) or 0")
        require = flag in ("1", "true", "yes")
    if require and not keys:
        raise ConfigError(
            f"an operator key is required ({REQUIRE_ENV}) but no public keys are configured: set {PUBKEYS_ENV} "
            "to the file `pollwarden operator-key init` told you to create"
        )
    return OperatorPolicy(keys=keys, require_key=require)


def generate_key_file(out: Path, comment: str) -> PublicKey:
    """Create a new private key at `out` (0600, never overwriting) and return its public key."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    create_private_file(out, pem)
    return PublicKey.from_key(private.public_key(), comment)


def load_operator_key(path: Path) -> OperatorKey:
    """Load a private key written by `generate_key_file`; refuse one others can read."""
    try:
        st = os.stat(path)
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the operator key {path}: {exc.strerror}") from exc
    if hasattr(os, "geteuid") and stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(
            f"the operator key {path} can be read by others (mode {stat.S_IMODE(st.st_mode):o}); "
            f"make it private with: chmod 600 {path}"
        )
    try:
        private = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path} is not an operator key written by `pollwarden operator-key init`") from exc
    if not isinstance(private, Ed25519PrivateKey):
        raise ConfigError(f"{path} is not an Ed25519 key")
    return OperatorKey(private, PublicKey.from_key(private.public_key()))


def describe_keys(keys: Sequence[PublicKey]) -> str:
    """The configured key ids, for messages."""
    return ", ".join(f"{k.key_id}{' (' + k.comment + ')' if k.comment else ''}" for k in keys) or "none"
