"""Functions behind CLI commands that are not a single layer's job (thin glue, no logic of its own)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from ortpilot.errors import StampMismatchError, UsageError, require_bools
from ortpilot.graph.feeds import make_feeds, plan_feeds
from ortpilot.graph.shapes import check_shape_names, graph_inputs, parse_shape_args
from ortpilot.quantmodes import DYNAMIC
from ortpilot.session import SessionSettings, VerifiedSession
from ortpilot.session import load as load_verified

if TYPE_CHECKING:
    from pathlib import Path

    from ortpilot.gate.flow import QuantizeReport
    from ortpilot.gate.options import GateOptions
    from ortpilot.measure.bench import BenchResult, Progress
    from ortpilot.measure.config_file import ConfigEntry
    from ortpilot.measure.interleave import ComparisonResult
    from ortpilot.measure.options import BenchConfig, BenchOptions
    from ortpilot.measure.regression import Baseline, RegressionVerdict
    from ortpilot.passes.options import DecoderFusionOptions, QuantizeModeOptions


def load(
    model: str | os.PathLike | bytes | onnx.ModelProto,
    providers: Any = None,
    policy: str = "warn",
    *,
    model_file: str | None = None,
    **kwargs: Any,
) -> VerifiedSession:
    """``ortpilot.load``: the verified session, plus rebuild-on-mismatch for stamped artifacts.

    ``model`` may be a model folder (optimum export, Hugging Face ``onnx/``, onnxruntime-genai):
    its model file is used, ``model_file`` choosing among several. The session layer refuses an
    offline-optimized model stamped for another EP or ORT; when the stamp names a source model
    that still exists unchanged, the passes layer rebuilds it for what is in use (logged) and the
    rebuilt model is loaded instead.
    """
    if isinstance(model, (str, os.PathLike)) and (model_file is not None or os.path.isdir(model)):
        from ortpilot.data import model_path_of

        model = model_path_of(model, model_file)
    try:
        return load_verified(model, providers, policy, **kwargs)
    except StampMismatchError:
        if not isinstance(model, (str, os.PathLike)):
            raise
        from ortpilot.modelio import load_model
        from ortpilot.passes.rebuild import check_or_rebuild
        from ortpilot.providers import resolve_providers

        rebuilt = check_or_rebuild(load_model(model, load_external_data=False), resolve_providers(providers))
        if rebuilt is None:
            raise
        return load_verified(rebuilt, providers, policy, **kwargs)


def run_once(
    model: str,
    providers: Sequence[str] | None,
    *,
    policy: str = "warn",
    min_coverage: float | None = None,
    level: str = "all",
    feeds: Mapping[str, np.ndarray] | None = None,
    shapes: Sequence[str] = (),
    isolate: bool = False,
) -> dict[str, Any]:
    """Load verified, run once (generated inputs unless given), describe everything."""
    shape_map = parse_shape_args(list(shapes))
    sess = load(
        model,
        providers,
        policy,
        min_coverage=min_coverage,
        settings=SessionSettings(level=level),
        shapes=shape_map,
        isolate=isolate,
    )
    generated = ""
    if shape_map:
        check_shape_names(graph_inputs(sess.model), shape_map)
    if feeds:
        feeds = sess.check_feeds(feeds)
    else:
        plan = plan_feeds(sess.model, shape_map)
        feeds = make_feeds(sess.model, plan=plan)
        generated = plan.describe()
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(None, feeds)
    outputs = []
    for name, value in zip(names, values):
        arr = np.asarray(value)
        numeric = arr.size and np.issubdtype(arr.dtype, np.number)
        outputs.append(
            {
                "name": name,
                "shape": list(arr.shape),
                "dtype": str(arr.dtype),
                "min": float(np.nanmin(arr)) if numeric else 0.0,
                "max": float(np.nanmax(arr)) if numeric else 0.0,
                "nan": int(np.isnan(arr).sum()) if numeric and np.issubdtype(arr.dtype, np.floating) else 0,
            }
        )
    return {"session": sess.to_dict(), "generated_inputs": generated, "outputs": outputs}


def inspect_model(
    model: str | os.PathLike,
    shapes: Sequence[str] = (),
    providers: Sequence[str] = (),
    check: bool = True,
    isolate: bool = False,
    model_file: str | None = None,
) -> dict[str, Any]:
    """The ``inspect --json`` document: the static summary plus ``unsupported_ops`` per provider.

    ``model`` may be a model folder: its model file (``model_file`` choosing among several) is
    described, and the document's ``folder`` section lists that file, the layout, and every value
    read beside it with the file it came from (``data.ModelFolder.to_dict``).

    The graph is validated first (dangling edges, cycles, malformed Einsum, onnx's checker):
    an invalid graph raises ``ModelLoadError`` (exit 2) instead of being described. ``check``
    runs the provider op-support check (it builds sessions); ``isolate`` builds one in a child
    process first, so a model that crashes ORT kills only the child.
    """
    from ortpilot.graph.check import check_graph
    from ortpilot.graph.shapes import resolve_input_shapes
    from ortpilot.graph.summary import summarize
    from ortpilot.modelio import load_model
    from ortpilot.providers import resolve_providers

    folder = None
    if os.path.isdir(model):
        from ortpilot.data import resolve_model_folder

        folder = resolve_model_folder(model, model_file)
        model = folder.model_file
    path = str(model)
    proto = load_model(path, load_external_data=False)
    validity = check_graph(proto)  # before anything runs shape inference or builds a session
    if isolate:
        preflight_isolated([path], list(providers) or None)
    shape_map = parse_shape_args(list(shapes))
    if shape_map:
        inputs = graph_inputs(proto)
        check_shape_names(inputs, shape_map)
        resolve_input_shapes(inputs, shape_map)  # explicit shapes that contradict the model: exit 2
    doc = summarize(proto, path, shape_map).to_dict()
    doc["graph_check"] = validity.to_dict()
    if folder is not None:
        doc["folder"] = folder.to_dict()
    doc["unsupported_ops"] = []
    if check:
        from ortpilot.session.opsupport import unsupported_ops

        names = [s.name for s in resolve_providers(list(providers), apply_defaults=False)] if providers else None
        doc["unsupported_ops"] = [o.to_dict() for o in unsupported_ops(proto, path, names, shape_map or None)]
    return doc


def preflight_isolated(
    models: Sequence[str], providers: Sequence[str] | None = None, settings: SessionSettings | None = None
) -> None:
    """``--isolate``: create a session for each model in a child process before the real work.

    Raises ``OrtCrashError`` (exit 1) when ORT crashes or hangs in the child; an ordinary load
    error there returns quietly, so the command's own load reports it with the usual message.
    """
    from ortpilot.providers import resolve_providers
    from ortpilot.session.isolate import preflight_in_child

    requested = resolve_providers(list(providers) if providers else None)
    for model in dict.fromkeys(models):  # once per model, in order
        preflight_in_child(model, requested, settings or SessionSettings())


def compare(
    model: str,
    other: str | None = None,
    providers: Sequence[str] | None = None,
    gate: GateOptions | None = None,
    *,
    inputs: Mapping[str, np.ndarray] | None = None,
    all_samples: bool = False,
    shapes: Sequence[str] = (),
    n_samples: int | None = None,
    tolerances: Any = None,
    **keywords: Any,
) -> Any:
    """``ortpilot compare``: ``other`` against ``model`` (or ``model`` on two providers), output by output.

    ``gate``: how outputs are held to each other (``gate.options.GateOptions``), or its fields as keywords:
    ``metric`` (``--metric`` overrides of each output's gate metric), ``calibration``, and for decoders
    ``min_top1``, ``new_tokens`` and ``tokenizer``. Two decoders with a KV cache, and no inputs given, are
    compared on what generation uses (the generation gate: top-1 next-token agreement, KL; prompts from
    ``tokenizer`` or random token ids) and return a ``gate.generation.DecoderComparison``; everything else
    runs ``measure.compare.compare_models`` on ``inputs``, ``calibration`` samples or ``n_samples``
    generated inputs (None: ``measure.compare.COMPARE_SAMPLES``) and returns its ``Comparison``. ``calibration`` (what
    ``passes.calibration.load_calibration`` reads: arrays, or ``ortpilot.data.real_data`` text and images)
    gives the held-out samples of its split, the ones quantize and tune gate on, or every sample with
    ``all_samples``; the result's ``gate_data`` says which. :func:`compare_failure` says whether the result
    fails (``tolerances``: ``measure.compare.Tolerances``, the limits it exits 1 over).
    """
    from ortpilot.artifacts.fields import record_or_fields
    from ortpilot.decode.signature import is_kv_decoder
    from ortpilot.gate.options import GateOptions
    from ortpilot.measure.compare import COMPARE_SAMPLES, compare_models

    gate, _ = record_or_fields(GateOptions, gate, keywords)
    unused = [f for f in ("max_error", "outputs", "auto_exclude") if getattr(gate, f) != getattr(GateOptions(), f)]
    if unused:
        raise UsageError(
            f"compare measures every output against its limits (--atol/--rtol); {', '.join(unused)} of its gate "
            "options are for quantize and tune."
        )
    chain = list(providers) if providers else None
    if other is not None and not inputs and not gate.calibration and is_kv_decoder(model) and is_kv_decoder(other):
        from ortpilot.decode.gate import compare_decoders, text_prompts

        _no_metric(gate.metric, "two decoders are compared on generation (top-1 next-token agreement, --min-top1)")

        return compare_decoders(
            model,
            other,
            text_prompts(gate.tokenizer) if gate.tokenizer else None,
            new_tokens=gate.new_tokens,
            gate=gate.generation_gate(),
            providers=chain,
        )
    from ortpilot.data import DataSource

    samples = None
    shape_map = parse_shape_args(list(shapes))
    data: dict[str, Any] = {}
    if inputs:
        samples = [dict(inputs)]
        data = DataSource.of_samples(samples, "files").describe(1)
    elif gate.calibration is not None:
        from ortpilot.modelio import load_model
        from ortpilot.passes.calibration import load_calibration

        found = load_calibration(gate.calibration, load_model(model, load_external_data=False), shapes=shape_map)
        if all_samples:
            samples, data = found.samples, found.origin.describe(len(found), len(found))
        else:
            samples = found.split()[1]
            data = found.gate_data()
    result = compare_models(
        model,
        other,
        chain,
        samples=samples,
        shapes=shape_map,
        n_samples=COMPARE_SAMPLES if n_samples is None else n_samples,
        tolerances=tolerances,
        metrics=list(gate.metric) or None,
    )
    result.gate_data = data or DataSource("synthetic").describe(result.samples)
    return result


def _no_metric(metric: Any, why: str) -> None:
    if metric:
        raise UsageError(f"--metric sets how outputs are compared, but {why}; drop --metric.")


def compare_failure(result: Any) -> Exception | None:
    """The error a ``compare`` result exits with: a decoder pair under the generation gate (exit 1), outputs
    over explicitly given tolerances (exit 1); None when it passes."""
    from ortpilot.errors import AccuracyGateError, VerificationError
    from ortpilot.gate.generation import DecoderComparison

    if isinstance(result, DecoderComparison):
        return (
            None
            if result.passed
            else AccuracyGateError(f"The decoder pair fails the generation gate: {'; '.join(result.failures)}.")
        )
    if result.tolerances_explicit and not result.passed:
        failed = [o.name for o in result.outputs if not o.passed] + result.only_in_reference
        return VerificationError(
            f"Output(s) {', '.join(failed)} exceed the given tolerances; see the minimum "
            "atol/rtol that would pass above."
        )
    return None


def quantize_gated(
    model: str | os.PathLike | onnx.ModelProto,
    output: str | os.PathLike | None,
    options: QuantizeModeOptions | str | None = None,
    gate: GateOptions | None = None,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    fusion: DecoderFusionOptions | None = None,
    **keywords: Any,
) -> QuantizeReport:
    """``ortpilot quantize``: quantize ``model`` as ``options`` say, gate it, write ``output`` only if it passes.

    ``options``: the record of a ``--mode`` (``passes.options``: ``QuantizeOptions`` for ORT's INT8 modes,
    ``OpenVINOInt8Options`` for NNCF's, ``WeightOnlyOptions`` for int4/int8-weights), or the mode's name
    (default dynamic) with its settings as keywords (``per_channel=True``). ``gate``: a ``GateOptions``, or
    its fields as keywords (``calibration=...``, ``max_error=0.01``, ``auto_exclude=True``).

    Every mode is the one gated-quantization flow (``gate.flow``) and returns its ``QuantizeReport``
    (``to_dict()``: the ``--json`` document). INT8 modes are gated on every output against the float model
    on held-out calibration samples (``gate.quantize.quantize_int8_gated``: ``gate.metric`` overrides each
    output's metric, ``gate.outputs`` prunes the model to the outputs the deployment reads; keywords
    ``providers``, ``worst_n``, ``holdout_fraction`` go to it). Weight-only modes quantize a decoder's
    weights, ``fusion`` (or ``fuse=True``) fusing its attention first, and are gated on generation
    (``decode.gate.quantize_weight_only_gated``: ``gate.min_top1``, prompts from ``gate.tokenizer``). Both
    rescue a failing model with the one auto-exclude loop (``gate.auto_exclude``) and raise
    ``AccuracyGateError`` (exit 1) without writing when it still fails.
    """
    from ortpilot.gate.options import gate_keywords
    from ortpilot.passes.options import PassOptions, WeightOnlyOptions, quantize_options

    gate, settings = gate_keywords(gate, keywords)
    flow = {
        k: settings.pop(k)
        for k in ("providers", "worst_n", "holdout_fraction", "fuse", "max_positions")
        if k in settings
    }
    if not isinstance(options, PassOptions):
        options = quantize_options(options or DYNAMIC, **settings)
    elif settings:
        raise UsageError(
            f"Give the {type(options).__name__} or its settings ({', '.join(sorted(settings))}), not both."
        )
    if isinstance(options, WeightOnlyOptions):
        from ortpilot.decode.gate import quantize_weight_only_gated, text_prompts

        _no_metric(
            gate.metric, f"--mode {options.mode} is gated on generation (top-1 next-token agreement, --min-top1)"
        )
        if gate.outputs:
            raise UsageError(
                f"--outputs prunes a model to the outputs a deployment reads; --mode {options.mode} quantizes a "
                "decoder, whose generation loop reads its logits and every present cache. Drop --outputs."
            )
        return quantize_weight_only_gated(
            model,
            output,
            options,
            prompts=text_prompts(gate.tokenizer) if gate.tokenizer else None,
            gate=gate.generation_gate(),
            auto=gate.auto_exclude,
            new_tokens=gate.new_tokens,
            fusion=fusion,
            **{k: v for k, v in flow.items() if k in ("fuse", "max_positions")},
        )
    from ortpilot.gate.quantize import quantize_int8_gated

    if fusion is not None or flow.get("fuse") or flow.get("max_positions") is not None:
        raise UsageError(
            f"The decoder fusion (fuse) runs before the weight-only modes; --mode {options.mode} does not take it."
        )
    extras = {k: v for k, v in flow.items() if k not in ("fuse", "max_positions")}
    return quantize_int8_gated(model, output, options, gate, shapes=shapes, **extras)


# ---------------------------------------------------------------------------------------------
# ortpilot bench: what the command needs from measure, graph, session and artifacts


def check_report_path(path: str) -> None:
    """``bench --report``: a path the HTML report can be written to, checked before minutes of measuring."""
    from ortpilot.artifacts.atomic import check_output_path

    check_output_path(path, "--report", "report.html")


def read_bench_configs(path: str) -> list[ConfigEntry]:
    """``bench --configs FILE.json``: its entries, each a label and the flags of one configuration."""
    from ortpilot.measure.config_file import read_config_file

    return read_config_file(path)


def bench_config(
    model: Any,
    settings: SessionSettings | None = None,
    *,
    name: str = "",
    providers: Sequence[str] = (),
    iobinding: bool = False,
    shapes: Sequence[str] = (),
    feeds: Mapping[str, np.ndarray] | None = None,
    concurrency: int = 1,
) -> BenchConfig:
    """One ``bench`` configuration from its flags (``measure.options.BenchConfig``).

    ``settings``: the session's (``--level``, ``--threads`` ...; ``free_dimension_overrides`` from
    ``--free-dim``, which also size generated inputs where no ``--shape`` sets that dim); ``shapes``:
    ``--shape`` texts.
    """
    from ortpilot.measure.options import BenchConfig, check_concurrency

    check_concurrency(concurrency)
    settings = settings or SessionSettings()
    shape_map = parse_shape_args(list(shapes))
    for dim, value in settings.free_dimension_overrides.items():
        shape_map.setdefault(dim, (value,))
    return BenchConfig(
        name=name,
        model=model,
        providers=list(providers) or None,
        settings=settings,
        shapes=shape_map,
        feeds=feeds or None,
        iobinding=iobinding,
        concurrency=concurrency,
    )


def free_dims(texts: Mapping[str, str]) -> dict[str, int]:
    """``--free-dim DIM=N`` texts (DIM -> N) as ORT's free-dimension overrides: each N a positive integer."""
    return {name: _free_dim(name, text) for name, text in texts.items()}


def _free_dim(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--free-dim {name}={text}: the value must be an integer.") from None
    if value <= 0:
        raise UsageError(f"--free-dim {name}={text}: the value must be positive.")
    return value


def prepare_baseline(path: str | None, max_slowdown: Any, configs: Sequence[BenchConfig]) -> Baseline | None:
    """``bench --baseline/--max-slowdown``: the saved run, checked against ``configs`` before measuring
    (``measure.regression.prepare_baseline``); None without a baseline."""
    from ortpilot.measure.regression import prepare_baseline as prepare

    return prepare(path, max_slowdown, [c.model for c in configs])


def preflight_bench(configs: Sequence[BenchConfig]) -> None:
    """``bench --isolate``: a session in a child process once per distinct model, providers and
    settings, since a crash can depend on any of them."""
    distinct = {json.dumps([c.model, c.providers, c.settings.to_dict()], default=str): c for c in configs}
    for c in distinct.values():
        preflight_isolated([c.model], c.providers, c.settings)


def bench(
    configs: Sequence[BenchConfig], options: BenchOptions | None = None, *, progress: Progress | None = None
) -> BenchResult | ComparisonResult:
    """``ortpilot bench``: one configuration measured alone (``measure.bench.bench``), or several
    interleaved in this process, the first the baseline (``measure.interleave.bench_interleaved``),
    as ``options`` say (``measure.options.BenchOptions``; None: its defaults).

    A failing run raises ``BenchmarkRunError`` (exit 1); :func:`bench_partial` gives what it measured.
    """
    if len(configs) == 1:
        from ortpilot.measure.bench import bench as bench_one

        return bench_one(configs[0], options, progress=progress)
    from ortpilot.measure.interleave import bench_interleaved

    return bench_interleaved(configs, options, progress=progress)


def bench_partial(exc: BaseException) -> BenchResult | None:
    """The statistics of the runs before a failing one (``BenchmarkRunError``); None for any other error."""
    from ortpilot.measure.bench import BenchmarkRunError

    return exc.partial if isinstance(exc, BenchmarkRunError) else None


def judge_regression(baseline: Baseline, result: BenchResult | ComparisonResult) -> RegressionVerdict:
    """This run against the saved one (``measure.regression.judge``): is it slower beyond the noise?"""
    from ortpilot.measure.regression import judge

    return judge(baseline, result)


def write_bench_report(path: str, result: BenchResult | ComparisonResult) -> Path:
    """``bench --report``: the self-contained HTML report (histogram, time series, comparison); its path."""
    from ortpilot.measure.html_report import write_report

    return write_report(path, result)


def _profile_of(target: str | os.PathLike) -> str | None:
    """The profile (or bundle) ``target`` names: a ``.json`` file, or a folder holding ``bundle.json`` or
    ``profile.json`` (a tune's OUTDIR); None for a model folder or file."""
    from pathlib import Path

    from ortpilot.artifacts.bundle import bundle_path

    path = Path(target)
    if bundle_path(path) is not None:
        return str(path)
    if path.is_dir():
        return str(path / "profile.json") if (path / "profile.json").is_file() else None
    return str(path) if path.suffix == ".json" else None


def text_model(
    model: str | os.PathLike,
    *,
    providers: Any = None,
    policy: str | None = None,
    pooling: str | Sequence[str] | None = None,
    max_batch: int | None = None,
    lengths: Sequence[int] | None = None,
    truncate: bool = True,
    max_length: int | None = None,
    run_cost: float | None = None,
    model_file: str | None = None,
    kind: str | None = None,
    warm: bool = True,
    **load_options: Any,
) -> Any:
    """``ortpilot.text_model``: a ``session.text.TextModel`` for a tuned profile (or bundle, or tune OUTDIR)
    or a text-model folder, built once and called many times.

    A profile loads with ``load_profile`` (``policy`` strict unless given; its providers are the
    profile's) and reads the task and tokenizer the tune recorded; a folder loads with ``load``
    (``policy`` warn unless given) and reads its files (``data.texttask``); ``pooling`` names the
    pooling of a folder that does not say it. ``max_batch``, ``lengths``, ``truncate``, ``max_length`` and
    ``run_cost``: see ``TextModel``. ``kind`` (``embed``, ``rerank``, ``classify``): the task the caller wants; another is
    a UsageError naming the one the model does. ``warm``: a profile's warm-up at load, where it has one
    (``session.warmup``; a folder has no workload to warm at). ``load_options`` go to ``load_profile`` or ``load``.
    """
    from pathlib import Path

    from ortpilot.data import folder_of, resolve_model_folder
    from ortpilot.data.texttask import no_tokenizer_message
    from ortpilot.session.profile import load_profile
    from ortpilot.session.text import DEFAULT_MAX_BATCH, TextModel, task_of_folder, text_task_of_profile

    require_bools({"truncate": truncate, "warm": warm})
    options: dict[str, Any] = {
        "max_batch": DEFAULT_MAX_BATCH if max_batch is None else max_batch,
        "lengths": lengths,
        "max_length": max_length,
    }
    if run_cost is not None:
        options["run_cost"] = run_cost
    profile = _profile_of(model)
    if profile is not None:
        if providers is not None or pooling is not None or model_file is not None:
            raise UsageError(
                f"'{model}' is a profile: its providers, pooling and model file are the ones the tune recorded. "
                "Leave providers=, pooling= and model_file= out, or give the model folder instead."
            )
        _refuse_unknown(load_profile, load_options, "load_profile")
        session = load_profile(profile, policy or "strict", warm=warm, **load_options)
        chosen = session.bundle.profile if getattr(session, "bundle", None) is not None else profile
        task, tokenizer = text_task_of_profile(session.profile, chosen)
        plan = getattr(session, "plan", None)  # a shape plan: each run pads straight to its bucket
        if lengths is None and plan is not None:
            options["lengths"] = list(plan.sizes)
        text = TextModel(session, task, tokenizer, truncate=truncate, source=f"Profile '{chosen}'", **options)
        return _of_kind(text, kind)
    path = Path(model)
    if path.is_dir():
        folder = resolve_model_folder(path, model_file)
    else:
        folder = folder_of(path) if model_file is None and path.is_file() else None
        if folder is None:
            raise UsageError(
                f"'{model}' is not a text-model folder or a profile: a text model needs the folder its model came "
                "in (model.onnx beside tokenizer.json and the sentence-transformers or config.json files), or "
                "the profile.json a tune of that folder wrote."
            )
    if folder.tokenizer_file is None:
        raise UsageError(no_tokenizer_message(folder, kind or "a text model"))
    _refuse_unknown(load_verified, load_options, "load")  # ortpilot.load hands its keywords to the session's
    session = load(str(folder.model_file), providers, policy or "warn", **load_options)
    task = task_of_folder(folder, session, pooling)
    text = TextModel(session, task, folder.tokenizer_file, truncate=truncate, source=f"'{folder.root}'", **options)
    return _of_kind(text, kind)


def _refuse_unknown(call: Any, options: Mapping[str, Any], name: str) -> None:
    """``text_model``'s options beyond its own go to ``call``: one it does not take is a UsageError naming what it
    takes (it was a TypeError from inside the load)."""
    import inspect

    taken = [
        p for p, v in inspect.signature(call).parameters.items() if v.kind == v.KEYWORD_ONLY or v.default is not v.empty
    ]
    unknown = sorted(set(options) - set(taken))
    if unknown:
        raise UsageError(
            f"text_model() got unknown option(s) {', '.join(unknown)}: it takes providers, policy, pooling, max_batch, "
            f"lengths, truncate, max_length, run_cost, model_file, kind, warm, and what {name}() takes: "
            f"{', '.join(p for p in taken if p not in ('providers', 'policy'))}."
        )


def _of_kind(text: Any, kind: str | None) -> Any:
    from ortpilot.data.texttask import KINDS

    if kind is not None:
        if kind not in KINDS:
            raise UsageError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}.")
        text.check_kind(kind)
    return text
