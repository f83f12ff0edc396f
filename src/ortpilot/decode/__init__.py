"""Generation loops for ONNX decoders: plain numpy, IOBinding, a shared KV buffer for GQA, batched.

``generate(model, prompt_ids, ...)`` picks the fastest loop the model supports; ``Generator``
keeps one session for repeated calls; ``Scheduler`` serves many requests at once on one
batched shared buffer (continuous batching), with the ``EngineOptions`` of its weight formats per
step, prefix cache and prompt-lookup speculation; ``detect_signature`` says which input is what.
"""

from ortpilot.decode.batched import BatchedLoop
from ortpilot.decode.formats import FormatPlan
from ortpilot.decode.generate import GenerationResult, Generator, generate
from ortpilot.decode.loops import LOOPS, Traffic
from ortpilot.decode.options import LOOP_CHOICES, EngineOptions, GenerateOptions
from ortpilot.decode.sampling import Sampler, SamplingConfig
from ortpilot.decode.scheduler import Scheduler, Stream, StreamMetrics
from ortpilot.decode.signature import CacheEntry, DecoderSignature, detect_signature

__all__ = [
    "LOOPS",
    "LOOP_CHOICES",
    "BatchedLoop",
    "CacheEntry",
    "DecoderSignature",
    "EngineOptions",
    "FormatPlan",
    "GenerateOptions",
    "GenerationResult",
    "Generator",
    "Sampler",
    "SamplingConfig",
    "Scheduler",
    "Stream",
    "StreamMetrics",
    "Traffic",
    "detect_signature",
    "generate",
]
