"""Ray for env workers (`--workers`) and policy replicas (`--replicas`): started in this process, or the cluster
RAY_ADDRESS names (`ray start --head` on one machine, `ray start --address HEAD:6379` on the others)."""

from __future__ import annotations

import os
from typing import Any


def ensure_ray(num_cpus: int) -> Any:
    """The ray module, initialised: connected to the cluster RAY_ADDRESS names, or else started here with
    `num_cpus` CPUs (unless this process started it already)."""
    import ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):  # a cluster's resources are its own: asking for CPUs is an error
            ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:  # "local": a Ray of its own, even where another process on this machine started a cluster
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     ignore_reinit_error=True, configure_logging=False)
    return ray
