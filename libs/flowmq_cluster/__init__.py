"""flowmq_cluster: SWIM membership and event dissemination (DESIGN.md §6)."""

from flowmq_cluster.auth import ClusterSecret
from flowmq_cluster.config import GossipConfig
from flowmq_cluster.swim import EventId, Gossip, Member, Status

__all__ = ["ClusterSecret", "EventId", "Gossip", "GossipConfig", "Member", "Status"]
