"""Ray's HAProxy manager, asked to load its routes again when a model answers over HTTP but HAProxy never
learned its gRPC route.

Ray's HAProxy manager reloads HAProxy on each change of the replicas it is told of, retries a failed
reload twice, and then waits for the next change. On a loaded machine the last reload of a start can
fail that way (seen in CI: five text models up over HTTP, two with no gRPC route for 300 s); nothing
changes afterwards, so nothing reloads. Handing the manager the routes it already holds
(``update_target_groups(get_target_groups())``, the two calls Ray's own controller makes) writes the
config and reloads HAProxy once more.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

PROXY_ACTOR_PREFIX = "SERVE_PROXY_ACTOR"  # Ray's name for each node's proxy (or HAProxy manager) actor
SERVE_NAMESPACE = "serve"


def proxy_actors(ray: Any) -> list[Any]:
    """The handles of the proxy actors Ray Serve runs on this cluster (one per node)."""
    names = ray.util.list_named_actors(all_namespaces=True)
    return [
        ray.get_actor(entry["name"], namespace=entry["namespace"])
        for entry in names
        if entry["namespace"] == SERVE_NAMESPACE and entry["name"].startswith(PROXY_ACTOR_PREFIX)
    ]


def reload_routes(timeout_s: float = 10.0) -> int:
    """Ask every HAProxy manager to write its config and reload HAProxy again; returns how many did.
    Ray's classic proxy has no such methods and is left alone."""
    import ray

    done = 0
    for actor in proxy_actors(ray):
        try:
            groups = ray.get(actor.get_target_groups.remote(), timeout=timeout_s)
            ray.get(actor.update_target_groups.remote(groups), timeout=timeout_s)
        except Exception as exc:  # the classic proxy, or a proxy being replaced: nothing to reload
            log.debug("no route reload on %s: %s", actor, exc)
            continue
        done += 1
    return done


__all__ = ["proxy_actors", "reload_routes"]
