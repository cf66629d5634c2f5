"""The manager's own metrics: leader election (component-base's clientgo/leaderelection) and
which controllers run."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, disable_created_metrics

from pykcm.util.metricopts import ALPHA, BETA, kcm_help

disable_created_metrics()

# `name` is the Lease name. Both ALPHA in component-base.
leader_election_master_status = Gauge(
    "leader_election_master_status",
    kcm_help(ALPHA, "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 "
             "indicates master. 'name' is the string used to identify the lease. Please make sure to group by name."),
    ["name"],
)
leader_election_slowpath = Counter(
    "leader_election_slowpath_total",
    kcm_help(ALPHA, "Total number of slow path exercised in renewing leader leases. "
             "'name' is the string used to identify the lease. Please make sure to group by name."),
    ["name"],
)
running_managed_controllers = Gauge(
    "running_managed_controllers",
    kcm_help(BETA, "Indicates where instances of a controller are currently running"),
    ["name", "manager"],
)
