"""Export a verified profile as a Triton model repository for the ONNX Runtime backend.

``export_triton`` writes ``REPO/NAME/config.pbtxt``, ``REPO/NAME/1/model.onnx`` (the profile's
model, hash-checked), the warmup inputs under ``REPO/NAME/warmup/`` and ``REPO/NAME/ORTPILOT.md``
(what the profile promised that Triton will not check). The folder is built beside its
destination and renamed into place, so a polling server never sees half of it. The written
config is parsed back with Triton's protobuf classes and checked against the backend's rules;
a config that fails is an ortpilot bug (exit 1), never a file left behind.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortpilot.artifacts.atomic import atomic_dir, atomic_write_text, check_output_path
from ortpilot.artifacts.bundle import bundle_path, read_bundle
from ortpilot.artifacts.profile import profile_file, read_profile, verify_model_file
from ortpilot.errors import UsageError, VerificationError
from ortpilot.export import kserve
from ortpilot.export.losses import Loss, losses_markdown
from ortpilot.export.triton_backend import BACKEND_SOURCE, DEFAULT_MAX_BATCH
from ortpilot.export.triton_batch import BatchDecision, decide_batching, first_dims
from ortpilot.export.triton_config import (
    MODEL_FILE,
    VERSION_DIR,
    WARMUP_DIR,
    WarmupInput,
    build_config,
    check_config,
    parse_config,
    protobuf,
    render,
    warmup_file_name,
)
from ortpilot.export.triton_mapping import KIND_CPU, KIND_GPU, BackendSettings, map_profile
from ortpilot.graph.tensors import TensorSpec, model_tensors
from ortpilot.modelio import external_data_files, load_model
from ortpilot.passes.decoder_fusion import count_layers
from ortpilot.providers.machine import describe_machine
from ortpilot.providers.names import resolve_providers, short_name
from ortpilot.session.bundle import choose_profile
from ortpilot.session.options import SessionSettings
from ortpilot.session.profile import check_outputs, profile_settings
from ortpilot.session.verified import effective_settings

CONFIG_FILE = "config.pbtxt"
NOTES_FILE = "ORTPILOT.md"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ExportResult:
    """What an export wrote and what it could not carry over."""

    profile: Path
    model_dir: Path
    name: str
    max_batch_size: int
    batching: str  # why dim 0 is (or is not) Triton's batch dim
    kind: str
    providers: list[str]  # what the backend will append, in its order
    warmup: dict[str, Any]
    decoder: bool
    losses: list[Loss] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    config_text: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": str(self.profile),
            "model_dir": str(self.model_dir),
            "name": self.name,
            "max_batch_size": self.max_batch_size,
            "batching": self.batching,
            "kind": self.kind,
            "providers": self.providers,
            "warmup": self.warmup,
            "decoder": self.decoder,
            "losses": [loss.to_dict() for loss in self.losses],
            "files": self.files,
        }


def export_triton(
    profile: str | Path,
    repo: str | Path,
    *,
    name: str | None = None,
    max_batch: int | None = None,
    instances: int = 1,
    kind: str | None = None,
    force: bool = False,
    inferenceservice: str | Path | None = None,
    storage_uri: str | None = None,
    machine_class: str | None = None,
) -> ExportResult:
    """Write ``REPO/NAME`` for Triton's ONNX Runtime backend from a tune profile; see the module doc.

    ``profile`` may be a bundle with ``machine_class`` naming one of its classes (its profile is
    exported; :func:`export_triton_bundle` exports every class).

    ``max_batch``: Triton's ``max_batch_size`` (default 4, the backend's own default, when the
    model has a batch dim; 0 keeps the batch dim in ``dims``). ``kind``: ``CPU`` or ``GPU``
    instances (default: from the profile's first provider). ``force`` replaces an existing
    ``REPO/NAME`` whole. ``inferenceservice``: also write a KServe manifest for the repository.
    """
    profile = Path(profile)
    if bundle_path(profile) is not None:
        if machine_class is None:
            raise UsageError(
                f"'{profile}' is a bundle (one profile per machine class): name the class to export with --class "
                "NAME, or export every class (export_triton_bundle; the command line does it without --class)."
            )
        name = name or _model_name(None, bundle_path(profile))
        profile = choose_profile(profile, machine_class=machine_class).profile
    elif machine_class is not None:
        raise UsageError(f"--class chooses a profile of a bundle, and '{profile}' is not a bundle (no bundle.json).")
    profile = profile_file(profile)  # a tune output folder, as verify and serve take it
    doc = read_profile(profile)
    model_path = verify_model_file(doc, profile)
    name = _model_name(name, profile)
    dest = Path(repo) / name
    _check_request(dest, force=force, instances=instances, inferenceservice=inferenceservice)
    plan = _plan(profile, doc, model_path, name, max_batch=max_batch, instances=instances, kind=kind)
    manifest = None if inferenceservice is None else _manifest(plan, repo, inferenceservice, storage_uri)
    result, written = _write_repository(plan, dest, force=force)
    result.files = _files(dest, written)
    if manifest is not None:
        atomic_write_text(inferenceservice, manifest)
        result.files["inferenceservice"] = str(inferenceservice)
    return result


def export_triton_bundle(
    bundle: str | Path, repo: str | Path, *, name: str | None = None, **options: Any
) -> list[ExportResult]:
    """Every class of ``bundle`` as its own Triton model, ``REPO/NAME-CLASS`` (NAME: the bundle's folder).

    One model per class, not one version per class: a Triton model's config.pbtxt (thread counts,
    graph optimization level, execution mode) holds for all its versions, and those are what the
    classes' profiles differ in; a server of a class loads its class's model. ``options`` are
    :func:`export_triton`'s (an InferenceService manifest needs one class: ``machine_class``).
    """
    if options.get("inferenceservice") is not None:
        raise UsageError(
            "--emit-inferenceservice describes one Triton model: export one class of the bundle with --class NAME."
        )
    found = bundle_path(bundle)
    if found is None:
        raise UsageError(f"'{bundle}' is not a bundle (no bundle.json); export a profile with export_triton.")
    base = _model_name(name, found)
    read = read_bundle(found)
    return [
        export_triton(found, repo, name=f"{base}-{entry.name}", machine_class=entry.id, **options)
        for entry in read.entries
    ]


@dataclass
class _Plan:
    """What an export decided before writing a file: the model and its tensors, the backend, the warmup."""

    profile: Path
    doc: dict[str, Any]
    model_path: Path
    proto: onnx.ModelProto
    name: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batch: int
    batching: BatchDecision
    instances: int
    settings: SessionSettings
    backend: BackendSettings
    decoder: bool
    losses: list[Loss]
    feeds: dict[str, np.ndarray] | None
    warmup: dict[str, Any]


def _check_request(dest: Path, *, force: bool, instances: int, inferenceservice: str | Path | None) -> None:
    """What is refused before any work: a destination in use, the manifest's path, the instance count,
    and a missing tritonclient."""
    if dest.is_dir() and any(dest.iterdir()) and not force:
        raise UsageError(
            f"'{dest}' exists and is not empty. Pass --force to replace it (the new folder is built "
            "beside it and swapped in whole), or choose another -o REPO or --name."
        )
    if inferenceservice is not None:
        check_output_path(inferenceservice, "InferenceService manifest", "inferenceservice.yaml")
        kserve.require_yaml()
    if instances < 1:
        raise UsageError(f"--instances must be at least 1, got {instances}.")
    protobuf()  # a missing tritonclient is reported before any work


def _plan(
    profile: Path,
    doc: dict[str, Any],
    model_path: Path,
    name: str,
    *,
    max_batch: int | None,
    instances: int,
    kind: str | None,
) -> _Plan:
    """The backend settings the profile maps to, the model's tensors and batch size, what serving
    there loses, and the warmup inputs."""
    chain = resolve_providers(list(doc["providers"]))  # the chain load_profile runs, provider defaults included
    settings = effective_settings(profile_settings(doc, profile), chain)
    backend = map_profile(chain, settings, name=name, kind=_kind(kind))
    proto = load_model(model_path, load_external_data=False)
    inputs, outputs = model_tensors(proto)
    check_outputs(doc, profile, [o.name for o in outputs])  # the config exposes what the deployment reads
    feeds, warmup = _warmup_feeds(profile, doc, proto, inputs)
    batching = decide_batching(model_path, inputs, outputs, feeds) if max_batch != 0 else None
    batch = _max_batch(max_batch, batching, inputs)
    if batching is None:
        batching = BatchDecision(False, "--max-batch 0: the batch dim, if any, stays in dims")
    decoder = count_layers(proto) > 0
    losses = backend.losses + _deployment_losses(doc, decoder, batch, instances, backend, batching)
    if feeds is not None and batch > 0 and max(len(a) for a in feeds.values()) > 1:
        warmup["note"] += "; Triton's warmup repeats one batch element, so it holds the first of the batch"
    return _Plan(
        profile=profile,
        doc=doc,
        model_path=model_path,
        proto=proto,
        name=name,
        inputs=inputs,
        outputs=outputs,
        batch=batch,
        batching=batching,
        instances=instances,
        settings=settings,
        backend=backend,
        decoder=decoder,
        losses=losses,
        feeds=feeds,
        warmup=warmup,
    )


def _manifest(plan: _Plan, repo: str | Path, inferenceservice: str | Path, storage_uri: str | None) -> str:
    """The KServe InferenceService for the repository, checked before the repository is written."""
    manifest = kserve.manifest_yaml(
        kserve.inference_service(
            plan.name, Path(repo).resolve().name, gpu=plan.backend.kind == KIND_GPU, storage_uri=storage_uri
        )
    )
    kserve.check_manifest(manifest, inferenceservice)
    return manifest


def _write_repository(plan: _Plan, dest: Path, *, force: bool) -> tuple[ExportResult, list[WarmupInput]]:
    """``REPO/NAME`` built beside its destination and renamed into place: the model, the warmup
    inputs, config.pbtxt (checked), ORTPILOT.md."""
    with atomic_dir(dest, replace=force) as tmp:
        _copy_model(plan.model_path, plan.proto, tmp / VERSION_DIR)
        written = _write_warmup(tmp, plan.feeds, plan.inputs, plan.batch) if plan.feeds is not None else []
        text = _write_config(tmp, dest, plan, written)
        result = ExportResult(
            profile=plan.profile,
            model_dir=dest,
            name=plan.name,
            max_batch_size=plan.batch,
            batching=plan.batching.evidence,
            kind=plan.backend.kind,
            providers=[short_name(p) for p in plan.backend.provider_order],
            warmup=plan.warmup,
            decoder=plan.decoder,
            losses=plan.losses,
            config_text=text,
        )
        (tmp / NOTES_FILE).write_text(_notes(result, plan.doc, plan.settings), encoding="utf-8")
    return result, written


def _write_config(tmp: Path, dest: Path, plan: _Plan, written: list[WarmupInput]) -> str:
    """config.pbtxt, parsed back with Triton's protobuf classes and checked against the backend's rules."""
    text = render(
        build_config(
            plan.name,
            plan.inputs,
            plan.outputs,
            max_batch=plan.batch,
            instances=plan.instances,
            backend=plan.backend,
            warmup=written,
            warmup_name=plan.warmup["source"],
        )
    )
    (tmp / CONFIG_FILE).write_text(text, encoding="utf-8")
    problems = check_config(parse_config((tmp / CONFIG_FILE).read_text(encoding="utf-8"), dest / CONFIG_FILE), tmp)
    if problems:
        raise VerificationError(
            f"The config.pbtxt written for '{dest}' would not load as intended: "
            f"{'; '.join(problems)}. ortpilot wrote it, so this is a bug in ortpilot; "
            "nothing was left in the repository."
        )
    return text


def _files(dest: Path, written: list[WarmupInput]) -> dict[str, str]:
    """Where each file of the repository lies, as ``export --json`` lists them."""
    return {
        "config": str(dest / CONFIG_FILE),
        "model": str(dest / VERSION_DIR / MODEL_FILE),
        "notes": str(dest / NOTES_FILE),
        **{f"warmup:{w.name}": str(dest / WARMUP_DIR / w.file) for w in written},
    }


def _model_name(name: str | None, profile: Path) -> str:
    if name is None:
        folder = profile.resolve().parent.name
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", folder).lstrip("._-") or "model"
    if not _NAME.match(name):
        raise UsageError(
            f"--name '{name}' cannot be a Triton model folder: use letters, digits, '_', '.' and '-', "
            "starting with a letter or digit."
        )
    return name


def _kind(kind: str | None) -> str | None:
    if kind is None:
        return None
    key = kind.upper().removeprefix("KIND_")
    if key not in ("CPU", "GPU"):
        raise UsageError(f"--kind '{kind}' is not CPU or GPU.")
    return KIND_GPU if key == "GPU" else KIND_CPU


INT32_MAX = 2**31 - 1


def _max_batch(requested: int | None, batching: BatchDecision | None, inputs: list[TensorSpec]) -> int:
    if requested is not None and not 0 <= requested <= INT32_MAX:  # config.pbtxt's max_batch_size is an int32
        raise UsageError(f"--max-batch must be from 0 (no batching) to {INT32_MAX}, got {requested}.")
    if requested == 0 or batching is None:
        return 0
    if requested is None:
        return DEFAULT_MAX_BATCH if batching.batchable else 0
    if not batching.batchable:
        raise UsageError(
            f"--max-batch {requested}: the model has no batch dim Triton can take: {batching.evidence} "
            f"(first dims: {first_dims(inputs)}). Use --max-batch 0, or re-export the model with a batch dim."
        )
    return requested


def _deployment_losses(
    doc: dict[str, Any], decoder: bool, batch: int, instances: int, backend: BackendSettings, batching: BatchDecision
) -> list[Loss]:
    """What serving behind Triton drops whatever the settings: the checks a verified session makes."""
    ort_info = doc.get("onnxruntime") or {}
    machine = doc.get("machine") or {}
    out = [
        Loss(
            "placement",
            json.dumps(doc.get("placement") or {}, sort_keys=True),
            "Triton does not verify placement: nodes an EP cannot run go to the CPU without notice "
            "(no session.disable_cpu_ep_fallback), and nothing compares the placement with the profile's",
        ),
        Loss(
            "onnxruntime",
            f"{ort_info.get('version', '?')} ({ort_info.get('distribution', '?')})",
            "the Triton release brings its own ORT build; its kernels, fusions and defaults may differ, and nothing "
            "checks them against the build the profile was measured with",
        ),
        Loss(
            "machine",
            describe_machine(machine),
            "the latency figures hold for this machine; Triton does not compare the server's CPU (its INT8 kernel, "
            "its CPU budget) or GPU with it, as load_profile and 'ortpilot verify' do",
        ),
    ]
    compiled = doc.get("compiled_model") or {}
    if compiled:
        out.append(
            Loss(
                "compiled_model",
                f"{compiled.get('file')} ({compiled.get('plugin', '?')}, OpenVINO {compiled.get('openvino', '?')}, "
                f"{compiled.get('device', '?')})",
                "not exported: the blob is native code for the plugin's OpenVINO; Triton's backend carries its own "
                "OpenVINO build and compiles model.onnx at every model load (the cold start the blob saved)",
            )
        )
    if decoder:
        out.append(
            Loss(
                "decode loop",
                "KV cache (past_* / present*)",
                "Triton's ORT backend has no KV-cache loop: each request is one forward step, the client "
                "sends the past and receives the present cache every token (the whole cache crosses the "
                "network twice per token), and ortpilot generate's bound/shared loops (IOBinding, one "
                "preallocated KV buffer) have no equivalent there",
            )
        )
    if batch > 1:
        shapes = doc.get("shapes") or {}
        drift = batching.batch_vs_single
        numerics = (
            f"; a row's outputs in a batch of 2 differ from its outputs alone by up to {drift:.2g} of their "
            "largest magnitude (other kernels for another batch size)"
            if drift
            else ""
        )
        out.append(
            Loss(
                "max_batch_size",
                str(batch),
                f"the profile measured shapes {json.dumps(shapes)}; Triton's "
                f"dynamic batcher runs batches of up to {batch}, whose latency was never measured{numerics}",
            )
        )
    if instances > 1 and backend.kind == KIND_CPU:
        threads = backend.parameters.get("intra_op_thread_count", "0")
        out.append(
            Loss(
                "instance_group.count",
                str(instances),
                f"{instances} instances each run their own session "
                f"with intra_op_thread_count={threads} (0: one thread per core): together they share the "
                "cores the profile measured one session on",
            )
        )
    return out


def _warmup_feeds(
    profile: Path, doc: dict[str, Any], proto: onnx.ModelProto, inputs: list[TensorSpec]
) -> tuple[dict[str, np.ndarray] | None, dict[str, Any]]:
    """The profile's reference inputs (its reference.npz, else regenerated by seed and hash-checked);
    else inputs generated from the model, and said so."""
    if any(t.data_type == "TYPE_STRING" for t in inputs):
        return None, {"source": "none", "note": "string inputs: ortpilot writes no warmup for them"}
    note = ""
    reference = doc.get("reference_outputs") or {}
    if reference:
        try:
            feeds, how = _reference_inputs(profile, doc, [t.name for t in inputs])
            return feeds, {
                "source": "reference",
                "note": f"the tune's held-out reference inputs ({how})",
                "outputs_sha256": reference.get("sha256") or {},
            }
        except UsageError as exc:
            note = f"the profile's reference inputs could not be used ({exc}); "
    from ortpilot.graph.feeds import make_feeds, plan_feeds

    shapes = {k: tuple(v) for k, v in (doc.get("shapes") or {}).items()}
    try:
        feeds = make_feeds(proto, plan=plan_feeds(proto, shapes))
    except UsageError as exc:
        return None, {"source": "none", "note": note + f"no warmup: inputs could not be generated ({exc})"}
    return feeds, {
        "source": "generated",
        "note": note + "inputs generated by ortpilot from the model's input types and shapes, not real data "
        "and not the profile's reference inputs",
    }


def _reference_inputs(profile: Path, doc: dict[str, Any], names: list[str]) -> tuple[dict[str, np.ndarray], str]:
    """The reference sample from the reference file beside the profile (what verify runs), else
    regenerated from the source model by the recorded seed; ``names``: the model's inputs."""
    from ortpilot.tuning.reference import REFERENCE_FILE, feeds_digest, read_reference, reference_feeds

    reference = doc["reference_outputs"]
    data = doc.get("gate_data") or {}
    if "heldout_seed" in reference or data.get("source") == "synthetic":
        kind = "generated by the tune, not real data"
    else:
        kind = "real data" + (f" from {data['path']}" if data.get("path") else "")
    file_name = str(reference.get("file") or REFERENCE_FILE)
    file = profile.parent / file_name
    if Path(file_name).name == file_name and file.is_file() and not file.is_symlink():
        feeds, _ = read_reference(file)
        missing = sorted(set(names) - set(feeds))
        if missing:
            raise UsageError(f"'{file}' holds no input {', '.join(missing)} of the model")
        feeds = {name: feeds[name] for name in names}
        expected = reference.get("inputs_sha256")
        if expected and feeds_digest(feeds) != expected:
            raise UsageError(f"'{file}' does not hold the inputs the profile records (inputs_sha256 differs)")
        return feeds, f"{file_name}; {kind}"
    if "heldout_seed" not in reference or not doc.get("source_model"):
        raise UsageError(f"its {file_name} is missing beside '{profile}'")
    return reference_feeds(doc), f"regenerated from the source model by seed {reference['heldout_seed']}; {kind}"


def _write_warmup(
    folder: Path, feeds: dict[str, np.ndarray], inputs: list[TensorSpec], batch: int
) -> list[WarmupInput]:
    """One raw file per input (row-major, the input's dtype); with batching, one batch element."""
    (folder / WARMUP_DIR).mkdir()
    taken: set[str] = set()
    written = []
    for spec in inputs:
        array = np.ascontiguousarray(feeds[spec.name][0] if batch > 0 else feeds[spec.name])
        file = warmup_file_name(spec.name, taken)
        (folder / WARMUP_DIR / file).write_bytes(array.tobytes())
        written.append(WarmupInput(spec.name, spec.data_type, tuple(array.shape), file))
    return written


def _copy_model(model_path: Path, proto: onnx.ModelProto, version_dir: Path) -> None:
    """The profile's model file as ``1/model.onnx``, with its external data files beside it."""
    version_dir.mkdir()
    shutil.copyfile(model_path, version_dir / MODEL_FILE)
    for location in sorted(external_data_files(proto)):
        target = version_dir / location
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_path.parent / location, target)


def _notes(result: ExportResult, doc: dict[str, Any], settings: SessionSettings) -> str:
    """ORTPILOT.md: where the model came from, what config.pbtxt carries, and what it does not."""
    accuracy = doc.get("accuracy") or {}
    p50 = ((doc.get("latency") or {}).get("winner") or {}).get("p50_ms")
    gate = "passed" if accuracy.get("passed") else "not recorded"
    if "worst_error" in accuracy:
        gate += f" (worst error {accuracy['worst_error']:.3g} <= {accuracy.get('max_error')})"
    carried = (
        f"level {settings.level}, intra_op_threads {settings.intra_op_threads}, inter_op_threads "
        f"{settings.inter_op_threads}, execution_mode {settings.execution_mode}, cpu arena "
        f"{'on' if settings.enable_cpu_mem_arena else 'off'}, memory pattern "
        f"{'on' if settings.enable_mem_pattern else 'off'}"
    )
    return "\n".join(
        [
            f"# {result.name}: exported by ortpilot from a verified profile",
            "",
            (
                f"- Profile: `{result.profile}` (winner `{(doc.get('candidate') or {}).get('label', '?')}`, "
                f"model sha256 `{str(doc['model'].get('sha256', '?'))[:16]}…`)"
            ),
            (
                f"- Measured: p50 {f'{p50:.3f} ms' if p50 is not None else 'not recorded'} with ONNX Runtime "
                f"{(doc.get('onnxruntime') or {}).get('version', '?')}; accuracy gate {gate}"
            ),
            f"- Target: Triton's ONNX Runtime backend, read from {BACKEND_SOURCE}",
            (
                f"- Instances: {result.kind}; providers the backend appends: {' > '.join(result.providers)}; "
                f"max_batch_size {result.max_batch_size}"
            ),
            f"- Session settings carried: {carried}",
            f"- Warmup: {result.warmup['source']} ({result.warmup.get('note', '')})",
            f"- Batching: max_batch_size {result.max_batch_size}: {result.batching}",
            "",
            "## What is lost",
            "",
            "What the verified profile promised that Triton will not check or cannot express:",
            "",
            losses_markdown(result.losses).rstrip(),
            "",
            "## Checking this export without a Triton server",
            "",
            "```python",
            "from ortpilot.export.triton_session import backend_session, warmup_samples",
            f"MODEL_DIR = {str(result.model_dir)!r}",
            "session, run_options = backend_session(MODEL_DIR)  # the session the backend would build",
            "outputs = session.run(None, warmup_samples(MODEL_DIR)[0], run_options)",
            "```",
            "",
        ]
    )
