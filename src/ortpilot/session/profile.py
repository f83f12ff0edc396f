"""Load a deploy profile as a verified session (``ortpilot.load_profile``).

The profile format and its environment checks live in ``ortpilot.artifacts.profile``; this
module recreates the session above them, so imports keep pointing down. Besides the model,
the ORT build and the providers, it checks the machine (``providers.machine``): a profile
whose winner can change here (an INT8 model moved across exact and saturating u8s8 kernels,
more threads than this process may use) is refused under ``strict`` unless the caller accepts
the machine, logged under ``warn``, and recorded under ``allow``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ortpilot.artifacts.bundle import bundle_path
from ortpilot.artifacts.profile import profile_file, read_profile, verify_environment
from ortpilot.artifacts.profile_schema import file_settings, model_outside_folder
from ortpilot.errors import OrtpilotError, StampMismatchError, UsageError, VerificationError
from ortpilot.providers.cpubudget import ort_default_threads
from ortpilot.providers.machine import MachineCheck, check_machine_section, compare_machines
from ortpilot.providers.plugins import compute_providers
from ortpilot.quantmodes import INT8_MODES
from ortpilot.session.bundle import choose_profile
from ortpilot.session.compiled import load_compiled
from ortpilot.session.options import SessionSettings
from ortpilot.session.verified import VerifiedSession, load
from ortpilot.session.warmup import WARM_BUDGET_S, Warmed, WarmupPlan, plan_problem, warm_at_sizes, warm_request

log = logging.getLogger("ortpilot")


class MachineMismatchWarning(UserWarning):
    """The profile was tuned on a machine whose differences can change its winner (policy ``warn``)."""


def profile_settings(doc: Mapping[str, Any], path: str | os.PathLike) -> SessionSettings:
    """The profile's ``session_settings``; settings this version cannot build are a UsageError naming the
    file (loading a profile and exporting one refuse them alike)."""
    try:
        return SessionSettings.from_dict(dict(doc["session_settings"]))
    except (TypeError, ValueError) as exc:
        raise UsageError(f"Profile '{path}' has invalid session settings ({exc}); regenerate it.") from None


def profile_runs_int8(doc: Mapping[str, Any]) -> bool:
    """Whether the profile's model is INT8-quantized (its tune candidate or its pass records say so)."""
    steps = (doc.get("candidate") or {}).get("passes") or []
    if any(isinstance(s, Mapping) and s.get("pass") == "quantize" for s in steps):
        return True
    return any(
        isinstance(r, Mapping)
        and (
            r.get("pass") == "quantize"
            or r.get("name") == "quantize"
            or (r.get("options") or {}).get("mode") in INT8_MODES
        )
        for r in doc.get("passes") or []
    )


def profile_threads(settings: SessionSettings) -> int:
    """The threads a session with ``settings`` runs here (intra-op, plus the inter-op pool in parallel mode)."""
    intra = settings.intra_op_threads or ort_default_threads()
    return intra * max(1, settings.inter_op_threads) if settings.execution_mode == "parallel" else intra


def check_machine(
    doc: Mapping[str, Any],
    path: str | os.PathLike,
    settings: SessionSettings,
    *,
    policy: str,
    accept_machine: bool = False,
) -> MachineCheck:
    """Compare the profile's machine with this one and apply ``policy`` to the decisive differences."""
    recorded = check_machine_section(doc.get("machine") or {}, str(path))
    check = compare_machines(recorded, int8=profile_runs_int8(doc), threads=profile_threads(settings))
    decisive = check.decisive
    if not decisive or accept_machine or policy == "allow":
        return check
    reasons = "; ".join(d.why for d in decisive)
    message = (
        f"Profile '{path}' was tuned on {check.recorded}; this machine is {check.here}. What differs can "
        f"change its winner: {reasons}. Re-run 'ortpilot tune' on this machine, or load it anyway with "
        "accept_machine=True (--accept-machine on the command line)."
    )
    if policy == "strict":
        raise VerificationError(message)
    log.warning(message)
    warnings.warn(message, MachineMismatchWarning, stacklevel=3)
    return check


def load_profile(
    path: str | os.PathLike,
    policy: str = "strict",
    *,
    accept_machine: bool = False,
    accept_fields: Sequence[str] = (),
    accept_model_outside: bool = False,
    intra_op_threads: int | None = None,
    optimized: bool = False,
    machine_class: str | None = None,
    node_cpus: int | None = None,
    warm: bool = True,
    warm_budget_s: float = WARM_BUDGET_S,
    **kwargs: Any,
) -> VerifiedSession:
    """Recreate the profiled session exactly and verify it (``ortpilot.load_profile``).

    ``path`` may be a bundle (a folder with ``bundle.json``, or the file): the profile of this
    machine's class loads (``session.bundle``; ``machine_class`` names another, ``node_cpus``
    replaces this process's CPU budget in the class, as a Ray node's CPUs do), and without one
    ``strict`` refuses unless ``accept_machine``, which takes the nearest class.

    Returns a ``VerifiedSession``; its ``profile`` attribute holds the parsed profile (whether
    to use IOBinding, the measured latency) and ``machine_check`` how this machine compares with
    the one it was tuned on. ``accept_machine`` loads a profile from a machine whose
    differences can change the winner. ``intra_op_threads`` replaces the profile's thread count
    (a serving replica runs on the CPUs it was given, not on those the tune had); the machine
    check then counts the replaced one. ``optimized`` loads the ORT-optimized graph the tune kept
    (``optimized_model``, a file beside the profile) with optimizations off, which skips graph
    optimization at creation; when it is missing, changed or stamped for another ORT/CPU, the
    profile's model loads instead (logged). ``warm``: where the profile's ``warmup`` says the session prepares
    each new input size on its first run (OpenVINO), run it once at the workload's sizes now
    (``session.warmup``, for at most ``warm_budget_s``; what it did is in the session's ``warmed``).
    ``kwargs`` go to ``ortpilot.session.load``.
    A profile is an input: settings that make ORT write or load files are refused unless named
    in ``accept_fields`` (as the error names them), and a model outside the profile's folder
    unless ``accept_model_outside``.
    """
    choice = None
    if bundle_path(path) is not None:
        choice = choose_profile(
            path, policy=policy, machine_class=machine_class, node_cpus=node_cpus, accept_machine=accept_machine
        )
        path = choice.profile
    path = profile_file(path)  # a tune output folder holding profile.json, as verify, serve and export take it
    doc = read_profile(path)
    _refuse_file_settings(doc, path, accept_fields, accept_model_outside)
    model = verify_environment(doc, path, compute_providers())
    settings = profile_settings(doc, path)
    if intra_op_threads is not None:
        settings = SessionSettings.from_dict({**settings.to_dict(), "intra_op_threads": max(1, int(intra_op_threads))})
    machine = check_machine(doc, path, settings, policy=policy, accept_machine=accept_machine)
    providers = [(p["name"], dict(p.get("options") or {})) for p in doc["providers"]]
    shapes = {k: tuple(v) for k, v in (doc.get("shapes") or {}).items()} or None
    expected = doc.get("placement") or {}
    if doc.get("shape_plan"):  # a session per bucket; requests at their own size are padded to theirs
        session = _load_shaped(doc, model, providers, policy, settings, shapes, **kwargs)
    else:
        session = load_compiled(doc, path, providers, policy, settings, shapes, **kwargs)  # OpenVINO's blob
        if session is not None:
            expected = doc["compiled_model"].get("placement") or {}
        elif optimized:
            session = _load_optimized(doc, path, providers, policy, settings, shapes, **kwargs)
            if session is not None:
                expected = doc["optimized_model"].get("placement") or {}
    if session is None:
        session = load(str(model), providers, policy, settings=settings, shapes=shapes, **kwargs)
    check_outputs(doc, path, [o.name for o in session.get_outputs()])
    if expected and session.placement is not None and policy == "strict":
        got = session.placement.counts
        if got != expected:
            raise StampMismatchError(
                f"Profile '{path}' recorded placement {expected}, but this session places "
                f"nodes as {got}. The environment differs from the one tuned; re-tune."
            )
    session.profile = doc
    session.warmed = _warm(doc, path, session, warm_budget_s) if warm and not doc.get("shape_plan") else None
    session.machine_check = machine
    session.bundle = choice  # the bundle's choice of profile (None for a profile.json)
    return session


def _load_shaped(
    doc: Mapping[str, Any],
    model: Path,
    providers: Any,
    policy: str,
    settings: SessionSettings,
    shapes: Any,
    **kwargs: Any,
) -> VerifiedSession:
    """The profile's shape plan: a session per bucket (``session.shaped``)."""
    from ortpilot.session.shaped import load_shaped
    from ortpilot.session.shapeplan import ShapePlan

    plan = ShapePlan.from_dict(doc["shape_plan"])
    return load_shaped(str(model), providers, policy, plan, settings=settings, shapes=shapes, **kwargs)


def _warm(doc: Mapping[str, Any], path: str | os.PathLike, session: VerifiedSession, budget_s: float) -> Warmed | None:
    """Run ``session`` at the shapes of the profile's warm-up plan, from the workload's largest request; None where
    the profile asks for none. A plan or workload file that cannot be used skips it with a warning (it only saves
    time), recorded in the result's ``note``."""
    from dataclasses import replace

    from ortpilot.graph.feeds import read_samples
    from ortpilot.modelio import file_sha256

    entry, workload = doc.get("warmup") or {}, doc.get("workload") or {}
    try:
        plan = WarmupPlan.from_dict(entry) if entry else None
    except UsageError as exc:
        log.warning("Profile '%s': no warm-up at load (%s).", path, exc)
        return Warmed((), 0, 0.0, f"skipped: {exc}")
    if plan is None or not plan.warm:
        return None
    name = str(workload.get("file") or "")
    file = Path(path).parent / name
    try:
        if not name or Path(name).name != name or not file.is_file():
            raise UsageError(f"its workload file '{name}' is missing")
        if file_sha256(file) != workload.get("file_sha256"):
            raise UsageError(f"its workload file '{name}' changed since the tune (sha256 differs)")
        request, stacks = warm_request(read_samples(file), plan.axes)
        if not stacks:
            plan = replace(plan, batches=(1,))
        problem = plan_problem(plan, workload, request)
        if problem:
            raise UsageError(problem)
    except (OrtpilotError, KeyError, IndexError, TypeError, ValueError, OSError) as exc:
        log.warning(
            "Profile '%s': no warm-up at load (%s); first requests at new sizes pay the EP's preparation.", path, exc
        )
        return Warmed((), len(plan.shapes()), 0.0, f"skipped: {exc}")
    warmed = warm_at_sizes(session, request, plan, budget_s)
    session._validated = False  # the caller's first request is still checked (names, dtypes, NaN)
    if warmed.note and warmed.note.startswith("stopped"):
        log.warning("Profile '%s': %s.", path, warmed.describe())
    else:
        log.info("Profile '%s': %s (the EP prepares each new input shape on its first run).", path, warmed.describe())
    return warmed


def check_outputs(doc: Mapping[str, Any], path: str | os.PathLike, have: Sequence[str]) -> None:
    """The outputs the profile records (``--outputs``) are exactly those its model returns, else
    ``VerificationError`` (exit 1) naming the difference: a deployment reads those names."""
    recorded = list(doc.get("outputs") or [])
    if not recorded:
        return
    gone = [n for n in recorded if n not in have]
    extra = [n for n in have if n not in recorded]
    if gone or extra:
        said = []
        if gone:
            said.append(f"records output(s) {', '.join(repr(n) for n in gone)}, which its model does not return")
        if extra:
            said.append(f"its model returns {', '.join(repr(n) for n in extra)}, which the profile does not record")
        raise VerificationError(
            f"Profile '{path}' {'; '.join(said)} (the model's outputs: {', '.join(have) or 'none'}). The profile "
            "or its model was edited since the tune; re-run 'ortpilot tune' with --outputs naming what the "
            "deployment reads."
        )


def _load_optimized(
    doc: Mapping[str, Any],
    path: str | os.PathLike,
    providers: list,
    policy: str,
    settings: SessionSettings,
    shapes: Any,
    **kwargs: Any,
) -> VerifiedSession | None:
    """The session on the profile's ``optimized_model`` (optimizations off), or None to load the plain one."""
    from ortpilot.modelio import file_sha256

    entry = doc.get("optimized_model") or {}
    name = str(entry.get("file") or "")
    file = Path(path).parent / name
    if not name or Path(name).name != name or not file.is_file():  # only a file beside the profile
        return None
    if file_sha256(file) != entry.get("sha256"):
        log.warning("The optimized model '%s' changed since it was tuned; loading the profile's model instead.", file)
        return None
    plain = SessionSettings.from_dict({**settings.to_dict(), "level": "disable", "optimized_model_filepath": ""})
    try:
        return load(str(file), providers, policy, settings=plain, shapes=shapes, **kwargs)
    except StampMismatchError as exc:
        log.warning("The optimized model does not fit here (%s); loading the profile's model instead.", exc)
        return None


def _refuse_file_settings(
    doc: dict[str, Any], path: str | os.PathLike, accept_fields: Sequence[str], accept_model_outside: bool
) -> None:
    """A profile from elsewhere must not make ORT write or load files its reader did not ask for."""
    refused = [f for f in file_settings(doc) if f not in set(accept_fields)]
    if refused:
        raise UsageError(
            f"Profile '{path}' sets {', '.join(refused)}, which make(s) ONNX Runtime write or load files "
            "(a saved model, an EP cache or library, a config entry outside the safe list). ortpilot "
            "does not take such settings from a profile file; if you trust it, pass "
            f"accept_fields={refused!r} to load_profile."
        )
    outside = None if accept_model_outside else model_outside_folder(doc, path)
    if outside is not None:
        raise UsageError(
            f"Profile '{path}' names the model '{doc['model']['file']}', which resolves to '{outside}', "
            "outside the profile's folder. Keep the model next to its profile, or pass "
            "accept_model_outside=True to load_profile if you trust this profile."
        )
