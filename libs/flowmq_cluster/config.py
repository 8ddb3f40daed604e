"""Gossip (SWIM) parameters; defaults are hashicorp/memberlist's LAN profile (DESIGN.md §6)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class GossipConfig:
    gossip_interval: float = 0.2  # seconds between gossip rounds
    gossip_nodes: int = 3  # peers per gossip round
    probe_interval: float = 1.0  # seconds between failure-detector probes
    probe_timeout: float = 0.5  # wait for a direct ack before asking for indirect probes
    indirect_checks: int = 3  # members asked to ping-req a silent target
    suspicion_mult: int = 4  # suspicion timeout = mult * max(1, log10(N+1)) * probe_interval
    retransmit_mult: int = 4  # piggyback limit = mult * ceil(log10(N+1))
    push_pull_interval: float = 30.0  # full-state exchange with one random member
    gossip_to_dead_time: float = 30.0  # keep gossiping to a dead member this long
    dead_retention: float = 120.0  # forget dead/left members after this long
    event_dedup_ttl: float = 300.0  # remember delivered (origin, seq) this long
    max_datagram: int = 1400  # bytes per UDP datagram
    max_piggyback: int = 64  # broadcasts piggybacked per datagram at most
    leave_timeout: float = 0.5  # how long stop(leave=True) keeps re-sending "left"

    def __post_init__(self) -> None:
        if self.probe_timeout >= self.probe_interval:
            raise ValueError("probe_timeout must be shorter than probe_interval")
        if min(self.gossip_interval, self.probe_interval, self.push_pull_interval) <= 0:
            raise ValueError("intervals must be positive")
        if self.max_datagram < 512:
            raise ValueError("max_datagram must be at least 512 bytes")

    def suspicion_timeout(self, n: int) -> float:
        """Seconds a member stays suspect before it is declared dead (n = cluster size)."""
        return self.suspicion_mult * max(1.0, math.log10(n + 1)) * self.probe_interval

    def retransmit_limit(self, n: int) -> int:
        """How many times one broadcast is piggybacked by one node."""
        return self.retransmit_mult * max(1, math.ceil(math.log10(n + 1)))

    def detection_bound(self, n: int) -> float:
        """Upper bound (s) from a crash until every survivor marks the node dead.

        Worst case for a cluster of ``n`` (counting the crashed node): a survivor's
        round-robin probe list reaches the crashed node at most 2*(n-1)-1 probe intervals
        after its last successful probe; that probe fails after one probe interval (direct
        timeout + indirect probes); the suspicion timeout runs; then the "dead" update
        spreads by gossip (bounded here by retransmit_limit gossip rounds).
        """
        first_probe = max(1, 2 * (n - 1) - 1) * self.probe_interval
        spread = self.retransmit_limit(n) * self.gossip_interval
        return first_probe + self.probe_interval + self.suspicion_timeout(n) + spread
