"""What a protocol adapter may use of its broker process: one typed seam (DESIGN.md §1).

The broker builds one ``BrokerServices`` once every shared part exists and passes it to each
adapter's constructor; an adapter reaches nothing else of the broker.  Data flows one way:
adapter → router → destination → storage; the cluster forwarder is the router's own
collaborator, here so that adapters can ask it about sessions and routes on other nodes.
"""

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from flowmq_broker.backpressure import Backpressure
from flowmq_broker.cluster import ClusterRouting
from flowmq_broker.connection_limits import ConnectionLimits
from flowmq_broker.queues import QueueService
from flowmq_broker.routing import CatalogSync, Router
from flowmq_core.acl import Authorizer
from flowmq_core.config import BrokerConfig
from flowmq_kas3.store import StreamStore
from flowmq_meta.api import MetaStore
from flowmq_meta.catalog import Catalog
from flowmq_meta.users import UserDirectory
from flowmq_objstore.api import ObjectStore


@dataclasses.dataclass(frozen=True, eq=False)
class BrokerServices:
    config: BrokerConfig
    node_id: str
    meta: MetaStore
    objects: ObjectStore
    router: Router
    catalog: Catalog
    # Adapters with state derived from the catalog (AMQP exchanges) reload on its changes.
    sync: CatalogSync
    streams: StreamStore
    queues: QueueService
    users: UserDirectory
    # Authorization (flowmq_core.acl): each connection takes ``authorizer.access(namespace,
    # user)`` once it knows both, and asks it; the rules reload on every ACL change.
    authorizer: Authorizer
    cluster: ClusterRouting
    # The node table with liveness from gossip (the cluster nodes API's rows).
    nodes: Callable[[], Awaitable[list[dict[str, Any]]]]
    # Call after committing a catalog change: applies it here, then tells the cluster.
    metadata_changed: Callable[[], Awaitable[None]]
    # Open connections per client listener and per client address: every client listener's
    # connections are admitted and released here (max_connections, ..._per_address).
    connection_limits: ConnectionLimits
    # Publishers paused while durable writes lag (backpressure.py): each adapter holds the
    # connections that publish while it is ``active``.
    pressure: Backpressure = dataclasses.field(default_factory=Backpressure)
