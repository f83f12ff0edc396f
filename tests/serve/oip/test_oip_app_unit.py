"""serve.oip.app without a running Ray: a model's application as Ray Serve would deploy it."""

from __future__ import annotations

import pytest

from ortpilot.serve.oip.app import model_application
from ortpilot.serve.options import ModelSpec, ServeOptions, ServerOptions

pytest.importorskip("ray.serve")


def test_a_model_deployment_is_given_up_after_one_failed_start_per_replica(demo_paths):
    # a replica's start verifies the profile on its node: a retry there fails the same way (serve.defaults.start_tries)
    spec = ModelSpec("m", "model", str(demo_paths["mlp"]), "demo:mlp")
    for options, tries in ((ServeOptions(), 1), (ServeOptions(replicas=3), 3), (ServeOptions(autoscale=(2, 5)), 2)):
        deployment = model_application(spec, options, ServerOptions(), 1.0)._bound_deployment
        assert deployment._deployment_config.max_constructor_retry_count == tries, options
