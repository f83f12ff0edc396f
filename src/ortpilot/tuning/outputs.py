"""OUTDIR's files from a finished search: model.onnx, the reports, reference.npz, the optimized model, profile.json.

A text-model folder's meaning travels with the profile: its ``TextTask`` (``data.texttask``) is
recorded under ``text`` and its ``tokenizer.json`` copied beside the profile, so
``ortpilot.embed(profile)`` and a serving replica tokenize and pool as the folder says, wherever
the profile goes.

The winner's built model comes from the model cache (rebuilt through it, and refused if the
rebuild differs, when a resumed tune finds the entry gone: ``winner_model``); the profile is
written last, atomically, so an OUTDIR with a profile.json holds everything it names.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ortpilot.artifacts.atomic import atomic_write_bytes
from ortpilot.artifacts.profile import PROFILE_FILE, write_profile
from ortpilot.errors import UsageError
from ortpilot.graph.feeds import read_samples
from ortpilot.modelio import file_sha256
from ortpilot.providers.cpubudget import ort_default_threads
from ortpilot.providers.machine import machine_facts
from ortpilot.providers.machineclass import this_class
from ortpilot.tuning.budget import CANDIDATE_TIMEOUT_S
from ortpilot.tuning.journal import JOURNAL_NAME
from ortpilot.tuning.reference import HELDOUT_SEED, REFERENCE_FILE, read_reference
from ortpilot.tuning.result import TuneResult
from ortpilot.tuning.search import Entry
from ortpilot.tuning.warmup import measure_warmup
from ortpilot.tuning.worker import WorkerClient, WorkerCrash

MODEL_FILE = "model.onnx"
WORKLOAD_FILE = "workload.npz"
TOKENIZER_FILE = "tokenizer.json"
log = logging.getLogger("ortpilot")


def winner_model(worker: WorkerClient, winner: Entry, source: Path) -> Path:
    """The winner's built model; rebuilt through the model store when a resumed tune finds its cache
    entry gone (the cache was cleared in between), and refused if the rebuild differs."""
    built = winner.prepared.get("model_path")
    if not built:
        return source
    if _trusted_model(Path(built), source, winner.prepared.get("model_sha256")):
        return Path(built)
    try:
        result = worker.request("prepare", winner.candidate.to_dict(), CANDIDATE_TIMEOUT_S)
    except WorkerCrash as exc:
        result = {"status": "crashed", "error": str(exc)}
    if result.get("status") != "ok" or result.get("model_sha256") != winner.prepared.get("model_sha256"):
        raise UsageError(
            f"The winner's model ({winner.candidate.label}) is gone from the model cache and "
            f"rebuilding it gave {'a different model' if result.get('status') == 'ok' else result.get('error')}"
            "; its measurements do not hold for the rebuild. Drop --resume to tune again."
        )
    return Path(result["model_path"])


def _trusted_model(path: Path, source: Path, sha256: Any) -> bool:
    """A journaled model path is used only if it is the source or a model-cache entry, with the journaled hash:
    a journal must not make tune copy an arbitrary file into OUTDIR."""
    from ortpilot.artifacts.store import ModelStore

    real = Path(os.path.realpath(path))
    inside = real == Path(os.path.realpath(source)) or Path(os.path.realpath(ModelStore().root)) in real.parents
    return inside and real.is_file() and not path.is_symlink() and file_sha256(real) == sha256


def _write_reference(out: Path, winner: Entry, feeds: Mapping[str, Any]) -> Path:
    """OUTDIR/reference.npz: the first held-out sample and the winner's outputs on it, for ``verify``
    on other machines (hashes alone only prove a bit-exact rerun). The outputs are the worker's (the
    bytes ``output_sha256`` hashes); when a resumed tune's worker files are gone, the winner is rerun."""
    import numpy as np

    from ortpilot.artifacts.atomic import atomic_open

    names = list(winner.prepared.get("output_names") or [])
    outputs: dict[str, Any] = {}
    saved = Path(str(winner.prepared.get("outputs") or ""))
    if names and saved.is_file():
        first = (read_samples(saved) or [{}])[0]
        outputs = {name: first[name] for name in names if name in first}
    if not names or len(outputs) != len(names):
        from ortpilot.session import load
        from ortpilot.tuning.worker import _outputs

        cand = winner.candidate
        sess = load(
            str(out / MODEL_FILE),
            [(p["name"], p.get("options", {})) for p in cand.providers],
            "strict",
            settings=cand.settings,
        )
        outputs = dict(zip([o.name for o in sess.get_outputs()], _outputs(sess, feeds, cand.iobinding)))
    dest = out / REFERENCE_FILE
    with atomic_open(dest, "wb") as fh:
        np.savez(fh, **{f"inputs/{k}": v for k, v in feeds.items()}, **{f"outputs/{k}": v for k, v in outputs.items()})
    return dest


def _write_text(out: Path, source: Path, model_file: Path) -> dict[str, Any] | None:
    """The profile's ``text`` section for a text-model folder (its tokenizer copied into OUTDIR), None
    for any other model; the task is read against OUTDIR's model, whose outputs ``--outputs`` may prune."""
    from ortpilot.data import folder_of
    from ortpilot.data.texttask import text_task
    from ortpilot.graph.outputs import output_facts
    from ortpilot.modelio import load_model

    folder = folder_of(source)
    if folder is None or folder.tokenizer_file is None:
        return None
    try:
        task = text_task(folder, output_facts(load_model(model_file, load_external_data=False)))
    except UsageError as exc:
        log.info("The profile records no text task for '%s': %s", folder.root, exc)
        return None
    dest = out / TOKENIZER_FILE
    atomic_write_bytes(dest, folder.tokenizer_file.read_bytes())
    return {"task": task.to_dict(), "tokenizer": {"file": TOKENIZER_FILE, "sha256": file_sha256(dest)}}


def _write_workload(out: Path, result: TuneResult, replay: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """OUTDIR/workload.npz: the requests one timed run replays, for ``verify --bench`` to time what the tune timed;
    the profile's ``workload`` section (None for a tune of one shape: the reference sample is that request)."""
    import numpy as np

    from ortpilot.artifacts.atomic import atomic_open
    from ortpilot.graph.feeds import samples_to_arrays

    if result.workload is None or len(replay) < 2:
        return None
    dest = out / WORKLOAD_FILE
    with atomic_open(dest, "wb") as fh:
        np.savez(fh, **samples_to_arrays(replay))
    return {**result.workload.to_dict(), "file": dest.name, "file_sha256": file_sha256(dest)}


def write_outputs(
    result: TuneResult,
    source: Path,
    built: Path,
    reference_feeds: Mapping[str, Any],
    replay: list[Mapping[str, Any]] | None = None,
) -> None:
    from ortpilot.tuning.report import reference_name, write_reports

    out = result.out_dir
    out.mkdir(parents=True, exist_ok=True)
    winner = result.winner
    model_file = out / MODEL_FILE
    # An earlier tune's profile goes first: the profile is written last, so an interrupt between here and there
    # leaves a folder without one (nothing loads or verifies), never an old profile beside this tune's model.
    (out / PROFILE_FILE).unlink(missing_ok=True)
    atomic_write_bytes(model_file, built.read_bytes())
    latency = {
        "objective": result.objective,
        "winner": result.stats(winner),
        "baseline": result.stats(result.baseline),
        "speedup_vs_default": result.speedup,
        "measured_against": reference_name(result.baseline.candidate.to_dict()),
        "interleaved": bool(winner.final and result.baseline.final),
        "load_avg": result.load_avg,
        "others_cpu": result.others_cpu,
    }
    result.files = {
        "model": str(model_file),
        "profile": str(out / PROFILE_FILE),
        "reference": str(out / REFERENCE_FILE),
        "report_html": str(out / "report.html"),
        "report_md": str(out / "report.md"),
        "journal": str(out / JOURNAL_NAME),
    }
    settings = profile_settings(winner, result.facts.default_threads)
    shaped = winner.candidate.shape_plan is not None  # its sessions are made per bucket at load, from model.onnx
    requests = list(replay or [])
    if not shaped:  # a bucket's session is static: prepared when made
        result.warmup = measure_warmup(
            model_file, list(winner.candidate.providers), settings, result.workload, requests
        )
    write_reports(result)
    reference = _write_reference(out, winner, reference_feeds)
    workload = _write_workload(out, result, requests)
    optimized = (
        None if shaped else _write_optimized(out, model_file, list(winner.candidate.providers), settings, reference)
    )
    compiled = None if shaped else _write_compiled(out, model_file, list(winner.candidate.providers), reference)
    text = _write_text(out, source, model_file)
    write_profile(
        out / PROFILE_FILE,
        model_file=model_file,
        providers=list(winner.candidate.providers),
        settings=settings.to_dict(),
        iobinding=winner.candidate.iobinding,
        machine=machine_facts(),
        passes=winner.prepared.get("passes") or [],
        accuracy=winner.accuracy or {},
        latency=latency,
        extra={
            "machine_class": this_class().to_dict(),
            "candidate": winner.candidate.to_dict(),
            "reference_outputs": {
                **({"heldout_seed": HELDOUT_SEED} if result.gate_data.get("source") == "synthetic" else {}),
                "inputs_sha256": result.heldout_sha256,
                "sha256": winner.prepared.get("output_sha256") or {},
                "file": reference.name,
            },
            "source_model": {"path": str(Path(source).resolve()), "sha256": file_sha256(source)},
            "shapes": {k: list(v) for k, v in result.shapes.items()},
            **({"outputs": list(result.outputs)} if result.outputs else {}),
            **({"workload": workload} if workload else {}),
            **({"warmup": result.warmup.to_dict()} if workload and result.warmup else {}),
            **({"shape_plan": winner.candidate.shape_plan} if shaped else {}),
            "placement": winner.prepared.get("placement"),
            "default_best": result.default_best,
            **({"default_best_reason": result.default_best_reason} if result.default_best else {}),
            "gate_data": result.gate_data,
            "calibration_data": result.calibration_data,
            **({"optimized_model": optimized} if optimized else {}),
            **({"compiled_model": compiled} if compiled else {}),
            **({"text": text} if text else {}),
        },
    )
    if workload:
        result.files["workload"] = str(out / workload["file"])
    if optimized:
        result.files["optimized_model"] = str(out / optimized["file"])
    if compiled:
        result.files["compiled_model"] = str(out / compiled["file"])
    if text:
        result.files["tokenizer"] = str(out / TOKENIZER_FILE)


def profile_settings(winner: Entry, default_threads: int) -> Any:
    """The session settings the profile records: the winner's, thread counts made explicit (the count ORT's
    default started where it was measured: ``default_threads``), except for ORT's default session itself kept as
    the winner, which is recorded unchanged. ORT's default pool pins its threads to CPUs and a session with an
    explicit count pins none, so the explicit twin is another session: the tune times it as its own candidate
    (``intra=N``), and a profile that shipped it for "ORT default" shipped a session the tune had not picked."""
    if winner.candidate.baseline:
        return winner.candidate.settings
    return winner.candidate.settings.with_explicit_threads(default_threads or ort_default_threads())


def _write_optimized(
    out: Path, model_file: Path, providers: list[dict[str, Any]], settings: Any, reference: Path
) -> dict[str, Any] | None:
    """The ORT-optimized winner for serving replicas (``tune.optimized``), checked on the reference sample."""
    from ortpilot.tuning.optimized import write_optimized_model

    inputs, outputs = read_reference(reference)
    return write_optimized_model(out, model_file, providers, settings, inputs, outputs)


def _write_compiled(
    out: Path, model_file: Path, providers: list[dict[str, Any]], reference: Path
) -> dict[str, Any] | None:
    """OpenVINO's compiled winner (``tune.compiled``), checked on the reference sample."""
    from ortpilot.tuning.compiled import write_compiled_model

    inputs, outputs = read_reference(reference)
    return write_compiled_model(out, model_file, providers, inputs, outputs)


__all__ = ["MODEL_FILE", "WORKLOAD_FILE", "profile_settings", "winner_model", "write_outputs"]
