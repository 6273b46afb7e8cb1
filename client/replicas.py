"""A shard and its members: which URL of a replicated shard to send a request to.

A shard (a node id) may be served by several members, one of them the primary (docs/replication.md).
Only the primary takes writes, pulls, acks, key operations and message reads; a follower answers
421 `not_primary` naming the primary's URL, and while no primary is known every member answers 503
`no_primary`. A `Shard` remembers the primary it was last sent to, so that later requests go there
directly, and rotates to the next member when the remembered one cannot be reached (a follower
redirects, so any live member leads to the primary).

A member advertises itself with `replication_advertise_url`, which a 421 names. That may differ from
the URL this client was given for the same member (a published port, a load balancer, a hostname
only the members resolve); `aliases` maps advertised URLs to given ones, learned from
`GET /v1/cluster` when the shard is discovered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Redirects one request follows before giving up: enough for a primary that changed once or twice
# while the request was redirected, and a bound on members that keep naming each other.
MAX_REDIRECTS = 5


def normalize_url(url: str) -> str:
    return url.strip().rstrip("/")


@dataclass(eq=False)
class Shard:
    """One shard: its name (its node id, or its only URL when the client was given one), its
    members' URLs in the order given, and the primary last seen (None: not known)."""

    name: str
    members: list[str]
    primary: str | None = None
    aliases: dict[str, str] = field(default_factory=dict)  # advertised URL -> the URL given for it
    _next: int = 0  # the member to try when no primary is known

    @classmethod
    def single(cls, url: str) -> Shard:
        return cls(url, [url])

    def current(self) -> str:
        """The URL to send the next request to."""
        if self.primary is not None:
            return self.primary
        return self.members[self._next % len(self.members)]

    def resolve(self, advertised: str) -> str:
        """The URL to use for a member that names itself (or is named) `advertised`."""
        url = normalize_url(advertised)
        return self.aliases.get(url, url)

    def follow(self, advertised: str) -> str:
        """A member said the primary is `advertised`: remember it (as a member too) and return the
        URL to send to."""
        url = self.resolve(advertised)
        if url not in self.members:
            self.members.append(url)
        self.primary = url
        return url

    def failed(self, url: str) -> None:
        """`url` could not be reached (or has no primary to name): forget it as the primary and
        move on to the member after it."""
        if self.primary == url:
            self.primary = None
        if url in self.members:
            self._next = self.members.index(url) + 1

    def others(self, tried: Iterable[str]) -> bool:
        """Whether a member not in `tried` is left to try."""
        seen = set(tried)
        return any(m not in seen for m in self.members)

    def learn_aliases(self, given: str, view: object) -> None:
        """Map the advertised URL of the member reached at `given` to `given`, from its
        `GET /v1/cluster` answer (`self.member` and `members[].url`)."""
        if not isinstance(view, dict):
            return
        me = view.get("self")
        members = view.get("members")
        if not isinstance(me, dict) or not isinstance(members, list):
            return
        for m in members:
            if isinstance(m, dict) and m.get("member") == me.get("member") and isinstance(m.get("url"), str):
                advertised = normalize_url(m["url"])
                if advertised != given:
                    self.aliases[advertised] = given


def advertised_members(view: object) -> list[str]:
    """The members' advertised URLs in a `GET /v1/cluster` answer ([] when replication is off)."""
    if not isinstance(view, dict) or not isinstance(view.get("members"), list):
        return []
    return [normalize_url(m["url"]) for m in view["members"] if isinstance(m, dict) and isinstance(m.get("url"), str)]
