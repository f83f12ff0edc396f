"""Generation loops for ONNX decoders: plain numpy, IOBinding, and a shared KV buffer for GQA.

``generate(model, prompt_ids, ...)`` picks the fastest loop the model supports; ``Generator``
keeps one session for repeated calls; ``detect_signature`` says which input is what.
"""

from ortpilot.decode.generate import LOOP_CHOICES, GenerationResult, Generator, generate
from ortpilot.decode.loops import LOOPS, Traffic
from ortpilot.decode.sampling import Sampler, SamplingConfig
from ortpilot.decode.signature import CacheEntry, DecoderSignature, detect_signature

__all__ = ["LOOPS", "LOOP_CHOICES", "CacheEntry", "DecoderSignature", "GenerationResult", "Generator",
           "Sampler", "SamplingConfig", "Traffic", "detect_signature", "generate"]
