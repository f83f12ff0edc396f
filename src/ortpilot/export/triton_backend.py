"""What Triton's ONNX Runtime backend reads from a model's ``config.pbtxt``, and what it makes of it.

Read from the backend's source, not guessed: triton-inference-server/onnxruntime_backend,
``src/onnxruntime.cc`` at commit 00fd3e8 (the r26.06 line). ``ModelState::ModelState`` reads the
graph level, execution mode, thread counts, arena, memory pattern and
``session.use_device_allocator_for_initializers``; ``ModelState::LoadModel`` appends the
execution accelerators (TensorRT and CUDA on GPU instances, OpenVINO from the CPU list) and reads
the deprecated model-level CUDA keys; ``ModelInstanceState`` passes
``memory.enable_memory_arena_shrinkage`` as a run option. protobuf checks a config's structure
but not these keys: the backend silently ignores a model-level key it does not know, so a typo
would quietly leave ORT's default in place. That is why every key written is checked here.
"""

from __future__ import annotations

from ortpilot.eps import CPU_EP

BACKEND = "onnxruntime"
BACKEND_SOURCE = "triton-inference-server/onnxruntime_backend src/onnxruntime.cc @ 00fd3e8 (r26.06)"

# Model-level ``parameters`` the backend reads -> how it parses the string value.
MODEL_PARAMETERS: dict[str, str] = {
    "execution_mode": "int",  # 0 sequential, 1 parallel (anything else: load error)
    "intra_op_thread_count": "int",  # set only when > 0; 0 leaves ORT's default (one per core)
    "inter_op_thread_count": "int",
    "enable_mem_arena": "bool",
    "enable_mem_pattern": "bool",
    "session.use_device_allocator_for_initializers": "string",  # passed on as a session config entry
    "memory.enable_memory_arena_shrinkage": "string",  # passed on as a run config entry
    # Deprecated CUDA keys. On GPU instances, whenever the model has any ``parameters``, these four
    # are set from here (or to the backend's defaults) *after* the cuda accelerator's parameters,
    # so they override the accelerator's values: they must be written here.
    "cudnn_conv_algo_search": "int",  # 0 EXHAUSTIVE, 1 HEURISTIC, 2 DEFAULT
    "gpu_mem_limit": "uint",
    "arena_extend_strategy": "int",  # 0 kNextPowerOfTwo, 1 kSameAsRequested
    "do_copy_in_default_stream": "bool",
}
# What the backend sets for the deprecated CUDA keys when the model does not (ORT option values).
CUDA_MODEL_DEFAULTS = {
    "cudnn_conv_algo_search": "EXHAUSTIVE",
    "gpu_mem_limit": str(2**64 - 1),
    "arena_extend_strategy": "kNextPowerOfTwo",
    "do_copy_in_default_stream": "1",
}
# ORT's CUDA option values <-> the integer codes the deprecated keys take.
CUDA_CODES = {
    "cudnn_conv_algo_search": ("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
    "arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
}

# ``optimization.graph.level`` is not ORT's numbering: -1 basic, 1 extended, 2 disabled, any
# other value (or no ``graph``) all. ortpilot level -> Triton level (None: leave ``graph`` out).
GRAPH_LEVELS: dict[str, int | None] = {"disable": 2, "basic": -1, "extended": 1, "all": None, "layout": None}
ORT_LEVEL_OF: dict[int, str] = {-1: "basic", 1: "extended", 2: "disable"}

GPU_ACCELERATORS = ("tensorrt", "cuda")  # gpu_execution_accelerator names, read on KIND_GPU instances
CPU_ACCELERATORS = ("openvino",)  # cpu_execution_accelerator names; OpenVINO always gets device_type CPU

# The TensorRT accelerator's parameters: Triton key -> (ORT TensorRT EP option, value kind). Any
# other key is a load error ("unknown parameter ... for TensorRT Execution Accelerator").
TENSORRT_PARAMETERS: dict[str, tuple[str, str]] = {
    "max_workspace_size_bytes": ("trt_max_workspace_size", "uint"),
    "int8_calibration_table_name": ("trt_int8_calibration_table_name", "string"),
    "int8_use_native_calibration_table": ("trt_int8_use_native_calibration_table", "bool"),
    **{
        key: (key, kind)
        for key, kind in {
            "trt_max_partition_iterations": "int",
            "trt_min_subgraph_size": "int",
            "trt_dla_enable": "bool",
            "trt_dla_core": "int",
            "trt_engine_cache_enable": "bool",
            "trt_engine_cache_path": "string",
            "trt_engine_cache_prefix": "string",
            "trt_dump_subgraphs": "bool",
            "trt_force_sequential_engine_build": "bool",
            "trt_context_memory_sharing_enable": "bool",
            "trt_layer_norm_fp32_fallback": "bool",
            "trt_timing_cache_enable": "bool",
            "trt_timing_cache_path": "string",
            "trt_force_timing_cache": "bool",
            "trt_detailed_build_log": "bool",
            "trt_build_heuristics_enable": "bool",
            "trt_sparsity_enable": "bool",
            "trt_builder_optimization_level": "int",
            "trt_auxiliary_streams": "int",
            "trt_tactic_sources": "string",
            "trt_extra_plugin_lib_paths": "string",
            "trt_profile_min_shapes": "string",
            "trt_profile_max_shapes": "string",
            "trt_profile_opt_shapes": "string",
            "trt_cuda_graph_enable": "bool",
            "trt_dump_ep_context_model": "bool",
            "trt_ep_context_file_path": "string",
            "trt_ep_context_embed_mode": "int",
        }.items()
    },
}
# ``precision_mode`` value -> the ORT TensorRT option it turns on (FP32: none).
PRECISION_MODES: dict[str, str | None] = {
    "FP32": None,
    "FP16": "trt_fp16_enable",
    "BF16": "trt_bf16_enable",
    "INT8": "trt_int8_enable",
}

# ORT provider -> where the backend can put it. Others (CoreML, WebGPU, QNN, DirectML ...) it cannot run.
CUDA, TENSORRT, OPENVINO = (
    "CUDAExecutionProvider",
    "TensorrtExecutionProvider",
    "OpenVINOExecutionProvider",
)
SUPPORTED_PROVIDERS = (CPU_EP, CUDA, TENSORRT, OPENVINO)
GPU_PROVIDERS = (TENSORRT, CUDA)

# ONNX element type -> Triton data type (the backend's OnnxDataTypeToModelConfigDataType).

# The backend's default ``default-max-batch-size`` (what its auto-complete would fill in).
DEFAULT_MAX_BATCH = 4


def parses_as(kind: str, value: str) -> bool:
    """Whether the backend's parser for ``kind`` accepts ``value`` (ParseBoolValue: true/on/1, false/off/0)."""
    if kind == "bool":
        return value.lower() in ("true", "on", "1", "false", "off", "0")
    if kind in ("int", "uint"):
        try:
            number = int(value)
        except ValueError:
            return False
        return number >= 0 or kind == "int"
    return bool(value)


def parse_bool(value: str) -> bool:
    return value.lower() in ("true", "on", "1")
