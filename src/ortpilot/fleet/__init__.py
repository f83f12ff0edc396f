"""Tuning a fleet: every machine class of a Ray cluster, one bundle (docs/concepts/fleets.md).

``fleet.run.tune_fleet`` (``ortpilot tune MODEL ... --ray ADDRESS``) finds the classes among the
cluster's nodes (``cluster``, ``nodes``), spreads the (model, class) searches over the hosts
(``schedule``: one per host at a time, longest first), runs each as the local tune in a child
process on its node (``remote``, ``child``), with models and results through Ray's object store
(``payload``), and writes the bundle. Ray is imported inside functions only: importing this
package does not import it.
"""
