"""The manager's own metrics: leader election (component-base's clientgo/leaderelection) and
which controllers run."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, disable_created_metrics

disable_created_metrics()

# `name` is the Lease name.
leader_election_master_status = Gauge(
    "leader_election_master_status",
    "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. "
    "'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
)
leader_election_slowpath = Counter(
    "leader_election_slowpath_total",
    "Total number of slow path exercised in renewing leader leases. "
    "'name' is the string used to identify the lease. Please make sure to group by name.",
    ["name"],
)
running_managed_controllers = Gauge(
    "running_managed_controllers",
    "Indicates where instances of a controller are currently running",
    ["name", "manager"],
)
