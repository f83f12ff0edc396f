"""A KServe ``InferenceService`` that serves an exported Triton model repository.

KServe's Triton runtime (``kserve-tritonserver``) is picked by ``modelFormat.name: triton`` and
speaks the Open Inference Protocol (``protocolVersion: v2``); ``storageUri`` is the repository
root (the folder holding ``NAME/config.pbtxt``), which KServe copies to ``/mnt/models``. The
manifest is written as YAML and read back, and the fields KServe documents are checked, so a
typo in it is an ortpilot bug found here rather than a ``kubectl apply`` error later.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ortpilot.errors import UsageError, VerificationError

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
STORAGE_PLACEHOLDER = "s3://CHANGE-ME/{repo}"  # where the user uploads the repository folder
# Kubernetes object names: a DNS-1123 label (KServe also builds host names from it).
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://.+")


def service_name(model_name: str) -> str:
    """A DNS-1123 label from a Triton model name: lower case, runs of other characters as '-'."""
    name = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")
    name = name if name and name[0].isalpha() else f"m-{name}".rstrip("-")
    return name[:63].rstrip("-")


def inference_service(model_name: str, repo_name: str, *, gpu: bool, storage_uri: str | None = None) -> dict[str, Any]:
    """The manifest as a dict: one Triton predictor for the repository, one GPU when the model needs it."""
    model: dict[str, Any] = {
        "modelFormat": {"name": "triton"},
        "protocolVersion": "v2",
        "storageUri": storage_uri or STORAGE_PLACEHOLDER.format(repo=repo_name),
    }
    if gpu:
        model["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": service_name(model_name), "annotations": {"ortpilot.dev/triton-model": model_name}},
        "spec": {"predictor": {"model": model}},
    }


def manifest_yaml(manifest: dict[str, Any]) -> str:
    yaml = require_yaml()
    header = (
        "# Written by ortpilot export triton. Upload the model repository folder and set storageUri to it;\n"
        "# KServe's Triton runtime copies it to /mnt/models and serves it over the Open Inference Protocol.\n"
    )
    return header + yaml.safe_dump(manifest, sort_keys=False)


def check_manifest(text: str, path: str | Path = "InferenceService") -> dict[str, Any]:
    """Load the YAML back and check the fields KServe documents for a Triton predictor."""
    yaml = require_yaml()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise VerificationError(f"'{path}' is not valid YAML ({exc}); ortpilot wrote it, so this is a bug.") from None
    problems = []
    if not isinstance(doc, dict):
        raise VerificationError(f"'{path}' does not hold a mapping; ortpilot wrote it, so this is a bug.")
    if doc.get("apiVersion") != API_VERSION or doc.get("kind") != KIND:
        problems.append(f"apiVersion/kind are not {API_VERSION} / {KIND}")
    name = (doc.get("metadata") or {}).get("name", "")
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        problems.append(f"metadata.name '{name}' is not a DNS-1123 label")
    model = ((doc.get("spec") or {}).get("predictor") or {}).get("model") or {}
    if (model.get("modelFormat") or {}).get("name") != "triton":
        problems.append("spec.predictor.model.modelFormat.name is not 'triton'")
    if model.get("protocolVersion") != "v2":
        problems.append("spec.predictor.model.protocolVersion is not 'v2'")
    if not isinstance(model.get("storageUri"), str) or not _URI.match(model["storageUri"]):
        problems.append("spec.predictor.model.storageUri is not a URI (scheme://path)")
    if problems:
        raise VerificationError(
            f"'{path}' is not a valid InferenceService: {'; '.join(problems)}. ortpilot wrote "
            "it, so this is a bug in ortpilot."
        )
    return doc


def require_yaml() -> Any:
    """PyYAML, imported on first use (only the manifest needs it)."""
    try:
        import yaml
    except ImportError:
        raise UsageError(
            "--emit-inferenceservice needs PyYAML to write and check the manifest: "
            "pip install 'ortpilot[export]' (or: pip install pyyaml)."
        ) from None
    return yaml
