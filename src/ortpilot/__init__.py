"""ortpilot: ONNX Runtime sessions that run where you asked, measured and tuned.

The public surface is small; everything else lives in one module per job (see README).
"""

from __future__ import annotations

from typing import Any

from ortpilot.api import load
from ortpilot.errors import (
    AccuracyGateError,
    InputError,
    ModelLoadError,
    OrtpilotError,
    ProviderError,
    ProviderFallbackError,
    StampMismatchError,
    UsageError,
    VerificationError,
)
from ortpilot.session import SessionSettings, VerifiedSession
from ortpilot.version import __version__


def __getattr__(name: str) -> Any:
    """``ortpilot.TuneRequest`` without importing the tuning package (and ORT's tools) at ``import ortpilot``."""
    if name == "TuneRequest":
        from ortpilot.tuning.request import TuneRequest

        return TuneRequest
    raise AttributeError(f"module 'ortpilot' has no attribute {name!r}")


def doctor(**kwargs: Any):
    """Inspect this environment: ORT distributions, providers, plugin EPs, GPU libraries, CPU ISA."""
    from ortpilot.session.probe import run_doctor

    return run_doctor(**kwargs)


def tune(
    model: Any = None,
    out_dir: str | None = None,
    budget_s: float | None = None,
    *,
    ray_address: str | None = None,
    progress: Any = None,
    **options: Any,
):
    """Search for the fastest configuration that passes the accuracy gate; write a profile.

    Takes a ``TuneRequest`` or its fields (``ortpilot.tuning.request``: every option and its default);
    ``progress`` is called with each ``Progress`` update (a line of text for a fleet).

    With ``ray_address`` (a Ray cluster's address), tune every machine class of that cluster and write
    a bundle (one profile per class) instead: ``model`` may then be a list of models (one bundle each,
    in ``out_dir/NAME``); returns a ``fleet.result.FleetResult``. See ``ortpilot.fleet.run.tune_fleet``.
    """
    if ray_address is not None:
        from ortpilot.fleet.run import fleet_request, tune_fleet

        models, request = fleet_request(model, out_dir, budget_s, **options)
        return tune_fleet(models, ray_address, request, progress=progress)
    from ortpilot.tuning import tune as _tune

    return _tune(model, out_dir, budget_s, progress=progress, **options)


def load_profile(path: str, **kwargs: Any) -> VerifiedSession:
    """Recreate and re-verify the session a tune profile describes; of a bundle (``ortpilot tune --ray``),
    the profile of this machine's class (``session.bundle`` says which)."""
    from ortpilot.session.profile import load_profile as _load_profile

    return _load_profile(path, **kwargs)


def verify(profile: str, **kwargs: Any):
    """Re-verify a tune profile here (environment, machine, reference outputs; latency with
    ``max_slowdown_pct``): what ``ortpilot verify`` runs. See ``ortpilot.tuning.verify.verify_profile``."""
    from ortpilot.tuning.verify import verify_profile

    return verify_profile(profile, **kwargs)


def text_model(model: str, **options: Any):
    """A text model built once and called many times: a tuned profile (or bundle, or tune OUTDIR) or a
    text-model folder (``tokenizer.json`` with sentence-transformers files or a classifier's
    ``config.json``). Returns a ``session.text.TextModel`` (``embed``, ``rerank``, ``classify``, and
    ``__call__`` for the details of a call). ``options``: ``max_batch``, ``lengths``, ``truncate``,
    ``pooling``, ``kind``, ``providers``, ``policy``, ``warm`` (a profile's warm-up at load) and what
    ``load_profile``/``load`` take (see ``ortpilot.api.text_model``)."""
    from ortpilot.api import text_model as _text_model

    return _text_model(model, **options)


def embed(model: str, texts: Any, *, truncate: bool = True, **options: Any):
    """Sentence vectors ``[len(texts), dim]`` (float32) from a sentence encoder's profile or folder: its
    tokenizer, its pooling, normalized where the folder says so. Texts must be non-empty strings;
    longer ones are cut at the model's limit with a warning (``truncate=False`` refuses them).
    Loads the model on every call, without a profile's warm-up (``session.warmup``: seconds spent for the
    sizes of many calls): keep a ``text_model(...)`` for repeated calls."""
    from ortpilot.data.textinput import check_texts

    texts = check_texts(texts)  # bad input is refused before the model loads
    return text_model(model, kind="embed", truncate=truncate, **{"warm": False, **options}).embed(texts)


def rerank(model: str, query: str, documents: Any, *, truncate: bool = True, **options: Any):
    """Relevance scores ``[len(documents)]`` of each document for the query, from a cross-encoder's
    profile or folder (sigmoid of its logit unless its config names another function). Loads the model on every
    call, as ``embed`` does."""
    from ortpilot.data.textinput import check_texts

    (query,) = check_texts([query], "query")
    documents = check_texts(documents, "documents")
    return text_model(model, kind="rerank", truncate=truncate, **{"warm": False, **options}).rerank(query, documents)


def classify(model: str, texts: Any, *, truncate: bool = True, **options: Any):
    """The most likely label of each text and its score, ``[(label, score), ...]``, from a sequence
    classifier's profile or folder (labels from ``config.json``'s ``id2label``). Loads the model on every call, as
    ``embed`` does."""
    from ortpilot.data.textinput import check_texts

    texts = check_texts(texts)
    return text_model(model, kind="classify", truncate=truncate, **{"warm": False, **options}).classify(texts)


def probe(provider: str):
    """Build and run a tiny strict session on ``provider`` alone: the doctor's proof that it works here.
    Returns a ``ProbeResult`` (``status`` ok/failed/skipped, ``reason``)."""
    from ortpilot.providers.names import canonical_name
    from ortpilot.session.probe import probe_provider

    return probe_provider(canonical_name(provider))


__all__ = [
    "AccuracyGateError",
    "InputError",
    "ModelLoadError",
    "OrtpilotError",
    "ProviderError",
    "ProviderFallbackError",
    "SessionSettings",
    "StampMismatchError",
    "TuneRequest",
    "UsageError",
    "VerificationError",
    "VerifiedSession",
    "__version__",
    "classify",
    "doctor",
    "embed",
    "load",
    "load_profile",
    "probe",
    "rerank",
    "text_model",
    "tune",
    "verify",
]
