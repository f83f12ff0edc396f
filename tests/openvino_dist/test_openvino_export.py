"""The OpenVINO lane's end of ``ortpilot export triton``: an OpenVINO profile exports to a config whose
backend-built session (OpenVINO with device_type CPU, then CPU, as Triton's backend appends them)
gives the profile's reference outputs."""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from ortpilot.artifacts.profile import write_profile
from ortpilot.graph.feeds import make_feeds
from ortpilot.modelio import file_sha256, load_model
from ortpilot.session import load
from ortpilot.tuning.reference import array_digest as _digest
from ortpilot.tuning.tune import HELDOUT_SEED, feeds_digest

OV = "OpenVINOExecutionProvider"
pytestmark = [
    pytest.mark.openvino,
    pytest.mark.skipif(
        OV not in ort.get_available_providers(),
        reason="OpenVINOExecutionProvider not available (pip install onnxruntime-openvino)",
    ),
]


def test_openvino_profile_exports_to_a_config_that_reproduces_the_reference(demo_paths, tmp_path):
    pytest.importorskip("tritonclient.grpc")
    from ortpilot.export import export_triton
    from ortpilot.export.triton_session import backend_session, warmup_samples

    model = demo_paths["cnn"]
    sess = load(str(model), ["openvino"], policy="strict")
    feeds = make_feeds(load_model(model), seed=HELDOUT_SEED)
    names = [o.name for o in sess.get_outputs()]
    reference = {n: _digest(o) for n, o in zip(names, sess.run(None, feeds))}
    profile = write_profile(
        tmp_path / "profile.json",
        model_file=model,
        providers=[p.to_dict() for p in sess.requested],
        settings={},
        extra={
            "source_model": {"path": str(model), "sha256": file_sha256(model)},
            "shapes": {k: list(v.shape) for k, v in feeds.items()},
            "reference_outputs": {
                "heldout_seed": HELDOUT_SEED,
                "inputs_sha256": feeds_digest(feeds),
                "sha256": reference,
            },
        },
    )
    result = export_triton(profile, tmp_path / "repo", name="cnn")
    assert result.providers == ["openvino", "cpu"] and result.kind == "KIND_CPU"
    session, run_options = backend_session(result.model_dir)
    assert session.get_providers()[0] == OV
    got = session.run(None, warmup_samples(result.model_dir)[0], run_options)
    print(json.dumps({"reference": reference, "exported": {n: _digest(o) for n, o in zip(names, got)}}))
    assert {n: _digest(o) for n, o in zip(names, got)} == reference
