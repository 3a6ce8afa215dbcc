"""Who may call what: the admin key, the controller key, and agent tokens (docs/security.md).

* admin key (`key`, v1.0's one key): every route.
* controller key (`controller_key`): list, read and patch rollouts, mint agent tokens.
* agent token: signed for one (rollout, attempt); that attempt's two proxy routes, posting
  events to that attempt, reading its own rollout and events. It stops working when the
  rollout is terminal, deleted, or has moved on to another attempt.

Tokens are stateless: `agl1.<rollout>.<attempt>.<created>.<signature>` with the ids
base64url-encoded, `created` the rollout's `status.created_at` (so that a rollout deleted and
created again under the same id does not accept the tokens of the deleted one), and the
signature an HMAC-SHA256 of the three under the Gateway's token secret, so nothing is stored
per token and a token cannot be made without the secret. Keys are compared in constant time.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from agentlightning.schemas import Rollout
from agentlightning.server.proxy.apis import ROUTES as AGENT_ROUTES

OPEN_PATHS = frozenset({"/healthz"})
# The dashboard's static page: no data in it; its API calls carry the key.
OPEN_PREFIX = "/ui/"
TOKEN_PREFIX = "agl1"
Role = Literal["admin", "controller", "agent"]


@dataclass(frozen=True, slots=True)
class Principal:
    role: Role
    rollout_id: str | None = None
    attempt_id: str | None = None
    created_at: float | None = None  # an agent token's rollout's creation time


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Makes and checks agent tokens. The secret is `token_secret`, or derived from the admin key
    (so tokens survive a Gateway restart with the same key, and a token reveals nothing of the key)."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    @classmethod
    def from_config(cls, key: str, token_secret: str) -> TokenSigner:
        if token_secret:
            return cls(token_secret.encode())
        return cls(hmac.new(key.encode(), b"agentlightning agent token v1", hashlib.sha256).digest())

    def _signature(self, rollout_id: str, attempt_id: str, created: str) -> bytes:
        message = (
            b"agent\x00" + rollout_id.encode() + b"\x00" + attempt_id.encode() + b"\x00" + created.encode()
        )
        return hmac.new(self._secret, message, hashlib.sha256).digest()

    def mint(self, rollout_id: str, attempt_id: str, created_at: float) -> str:
        created = repr(float(created_at))  # repr round-trips a float exactly
        parts = (
            _b64(rollout_id.encode()),
            _b64(attempt_id.encode()),
            created,
            _b64(self._signature(rollout_id, attempt_id, created)),
        )
        return ".".join((TOKEN_PREFIX, *parts))

    def verify(self, token: str) -> tuple[str, str, float] | None:
        """(rollout_id, attempt_id, the rollout's created_at) of a genuine token, else None."""
        parts = token.split(".", 3)
        if len(parts) != 4 or parts[0] != TOKEN_PREFIX:
            return None
        # created_at's repr has a dot of its own: the signature is what follows the last dot
        created, _, signature_text = parts[3].rpartition(".")
        try:
            rollout_id, attempt_id = _unb64(parts[1]).decode(), _unb64(parts[2]).decode()
            signature = _unb64(signature_text)
            created_at = float(created)
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        if not hmac.compare_digest(signature, self._signature(rollout_id, attempt_id, created)):
            return None
        return rollout_id, attempt_id, created_at


# --- what each role may do -------------------------------------------------------------------

_SEG = r"([^/]+)"
_AGENT_PROXY = re.compile(rf"^/proxy/rollout/{_SEG}/attempt/{_SEG}/mode/(?:train|val)/(?:{AGENT_ROUTES})$")
_AGENT_EVENTS = re.compile(rf"^/api/rollouts/{_SEG}/attempt/{_SEG}/events$")
_ROLLOUT = re.compile(rf"^/api/rollouts/{_SEG}$")
_ROLLOUT_EVENTS = re.compile(rf"^/api/rollouts/{_SEG}/events$")
_NOT_IDS = frozenset({"terminal", "batch"})  # path words that the {id} pattern would also match

CONTROLLER_ROUTES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("GET", re.compile(r"^/api/rollouts$")),
    ("GET", re.compile(r"^/api/rollouts/terminal$")),
    ("GET", _ROLLOUT),
    ("PATCH", _ROLLOUT),
    ("PUT", re.compile(rf"^/api/rollouts/{_SEG}/attempts/{_SEG}/outcome$")),
    ("POST", re.compile(r"^/api/agent-tokens$")),
)


def controller_may(method: str, path: str) -> bool:
    return any(method == m and pattern.match(path) for m, pattern in CONTROLLER_ROUTES)


def agent_may(principal: Principal, method: str, path: str) -> bool:
    """Only its own attempt's calls and events, and reading its own rollout."""
    own = (principal.rollout_id, principal.attempt_id)
    if method == "POST":
        match = _AGENT_PROXY.match(path) or _AGENT_EVENTS.match(path)
        return match is not None and match.groups() == own
    if method == "GET":
        match = _ROLLOUT.match(path) or _ROLLOUT_EVENTS.match(path)
        return match is not None and match.group(1) not in _NOT_IDS and match.group(1) == principal.rollout_id
    return False


def token_still_valid(rollout: Rollout | None, attempt_id: str, created_at: float) -> str | None:
    """Why an agent token no longer works, or None while it does."""
    if rollout is None:
        return "the token's rollout no longer exists"
    if rollout.status.created_at != created_at:
        return "the token's rollout was deleted (a rollout created since has its id)"
    if rollout.status.state.is_terminal:
        return f"the token's rollout is {rollout.status.state.value}"
    last = rollout.status.last_attempt_id
    if last is not None and last != attempt_id:
        return "the token's attempt is no longer the rollout's current attempt"
    return None


class Authenticator:
    """Maps a credential to a principal. With no admin key, auth is off (v1.0's behaviour)."""

    def __init__(self, key: str, controller_key: str = "", token_secret: str = "") -> None:
        self.enabled = bool(key)
        self._keys: list[tuple[bytes, Role]] = [(key.encode(), "admin")]
        if controller_key:
            self._keys.append((controller_key.encode(), "controller"))
        self.signer = TokenSigner.from_config(key, token_secret)

    def identify(self, credential: str) -> Principal | None:
        raw = credential.encode("latin-1")  # the header's bytes (credential_of decoded them as latin-1)
        role: Role | None = None
        for secret, candidate in self._keys:  # every key compared: the time says nothing of which matched
            if hmac.compare_digest(raw, secret):
                role = candidate
        if role is not None:
            return Principal(role)
        ids = self.signer.verify(credential) if credential.startswith(TOKEN_PREFIX + ".") else None
        return Principal("agent", *ids) if ids is not None else None


def credential_of(scope: Scope) -> str | None:
    name: bytes
    value: bytes
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.partition(b" ")
            if scheme.lower() == b"bearer":
                return token.strip().decode("latin-1")
        elif name == b"x-api-key":
            return value.strip().decode("latin-1")
    return None


async def _deny(send: Send, status: int, detail: str) -> None:
    body = orjson.dumps({"detail": detail})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


_PATCH_OR_DELETE_ONE = frozenset({"PATCH", "DELETE"})
_BATCH_DELETE = "/api/rollouts/batch/delete"
ALL = ""  # "every rollout" for LiveTokens.forget


def rollout_change(method: str, path: str) -> str | None:
    """The rollout a request may end or move to another attempt (ALL: several), else None."""
    if method in _PATCH_OR_DELETE_ONE and (match := _ROLLOUT.match(path)):
        return match.group(1)
    if method == "POST" and path == _BATCH_DELETE:
        return ALL
    return None


class LiveTokens:
    """Which tokens were found live, so that an agent's model calls do not each read its rollout.

    Exact as long as this Gateway is the only writer of its store: every request that can end a
    rollout or change its attempt forgets it before and after it runs, and a check that overlapped
    such a request (the generation moved) is not remembered.
    """

    def __init__(self, capacity: int = 100_000) -> None:
        self.capacity = capacity
        # rollout id -> (attempt id, the rollout's created_at)
        self._live: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self.generation = 0

    def is_live(self, rollout_id: str, attempt_id: str, created_at: float) -> bool:
        return self._live.get(rollout_id) == (attempt_id, created_at)

    def remember(self, rollout_id: str, attempt_id: str, created_at: float, generation: int) -> None:
        if generation != self.generation:
            return
        self._live[rollout_id] = (attempt_id, created_at)
        if len(self._live) > self.capacity:
            self._live.popitem(last=False)

    def forget(self, rollout_id: str) -> None:
        if rollout_id == ALL:
            self._live.clear()
        else:
            self._live.pop(rollout_id, None)
        self.generation += 1


class AuthMiddleware:
    """Rejects strangers (401) and principals outside their role (403) before any body is read."""

    def __init__(
        self,
        app: ASGIApp,
        auth: Authenticator,
        load_rollout: Callable[[str], Awaitable[Rollout | None]],
        live: LiveTokens | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        self.load_rollout = load_rollout
        self.live = live if live is not None else LiveTokens()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.auth.enabled
            or scope["path"] in OPEN_PATHS
            or (scope["path"] + "/").startswith(OPEN_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        credential = credential_of(scope)
        principal = self.auth.identify(credential) if credential else None
        if principal is None:
            detail = (
                "missing or wrong key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                if credential is None or not credential.startswith(TOKEN_PREFIX + ".")
                else "invalid agent token (not signed by this Gateway)"
            )
            await _deny(send, 401, detail)
            return
        method, path = scope["method"], scope["path"]
        if principal.role == "controller" and not controller_may(method, path):
            await _deny(send, 403, f"the controller key may not {method} {path}")
            return
        if principal.role == "agent":
            if not agent_may(principal, method, path):
                await _deny(
                    send, 403, f"an agent token may only use its own rollout attempt, not {method} {path}"
                )
                return
            rid, aid, created_at = principal.rollout_id, principal.attempt_id, principal.created_at
            assert rid is not None and aid is not None and created_at is not None
            if not self.live.is_live(rid, aid, created_at):
                generation = self.live.generation
                why = token_still_valid(await self.load_rollout(rid), aid, created_at)
                if why is not None:
                    await _deny(send, 401, f"expired agent token: {why}")
                    return
                self.live.remember(rid, aid, created_at, generation)
            await self.app(scope, receive, send)
            return
        changed = rollout_change(method, path)
        if changed is None:
            await self.app(scope, receive, send)
            return
        self.live.forget(changed)
        try:
            await self.app(scope, receive, send)
        finally:
            self.live.forget(changed)
