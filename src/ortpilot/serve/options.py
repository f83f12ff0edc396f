"""What ``ortpilot serve`` serves and how: the models (profiles or plain models) and the replica settings.

Plain data, no Ray: the CLI, the application builder and the KubeRay manifest all read the same
records, so ``--emit-rayservice`` describes exactly what ``serve`` would run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ortpilot.decode.options import (
    BASE,
    DEFAULT_DRAFT_TOKENS,
    DEFAULT_FORMAT_MIN_TOP1,
    DEFAULT_MAX_QUEUE,
    DEFAULT_MAX_STREAMS,
    DEFAULT_PREFILL_CHUNK,
    DEFAULT_PREFIX_CACHE_BYTES,
    DEFAULT_SPECULATION,
)
from ortpilot.errors import UsageError
from ortpilot.rayenv import is_loopback_host
from ortpilot.serve.access import AccessOptions
from ortpilot.serve.defaults import (
    DEFAULT_MAX_HEADER_KB,
    DEFAULT_MAX_REQUEST_MB,
    DEFAULT_MAX_REQUEST_TOKENS,
    DEFAULT_MAX_TEXTS,
    DEFAULT_PORT,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_TEXT_BATCH,
)
from ortpilot.serve.records import RequestSettings, Timeouts

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its name in the URL and what a replica loads.

    ``kind`` is ``profile`` (a tune output, verified against its reference outputs) or ``model``
    (an ONNX file served with a default strict CPU session: environment-verified only). A bundle is a
    ``profile`` whose ``bundle`` names its bundle.json: each replica loads its own node's class from it,
    and ``path`` is the class this machine would load (what the checks before Ray starts read). A
    text-model folder is a ``model`` whose ``folder`` names it (its replicas take text too:
    ``serve.textfacts``).
    """

    name: str
    kind: str  # "profile" | "model"
    path: str  # profile.json or the .onnx file, absolute (replicas may run in another working directory)
    source: str = ""  # what the user wrote (demo:encoder, OUT/, ...)
    bundle: str = ""  # a bundle's bundle.json, absolute ("" for a profile or a model)
    folder: str = ""  # a text-model folder the model file came in, absolute ("" otherwise)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ModelSpec:
        return cls(**dict(doc))


@dataclass(frozen=True)
class TextOptions:
    """How a text model's replicas take text (``docs/commands/serve.md``, Text models): texts per run, and
    the limits of one request. ``max_text_tokens`` None: the model's own limit (its folder's
    ``max_seq_length``); a lower one cuts (or, with ``truncate`` False, refuses) texts sooner."""

    batch: int = DEFAULT_TEXT_BATCH  # texts one session run holds (sorted by length, padded to the longest)
    max_texts: int = DEFAULT_MAX_TEXTS  # texts (or documents) in one request; more: 413
    max_text_tokens: int | None = None  # tokens per text, special tokens included (None: the model's limit)
    max_request_tokens: int = DEFAULT_MAX_REQUEST_TOKENS  # tokens of one request's texts together; more: 413
    truncate: bool = True  # a text over the limit is cut and the answer says so; False: 400

    def __post_init__(self) -> None:
        for flag, value, low in (
            ("--text-batch", self.batch, 1),
            ("--max-texts", self.max_texts, 1),
            ("--max-text-tokens", 2 if self.max_text_tokens is None else self.max_text_tokens, 2),
            ("--max-request-tokens", self.max_request_tokens, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise UsageError(f"{flag} must be an integer of at least {low}, got {value!r}.")

    def flags(self) -> list[str]:
        """The flags of the settings that differ from the defaults (what a decoder server refuses)."""
        default = TextOptions()
        names = {
            "batch": "--text-batch",
            "max_texts": "--max-texts",
            "max_text_tokens": "--max-text-tokens",
            "max_request_tokens": "--max-request-tokens",
            "truncate": "--no-truncate",
        }
        return [flag for key, flag in names.items() if getattr(self, key) != getattr(default, key)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> TextOptions:
        return cls(**dict(doc or {}))


MAX_REQUEST_MB = 2047  # gRPC takes a message size as a signed 32-bit count of bytes
MAX_BATCH_WAIT_MS = 60_000.0  # a batch that waits longer for company is a request that waits: a minute at most


@dataclass(frozen=True)
class ServeOptions:
    """Replica and batching settings shared by every served model."""

    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas, Ray Serve autoscaling on ongoing requests
    cpus_per_replica: float | None = None  # None: the CPU budget shared evenly by all replicas
    max_batch: int = 1  # 1: no dynamic batching
    batch_wait_ms: float = 0.0  # 0: no timer, a batch is what waited while the last run was busy
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB
    access_log: bool = True
    accept_machine: bool = False
    text: TextOptions = field(default_factory=TextOptions)  # text models: texts per run, request limits

    def __post_init__(self) -> None:
        if isinstance(self.text, Mapping):  # from a Serve config's args (the RayService manifest)
            object.__setattr__(self, "text", TextOptions.from_dict(self.text))
        if self.replicas < 1:
            raise UsageError(f"--replicas must be at least 1, got {self.replicas}.")
        if self.autoscale is not None:
            low, high = self.autoscale
            if low < 1 or high < low:
                raise UsageError(
                    f"--autoscale {low}:{high} needs 1 <= MIN <= MAX (a model is ready once a replica "
                    "verified, so it keeps at least one)."
                )
        # nan passes every comparison a bound is written with, and inf overflows where a count is made of it
        if self.cpus_per_replica is not None and not 0 < self.cpus_per_replica < math.inf:
            raise UsageError(f"--cpus-per-replica must be a number above 0, got {self.cpus_per_replica:g}.")
        if self.max_batch < 1:
            raise UsageError(f"--max-batch must be at least 1 (1 turns batching off), got {self.max_batch}.")
        if not 0 <= self.batch_wait_ms <= MAX_BATCH_WAIT_MS:
            raise UsageError(
                f"--batch-wait-ms must be from 0 to {MAX_BATCH_WAIT_MS:g} (a batch's wait for more requests), "
                f"got {self.batch_wait_ms:g}."
            )
        if not 0 < self.max_request_mb <= MAX_REQUEST_MB:
            raise UsageError(
                f"--max-request-mb must be above 0 and at most {MAX_REQUEST_MB} (gRPC's messages stop short of "
                f"2 GiB), got {self.max_request_mb:g}."
            )

    @property
    def initial_replicas(self) -> int:
        return self.autoscale[0] if self.autoscale else self.replicas

    @property
    def max_replicas(self) -> int:
        return self.autoscale[1] if self.autoscale else self.replicas

    def replica_cpus(self, models: int, budget: int) -> float:
        """Ray CPUs per replica: as given, or the budget shared by every replica that starts, a fraction of a
        CPU each when there are more replicas than CPUs (so all of them are scheduled at once)."""
        if self.cpus_per_replica is not None:
            return float(self.cpus_per_replica)
        return cpu_share(budget, models * self.initial_replicas)

    def check_fit(self, models: int, budget: int) -> None:
        """Exit 2 when the replicas that start, at ``--cpus-per-replica`` each, need more than the ``budget``
        CPUs of the Ray instance this server starts: Ray would schedule the others only once some stop."""
        replicas = models * self.initial_replicas
        cpus = self.replica_cpus(models, budget)
        if cpus * replicas <= budget + 1e-9:
            return
        fit = math.floor(budget / cpus + 1e-9)
        share = cpu_share(budget, replicas)
        raise UsageError(
            f"--cpus-per-replica {cpus:g} asks {replicas} replica(s) ({models} model(s) x "
            f"{self.initial_replicas}) for {cpus * replicas:g} CPUs, but this machine's CPU budget is {budget}: "
            f"only {fit} would start now, the others once one stops. Leave --cpus-per-replica out (the replicas "
            f"then share the {budget} CPUs from the start, {share:g} each), or give {share:g} or less."
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": self.text.to_dict()}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ServeOptions:
        doc = dict(doc)
        if doc.get("autoscale") is not None:
            doc["autoscale"] = tuple(doc["autoscale"])
        return cls(**doc)


CHAT_TEMPLATES = ("auto", "chatml")


@dataclass(frozen=True)
class DecoderOptions:
    """How a decoder is served behind the OpenAI API: its tokenizer and chat template, and the limits of
    each replica's continuous-batching engine (the ``ServeOptions`` of the decoder side)."""

    tokenizer: str | None = None  # tokenizer.json (default: the model folder's; demo:decoder has its own)
    chat_template: str = "auto"  # auto: the tokenizer's own (tokenizer_config.json), else ChatML if it has <|im_start|>
    max_streams: int = DEFAULT_MAX_STREAMS  # sequences one replica decodes together (slots of its KV buffer)
    max_queue: int = DEFAULT_MAX_QUEUE  # requests a replica queues beyond its streams (more get 429)
    max_length: int | None = None  # tokens per stream, prompt included (None: the model's positions, at most 1024)
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # prefill long prompts this many tokens at a time (0: whole prompts)
    # The engine (decode.options.EngineOptions): weight formats per step, prefix cache, speculation.
    formats: tuple[str, ...] = (BASE,)
    format_min_top1: float = DEFAULT_FORMAT_MIN_TOP1
    prefix_cache_mb: float = DEFAULT_PREFIX_CACHE_BYTES / 2**20  # 0: off
    speculation: str = DEFAULT_SPECULATION  # auto: prompt lookup where its drafts pay, per stream; on; off
    draft_tokens: int = DEFAULT_DRAFT_TOKENS

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", tuple(self.formats))
        if not 0 <= self.prefix_cache_mb < math.inf:
            raise UsageError(f"--prefix-cache-mb must be 0 (off) or a number of MiB, got {self.prefix_cache_mb:g}.")
        self.engine()  # the engine's own checks name the setting
        if self.chat_template not in CHAT_TEMPLATES:
            raise UsageError(f"--chat-template must be one of {', '.join(CHAT_TEMPLATES)}; got '{self.chat_template}'.")
        for flag, value, low in (
            ("--max-streams", self.max_streams, 1),
            ("--max-queue", self.max_queue, 0),
            ("--prefill-chunk", self.prefill_chunk, 0),
            ("--max-length", 2 if self.max_length is None else self.max_length, 2),
        ):
            if value < low:
                raise UsageError(f"{flag} must be at least {low}, got {value}.")

    def engine(self) -> Any:
        """The ``decode.EngineOptions`` of these settings."""
        from ortpilot.decode.options import EngineOptions

        return EngineOptions(
            formats=self.formats,
            format_min_top1=self.format_min_top1,
            prefix_cache_bytes=int(self.prefix_cache_mb * 2**20),
            speculation=self.speculation,
            draft_tokens=self.draft_tokens,
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "formats": list(self.formats)}

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> DecoderOptions:
        return cls(**dict(doc or {}))


@dataclass(frozen=True)
class ServerOptions:
    """Where a server listens, on which Ray it runs, the path requests take and what clients may see:
    shared by the OIP and the OpenAI applications."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    address: str | None = None  # join this Ray cluster (None: start a local Ray instance)
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S
    grpc_port: int | None = None  # KServe v2 over gRPC on this port (None: no gRPC)
    ingress: str = "auto"  # auto: HAProxy -> replicas where it can run; haproxy; proxy: Ray's classic proxy
    throughput_optimized: bool = True  # RAY_SERVE_THROUGHPUT_OPTIMIZED: user code on the replica's loop
    timeouts: Timeouts = field(default_factory=Timeouts)
    debug_info: bool = False  # metadata shows replicas' PIDs, hosts, nodes and paths
    access: AccessOptions = field(default_factory=AccessOptions)  # API keys, CORS origins, Host names
    max_header_kb: int = DEFAULT_MAX_HEADER_KB  # request line and headers together (HAProxy: 431 beyond)

    def __post_init__(self) -> None:
        from ortpilot.serve.fastpath import INGRESS_CHOICES
        from ortpilot.serve.haproxy import HAPROXY_BUFSIZE

        if not 1 <= self.max_header_kb <= HAPROXY_BUFSIZE // 2048:
            raise UsageError(
                f"--max-header-kb must be from 1 to {HAPROXY_BUFSIZE // 2048} (half of HAProxy's buffer), "
                f"got {self.max_header_kb}."
            )

        if not 0 < self.ready_timeout < math.inf:
            raise UsageError(f"--ready-timeout must be a number of seconds above 0, got {self.ready_timeout:g}.")
        if self.ingress not in INGRESS_CHOICES:
            raise UsageError(f"--ingress must be one of {', '.join(INGRESS_CHOICES)}; got '{self.ingress}'.")
        for flag, port in (("--port", self.port), ("--grpc-port", self.grpc_port)):
            if port is not None and not 1 <= port <= 65535:
                raise UsageError(f"{flag} must be a port number from 1 to 65535, got {port}.")
        if self.grpc_port is not None and self.grpc_port == self.port:
            raise UsageError(f"--grpc-port {self.grpc_port} is the HTTP port too; give gRPC a port of its own.")

    def netloc(self, port: int) -> str:
        """``HOST:PORT`` a client dials on this server's host (an IPv6 host in brackets)."""
        return f"{'[' + self.host + ']' if ':' in self.host else self.host}:{port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.netloc(self.port)}"

    @property
    def loopback(self) -> bool:
        return is_loopback_host(self.host)

    def requests(self, options: ServeOptions) -> RequestSettings:
        """The request settings every entry point of this server takes (they cross to each replica)."""
        return RequestSettings(
            access=self.access.policy(self.host),
            max_request_mb=options.max_request_mb,
            request_timeout_s=self.timeouts.request_s,
            access_log=options.access_log,
            debug_info=self.debug_info,
        )


CPU_STEP = 10_000  # Ray counts resources in steps of 1/10000


def cpu_share(budget: int, replicas: int) -> float:
    """``budget`` CPUs shared by ``replicas``: Ray CPUs each, rounded down to Ray's step so that all of them
    fit together (3 replicas on 2 CPUs: 0.6666 each); ORT gets ``ort_threads`` of it, so a replica's
    intra-op threads never exceed its share of whole CPUs (and are 1 when the share is below one CPU)."""
    return math.floor(budget * CPU_STEP / max(1, replicas)) / CPU_STEP


def ort_threads(cpus: float) -> int:
    """ORT intra-op threads for a replica given ``cpus`` Ray CPUs: whole CPUs, at least one."""
    return max(1, math.floor(cpus + 1e-9))


def parse_autoscale(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    low, colon, high = text.partition(":")
    try:
        if not colon:
            raise ValueError
        return int(low), int(high)
    except ValueError:
        raise UsageError(f"--autoscale '{text}' is not MIN:MAX (e.g. 1:4).") from None


def resolve_models(targets: Sequence[str], names: Sequence[str] = ()) -> list[ModelSpec]:
    """PROFILE arguments -> ModelSpecs: a profile.json or its folder, a model file, or ``demo:NAME``."""
    if not targets:
        raise UsageError("Give at least one PROFILE (a tune output folder or profile.json, a model, or demo:NAME).")
    if names and len(names) != len(targets):
        raise UsageError(
            f"--name is given {len(names)} time(s) for {len(targets)} PROFILE(s): give one per "
            "PROFILE, in order, or none (default names come from the folders or model files)."
        )
    specs = []
    for i, target in enumerate(targets):
        kind, path, default, bundle, folder = _resolve(target)
        name = names[i] if names else default
        if not _NAME.match(name):
            raise UsageError(
                f"Model name '{name}' (for {target}) is not usable in a URL: use letters, digits, "
                "'_', '.', '-' (give one with --name)."
            )
        specs.append(ModelSpec(name, kind, str(path), target, bundle, folder))
    seen: dict[str, str] = {}
    for spec in specs:
        if spec.name in seen:
            raise UsageError(
                f"Two models would be served as '{spec.name}' ({seen[spec.name]} and {spec.source}); "
                "give each its own --name."
            )
        seen[spec.name] = spec.source
    return specs


def _resolve(target: str) -> tuple[str, Path, str, str, str]:
    """(kind, path, default name, bundle.json or "", text folder or "") of one PROFILE argument."""
    from ortpilot.artifacts.bundle import bundle_path

    if target.startswith("demo:"):
        from ortpilot.models import demo_model_path

        path = Path(demo_model_path(target.split(":", 1)[1])).resolve()
        return "model", path, target.split(":", 1)[1], "", ""
    path = Path(target)
    bundle = bundle_path(path)
    if bundle is not None:  # checked now (hashes, one profile per class); each replica picks its node's class
        from ortpilot.session.bundle import choose_profile

        here = choose_profile(bundle, policy="allow", accept_machine=True)
        return "profile", here.profile.resolve(), bundle.resolve().parent.name, str(bundle.resolve()), ""
    if path.is_dir():
        if (path / "profile.json").is_file():
            return "profile", (path / "profile.json").resolve(), path.resolve().name, "", ""
        if (path / "tokenizer.json").is_file():  # a text-model folder: its task is read now (exit 2 naming a gap)
            from ortpilot.serve.textfacts import folder_task

            folder, _ = folder_task(path)
            return "model", folder.model_file.resolve(), path.resolve().name, "", str(folder.root.resolve())
        raise UsageError(
            f"'{target}' is a folder without profile.json or bundle.json. Serve a tune output folder "
            "('ortpilot tune MODEL -o DIR'), a bundle ('ortpilot tune MODEL --ray ADDRESS -o DIR'), a "
            "profile.json, a text-model folder (a sentence encoder, cross-encoder or classifier with its "
            "tokenizer.json), a model file or demo:NAME."
        )
    if not path.is_file():
        raise UsageError(
            f"'{target}' does not exist. Serve a tune output folder or profile.json, a model file or demo:NAME."
        )
    if path.suffix == ".json":
        return "profile", path.resolve(), path.resolve().parent.name, "", ""
    return "model", path.resolve(), path.stem, "", ""


__all__ = [
    "CHAT_TEMPLATES",
    "DEFAULT_PORT",
    "DecoderOptions",
    "ModelSpec",
    "ServeOptions",
    "ServerOptions",
    "TextOptions",
    "cpu_share",
    "ort_threads",
    "parse_autoscale",
    "resolve_models",
]
