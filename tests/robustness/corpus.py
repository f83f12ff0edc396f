"""The bad-input corpus: hostile files and arguments, generated in code, with the answer each must get.

Every case builds its inputs in a fresh folder (no committed binaries), names the command it
runs (a CLI command, or ``load_profile`` / ``load`` for the Python API) and says what a user
must see: the exit code docs/concepts/failure-modes.md prescribes (2 bad input, 1 verification failed, 0 for NaN
feeds, which only warn) and the key words of the one-paragraph message. ``test_corpus.py``
runs them and also checks that nothing is left behind in the output folder, the cwd or the cache.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR = 10
OPSET = 18
CLI = [sys.executable, "-m", "ortpilot.cli.main"]


@dataclass(frozen=True)
class Workspace:
    """Where a case lives: inputs it builds, the output folder it must leave clean, the cache, the cwd."""

    inputs: Path
    out: Path
    cache: Path
    cwd: Path
    tmp: Path  # $TMPDIR of the command: must be empty afterwards too

    @classmethod
    def create(cls, root: Path) -> Workspace:
        ws = cls(root / "inputs", root / "out", root / "cache", root / "cwd", root / "tmp")
        for folder in (ws.inputs, ws.out, ws.cache, ws.cwd, ws.tmp):
            folder.mkdir(parents=True, exist_ok=True)
        return ws

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ, ORTPILOT_CACHE_DIR=str(self.cache), TMPDIR=str(self.tmp), COLUMNS="200", NO_COLOR="1")
        env.update(extra or {})
        return env


@dataclass(frozen=True)
class Case:
    """One hostile input. ``build`` writes files and returns the arguments after the command."""

    id: str
    command: str
    build: Callable[[Workspace], list[str]]
    exit_code: int
    words: tuple[str, ...]
    outputs: tuple[str, ...] = ()  # files allowed in ws.out afterwards (relative paths)
    env: dict[str, str] = field(default_factory=dict)
    bug: str = ""  # a known bug elsewhere: the case is an xfail(strict=True) until it is fixed
    timeout_s: float = 120.0


def run_cli(
    ws: Workspace, command: str, args: Sequence[str], env: dict[str, str] | None = None, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``python -m ortpilot.cli.main COMMAND ARGS`` with the case's cache and cwd."""
    return subprocess.run(
        [*CLI, command, *args],
        cwd=ws.cwd,
        env=ws.env(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


# --- model builders --------------------------------------------------------------------------------------------


def tiny_model(
    *,
    input_name: str = "x",
    output_name: str = "y",
    node_prefix: str = "",
    dims=("batch", 4),
    opset: int = OPSET,
    ir_version: int = IR,
) -> onnx.ModelProto:
    """x[batch, 4] @ W[4, 3] + b -> y: the smallest model that exercises every command."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), f"{node_prefix}W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), f"{node_prefix}b")
    nodes = [
        helper.make_node("MatMul", [input_name, w.name], [f"{node_prefix}mm"], name=f"{node_prefix}MatMul"),
        helper.make_node("Add", [f"{node_prefix}mm", b.name], [output_name], name=f"{node_prefix}Add"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, list(dims))],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [dims[0], 3])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def tiny_file(ws: Workspace, name: str = "model.onnx", **kw) -> Path:
    return save(tiny_model(**kw), ws.inputs / name)


def dangling_edge() -> onnx.ModelProto:
    model = tiny_model()
    model.graph.node[1].input[0] = "nobody_makes_this"
    return model


def cycle() -> onnx.ModelProto:
    """Add consumes its own output through a Relu: a -> Relu -> c -> Add -> a."""
    model = tiny_model()
    graph = model.graph
    graph.node[1].input[1] = "loop_c"
    graph.node.append(helper.make_node("Relu", ["y"], ["loop_c"], name="Back"))
    return model


def unknown_domain() -> onnx.ModelProto:
    model = tiny_model()
    model.graph.node[1].domain = "com.example.nowhere"
    model.graph.node[1].op_type = "FancyAdd"
    model.opset_import.append(helper.make_opsetid("com.example.nowhere", 1))
    return model


def huge_external(ws: Workspace) -> Path:
    """A 2 GB-declared initializer whose external data file holds 16 bytes."""
    model = tiny_model()
    big = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[512, 1024, 1024])
    big.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "weights.bin"), ("offset", "0"), ("length", str(2**31))):
        big.external_data.add(key=key, value=value)
    model.graph.initializer.append(big)
    model.graph.node.append(helper.make_node("ReduceSum", ["big"], ["big_sum"], keepdims=0, name="UseBig"))
    model.graph.output.append(helper.make_tensor_value_info("big_sum", TensorProto.FLOAT, []))
    (ws.inputs / "weights.bin").parent.mkdir(parents=True, exist_ok=True)
    (ws.inputs / "weights.bin").write_bytes(b"\0" * 16)
    return save(model, ws.inputs / "huge.onnx")


def missing_external(ws: Workspace) -> Path:
    model = tiny_model()
    onnx.external_data_helper.convert_model_to_external_data(model, location="gone.bin", size_threshold=0)
    return save(model, ws.inputs / "external.onnx")


def negative_dims() -> onnx.ModelProto:
    """An initializer declaring dims [-1, 3]: onnx loads it, ORT refuses it while building the session."""
    model = tiny_model()
    bad = TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[-1, 3], raw_data=b"\0" * 12)
    model.graph.initializer[1].CopyFrom(bad)
    return model


def escaping_external(ws: Workspace) -> Path:
    """External data whose location climbs out of the model's folder (ORT refuses: path traversal)."""
    model = tiny_model()
    secret = ws.inputs / "secret.bin"
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_bytes(b"\0" * 64)
    tensor = model.graph.initializer[1]
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "12")):
        tensor.external_data.add(key=key, value=value)
    return save(model, ws.inputs / "models" / "escape.onnx")


def one_node(node: onnx.NodeProto, elem_type: int, dims: list) -> onnx.ModelProto:
    """A model of one node reading input ``x`` (``elem_type``, ``dims``) into output ``y`` of any shape."""
    graph = helper.make_graph(
        [node],
        node.op_type.lower(),
        [helper.make_tensor_value_info("x", elem_type, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR
    return model


def einsum_hang() -> onnx.ModelProto:
    """Einsum '......->': onnx 1.23's shape inference, and so ORT 1.32's session creation, loop forever."""
    return one_node(helper.make_node("Einsum", ["x"], ["y"], equation="......->"), TensorProto.FLOAT, [2, 2])


# --- file builders ---------------------------------------------------------------------------------------------


def write_bytes(ws: Workspace, name: str, data: bytes) -> Path:
    path = ws.inputs / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def empty_file(ws: Workspace) -> Path:
    return write_bytes(ws, "empty.onnx", b"")


def random_file(ws: Workspace) -> Path:
    return write_bytes(ws, "random.onnx", random.Random(7).randbytes(4096))


def truncated_file(ws: Workspace) -> Path:
    data = tiny_model().SerializeToString()
    return write_bytes(ws, "truncated.onnx", data[: len(data) * 2 // 3])


def array_file(ws: Workspace, name: str, value: np.ndarray) -> str:
    path = ws.inputs / f"{name}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, value)
    return str(path)


def odd_names(ws: Workspace) -> Path:
    return save(
        tiny_model(input_name="in put/ü:0", output_name="out·put/ÿ 1", node_prefix="blk 0/über:"),
        ws.inputs / "odd names ü" / "m odel.onnx",
    )


# --- profile builders (a real tune profile, then damaged) --------------------------------------------------------


def tuned_profile(ws: Workspace) -> Path:
    """A profile as ``tune`` writes it (``write_profile``) for the tiny model, before any damage."""
    from ortpilot.artifacts.profile import write_profile

    model = tiny_file(ws, "tuned.onnx")
    return write_profile(
        ws.inputs / "profile.json",
        model_file=model,
        providers=[{"name": "CPUExecutionProvider", "options": {}}],
        settings={"level": "all", "intra_op_threads": 1},
    )


def profile_other_model(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    save(tiny_model(node_prefix="changed_"), ws.inputs / "tuned.onnx")  # same name, other bytes
    return [str(profile)]


def profile_invalid_json(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    text = profile.read_text()
    profile.write_text(text[: len(text) // 2])  # an editor crash, a full disk
    return [str(profile)]


def profile_wrong_fields(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    doc = json.loads(profile.read_text())
    del doc["providers"]
    doc["model"] = "tuned.onnx"  # a string where an object belongs
    profile.write_text(json.dumps(doc))
    return [str(profile)]


def profile_bad_setting(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    doc = json.loads(profile.read_text())
    doc["session_settings"]["turbo_mode"] = True
    profile.write_text(json.dumps(doc))
    return [str(profile)]


def profile_not_dict(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    profile.write_text("[1, 2, 3]\n")
    return [str(profile)]


def profile_bad_level(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    doc = json.loads(profile.read_text())
    doc["session_settings"]["level"] = "ludicrous"
    profile.write_text(json.dumps(doc))
    return [str(profile)]


# --- cache builders --------------------------------------------------------------------------------------------


def truncated_cache_entry(ws: Workspace) -> list[str]:
    """Optimize once (fills the cache), truncate the cached model, and ask for the same build again."""
    model = tiny_file(ws)
    first = run_cli(ws, "optimize", [str(model), "-o", str(ws.inputs / "first.onnx")])
    assert first.returncode == 0, first.stderr
    cached = sorted(ws.cache.glob("models/*/model.onnx"))
    assert cached, "optimize did not fill the cache"
    for path in cached:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    return [str(model), "-o", str(ws.out / "opt.onnx")]


# --- the corpus ------------------------------------------------------------------------------------------------


def _model(builder: Callable[[Workspace], Path], *extra: str, out: str = "") -> Callable[[Workspace], list[str]]:
    """args = MODEL (built) [+ -o OUT/out] + extra."""

    def build(ws: Workspace) -> list[str]:
        args = [str(builder(ws))]
        if out:
            args += ["-o", str(ws.out / out)]
        return args + [a.replace("{in}", str(ws.inputs)) for a in extra]

    return build


def _proto(make: Callable[[], onnx.ModelProto], name: str) -> Callable[[Workspace], Path]:
    return lambda ws: save(make(), ws.inputs / name)


def _feeds(value: Callable[[], np.ndarray], *extra: str) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        return [str(tiny_file(ws)), "--input", f"x={array_file(ws, 'x', value())}", *extra]

    return build


def _nan() -> np.ndarray:
    a = np.ones((1, 4), np.float32)
    a[0, 1] = np.nan
    return a


def _inf() -> np.ndarray:
    a = np.ones((1, 4), np.float32)
    a[0, 2] = np.inf
    return a


NOT_MODEL = ("not a readable onnx model",)
EMPTY = ("empty",)
CANNOT_LOAD = ("could not load",)
HUGE_EXTERNAL = ("declares more external data", "weights.bin")

ISOLATE_CRASH_ARGS: list[tuple[str, Callable[[Workspace], list[str]]]] = [
    ("inspect", _model(tiny_file, "--isolate")),
    ("optimize", _model(tiny_file, "--isolate", out="opt.onnx")),
    ("quantize", _model(tiny_file, "--mode", "dynamic", "--isolate", out="q.onnx")),
    ("compare", lambda ws: [str(tiny_file(ws)), str(tiny_file(ws, "b.onnx", node_prefix="b_")), "--isolate"]),
    (
        "bench",
        lambda ws: [
            str(tiny_file(ws)),
            "--runs",
            "3",
            "--warmup",
            "1",
            "--no-roofline",
            "--report",
            str(ws.out / "r.html"),
            "--isolate",
        ],
    ),
    ("generate", _model(tiny_file, "--prompt-ids", "1,2", "--isolate")),
]

CASES: list[Case] = [
    # load (the Python API; isolate=True exercises the child process too)
    Case("load-random-bytes-isolated", "load", lambda ws: [str(random_file(ws))], 2, NOT_MODEL),
    Case("load-cycle-isolated", "load", lambda ws: [str(save(cycle(), ws.inputs / "cycle.onnx"))], 2, CANNOT_LOAD),
    Case("load-huge-external-isolated", "load", lambda ws: [str(huge_external(ws))], 2, HUGE_EXTERNAL),
    # run
    Case("run-empty-file", "run", _model(empty_file), 2, EMPTY),
    Case("run-random-bytes", "run", _model(random_file), 2, NOT_MODEL),
    Case("run-missing-file", "run", lambda ws: [str(ws.inputs / "nope.onnx")], 2, ("does not exist",)),
    Case("run-directory", "run", lambda ws: [str(ws.inputs)], 2, ("directory",)),
    Case("run-dangling-edge", "run", _model(_proto(dangling_edge, "dangling.onnx")), 2, ("nobody_makes_this",)),
    Case("run-cycle", "run", _model(_proto(cycle, "cycle.onnx")), 2, CANNOT_LOAD),
    Case("run-unknown-domain", "run", _model(_proto(unknown_domain, "domain.onnx")), 2, ("com.example.nowhere",)),
    Case("run-future-opset", "run", _model(_proto(lambda: tiny_model(opset=99), "future.onnx")), 2, ("opset",)),
    Case(
        "run-future-ir-version",
        "run",
        _model(_proto(lambda: tiny_model(ir_version=99), "ir99.onnx")),
        2,
        ("ir version",),
    ),
    Case("run-missing-external-data", "run", _model(missing_external), 2, ("gone.bin", "missing")),
    Case("run-huge-declared-external", "run", _model(huge_external), 2, HUGE_EXTERNAL),
    Case("run-negative-initializer-dims", "run", _model(_proto(negative_dims, "negdims.onnx")), 2, CANNOT_LOAD),
    Case(
        "run-strict-policy-bad-model-is-bad-input",
        "run",
        _model(_proto(negative_dims, "negdims.onnx"), "--policy", "strict"),
        2,
        CANNOT_LOAD,
    ),
    Case(
        "run-external-path-escapes-folder",
        "run",
        _model(escaping_external),
        2,
        ("outside its own folder", "../secret.bin"),
    ),
    Case("run-zero-size-dim", "run", _model(tiny_file, "--shape", "x=0x4"), 0, ("outputs",)),
    Case("run-odd-names", "run", _model(odd_names), 0, ("out·put/ÿ 1",)),
    Case("run-wrong-dtype", "run", _feeds(lambda: np.ones((1, 4), np.int64)), 2, ("x", "float32", "int64")),
    Case("run-wrong-rank", "run", _feeds(lambda: np.ones((4,), np.float32)), 2, ("rank",)),
    Case("run-wrong-shape", "run", _feeds(lambda: np.ones((1, 5), np.float32)), 2, ("dim 1", "4")),
    Case(
        "run-unknown-input-name",
        "run",
        lambda ws: [str(tiny_file(ws)), "--input", f"nope={array_file(ws, 'nope', np.ones((1, 4), np.float32))}"],
        2,
        ("unknown input", "nope"),
    ),
    Case("run-nan-input-warns", "run", _feeds(_nan), 0, ("warning", "nan")),
    Case("run-inf-input-warns", "run", _feeds(_inf), 0, ("warning", "inf")),
    Case(
        "run-bad-npy",
        "run",
        lambda ws: [str(tiny_file(ws)), "--input", f"x={write_bytes(ws, 'x.npy', b'not numpy')}"],
        2,
        ("npy",),
    ),
    Case(
        "run-einsum-hang-is-refused",
        "run",
        _model(_proto(einsum_hang, "hang.onnx")),
        2,
        ("einsum", "......->"),
        timeout_s=60,
    ),
    Case(
        "run-einsum-hang-isolated-is-refused",
        "run",
        _model(_proto(einsum_hang, "hang.onnx"), "--isolate"),
        2,
        ("einsum", "......->"),
        timeout_s=60,
    ),
    Case(
        "run-isolate-deliberate-sigsegv-in-child",
        "run",
        _model(tiny_file, "--isolate"),
        1,
        ("crashed", "sigsegv"),
        env={"ORTPILOT_TEST_CRASH_IN_CHILD": "SIGSEGV"},
    ),
    # inspect
    Case("inspect-empty-file", "inspect", _model(empty_file), 2, EMPTY),
    Case("inspect-truncated", "inspect", _model(truncated_file), 2, NOT_MODEL),
    Case("inspect-missing-external-data", "inspect", _model(missing_external), 2, ("gone.bin",)),
    Case(
        "inspect-dangling-edge",
        "inspect",
        _model(_proto(dangling_edge, "dangling.onnx")),
        2,
        ("nobody_makes_this", "dangling edge", "'add'"),
    ),
    Case(
        "inspect-dangling-edge-no-check",
        "inspect",
        _model(_proto(dangling_edge, "dangling.onnx"), "--no-check"),
        2,
        ("nobody_makes_this",),
    ),
    Case("inspect-cycle", "inspect", _model(_proto(cycle, "cycle.onnx")), 2, ("cycle", "'back' (relu)")),
    Case(
        "inspect-negative-initializer-dims",
        "inspect",
        _model(_proto(negative_dims, "negdims.onnx")),
        2,
        ("onnx.checker", "negative dimension"),
    ),
    Case(
        "inspect-einsum-hang-is-refused",
        "inspect",
        _model(_proto(einsum_hang, "hang.onnx")),
        2,
        ("einsum", "......->"),
        timeout_s=60,
    ),
    Case(
        "inspect-einsum-hang-no-check",
        "inspect",
        _model(_proto(einsum_hang, "hang.onnx"), "--no-check", "--json"),
        2,
        ("einsum", "......->"),
        timeout_s=60,
    ),
    Case("inspect-huge-declared-external", "inspect", _model(huge_external), 2, HUGE_EXTERNAL),
    Case("inspect-odd-names", "inspect", _model(odd_names), 0, ("in put/ü:0",)),
    # optimize
    Case("optimize-truncated", "optimize", _model(truncated_file, out="opt.onnx"), 2, NOT_MODEL),
    Case("optimize-cycle", "optimize", _model(_proto(cycle, "cycle.onnx"), out="opt.onnx"), 2, CANNOT_LOAD),
    Case("optimize-huge-declared-external", "optimize", _model(huge_external, out="opt.onnx"), 2, HUGE_EXTERNAL),
    Case(
        "optimize-output-is-directory",
        "optimize",
        lambda ws: [str(tiny_file(ws)), "-o", str(ws.inputs)],
        2,
        ("directory",),
    ),
    Case(
        "optimize-output-parent-is-a-file",
        "optimize",
        lambda ws: [str(tiny_file(ws)), "-o", str(tiny_file(ws, "taken.onnx") / "o.onnx")],
        2,
        ("taken.onnx", "not a folder"),
    ),
    Case(
        "optimize-odd-output-path",
        "optimize",
        _model(odd_names, out="sub dir/ü opt.onnx"),
        0,
        ("wrote",),
        outputs=("sub dir/ü opt.onnx",),
    ),
    Case(
        "optimize-truncated-cache-entry-rebuilt",
        "optimize",
        truncated_cache_entry,
        0,
        ("corrupt",),
        outputs=("opt.onnx",),
    ),
    # quantize
    Case("quantize-random-bytes", "quantize", _model(random_file, "--mode", "dynamic", out="q.onnx"), 2, NOT_MODEL),
    Case(
        "quantize-future-opset",
        "quantize",
        _model(_proto(lambda: tiny_model(opset=99), "future.onnx"), "--mode", "dynamic", out="q.onnx"),
        2,
        ("opset",),
    ),
    Case(
        "quantize-missing-calibration",
        "quantize",
        _model(tiny_file, "--mode", "static", "--calibration", "{in}/no-such-folder", out="q.onnx"),
        2,
        ("calibration", "no-such-folder"),
    ),
    Case(
        "quantize-output-is-directory",
        "quantize",
        lambda ws: [str(tiny_file(ws)), "--mode", "dynamic", "-o", str(ws.inputs)],
        2,
        ("directory",),
    ),
    Case(
        "quantize-output-parent-is-a-file",
        "quantize",
        lambda ws: [str(tiny_file(ws)), "--mode", "dynamic", "-o", str(tiny_file(ws, "taken.onnx") / "sub" / "q.onnx")],
        2,
        ("taken.onnx", "not a folder"),
    ),
    # compare
    Case(
        "compare-missing-model-b",
        "compare",
        lambda ws: [str(tiny_file(ws)), str(ws.inputs / "absent.onnx")],
        2,
        ("does not exist",),
    ),
    Case(
        "compare-wrong-dtype",
        "compare",
        lambda ws: [
            str(tiny_file(ws)),
            "-p",
            "cpu",
            "-p",
            "cpu",
            "--input",
            f"x={array_file(ws, 'x', np.ones((1, 4), np.float64))}",
        ],
        2,
        ("float32", "float64"),
    ),
    Case(
        "compare-different-inputs",
        "compare",
        lambda ws: [str(tiny_file(ws)), str(tiny_file(ws, "other.onnx", input_name="z"))],
        2,
        ("input",),
    ),
    # bench
    Case("bench-empty-file", "bench", _model(empty_file, "--runs", "3"), 2, EMPTY),
    Case("bench-wrong-shape", "bench", _feeds(lambda: np.ones((1, 7), np.float32), "--runs", "3"), 2, ("dim 1",)),
    Case(
        "bench-zero-size-dim",
        "bench",
        _model(tiny_file, "--shape", "x=0x4", "--runs", "3", "--warmup", "1", "--no-roofline"),
        0,
        ("p50",),
    ),
    Case(
        "bench-report-is-directory",
        "bench",
        _model(tiny_file, "--runs", "3", "--warmup", "1", "--no-roofline", "--report", "{in}"),
        2,
        ("--report", "directory"),
    ),
    # tune
    Case("tune-random-bytes", "tune", _model(random_file, "--budget", "30", out="tune"), 2, NOT_MODEL),
    Case("tune-huge-declared-external", "tune", _model(huge_external, "--budget", "30", out="tune"), 2, HUGE_EXTERNAL),
    Case(
        "tune-bad-shape-arg",
        "tune",
        _model(tiny_file, "--shape", "x=banana", "--budget", "30", out="tune"),
        2,
        ("--shape", "banana"),
    ),
    Case(
        "tune-bad-calibration",
        "tune",
        _model(tiny_file, "--calibration", "{in}/calib.npz", "--budget", "30", out="tune"),
        2,
        ("calibration",),
    ),
    Case(
        "tune-out-is-a-file",
        "tune",
        lambda ws: [str(tiny_file(ws)), "-o", str(tiny_file(ws, "taken.onnx")), "--budget", "30"],
        2,
        ("taken.onnx", "not a folder"),
    ),
    # generate
    Case("generate-not-a-decoder", "generate", _model(tiny_file, "--prompt-ids", "1,2,3"), 2, ("input_ids",)),
    Case(
        "generate-bad-prompt-ids",
        "generate",
        lambda ws: [str(save(tiny_model(), ws.inputs / "m.onnx")), "--prompt-ids", "1,two,3"],
        2,
        ("prompt",),
    ),
    Case("generate-truncated", "generate", _model(truncated_file, "--prompt-ids", "1,2"), 2, NOT_MODEL),
    # --isolate on every other command that loads models: a deliberate SIGSEGV in the isolated child
    *[
        Case(
            f"{command}-isolate-deliberate-sigsegv-in-child",
            command,
            build,
            1,
            ("crashed", "signal 11: sigsegv"),
            env={"ORTPILOT_TEST_CRASH_IN_CHILD": "SIGSEGV"},
        )
        for command, build in ISOLATE_CRASH_ARGS
    ],
    # load_profile (Python API)
    Case("load-profile-other-model-hash", "load_profile", profile_other_model, 1, ("changed since it was tuned",)),
    Case("load-profile-invalid-json", "load_profile", profile_invalid_json, 2, ("not valid json",)),
    Case("load-profile-wrong-fields", "load_profile", profile_wrong_fields, 2, ("providers",)),
    Case("load-profile-unknown-setting", "load_profile", profile_bad_setting, 2, ("turbo_mode",)),
    Case("load-profile-not-an-object", "load_profile", profile_not_dict, 2, ("not an ortpilot profile",)),
    Case("load-profile-bad-level", "load_profile", profile_bad_level, 2, ("ludicrous",)),
    Case("load-profile-missing", "load_profile", lambda ws: [str(ws.inputs / "profile.json")], 2, ("does not exist",)),
]


# --- files read back, resources, the OS: builders ----------------------------------------------------------------


def _edited_profile(change: Callable[[dict], None]) -> Callable[[Workspace], list[str]]:
    """A profile as tune writes it, then one field changed by ``change(doc)``."""

    def build(ws: Workspace) -> list[str]:
        profile = tuned_profile(ws)
        doc = json.loads(profile.read_text())
        change(doc)
        profile.write_text(json.dumps(doc))
        return [str(profile)]

    return build


def _profile_text(text: Callable[[Workspace], str | bytes]) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        profile = tuned_profile(ws)
        data = text(ws)
        profile.write_bytes(data if isinstance(data, bytes) else data.encode())
        return [str(profile)]

    return build


def _valid_profile_json(ws: Workspace) -> str:
    return tuned_profile(ws).read_text()


def _model_elsewhere(kind: str) -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["model"]["file"] = {"absolute": "/etc/hostname", "dotdot": "../../etc/hostname"}[kind]

    return change


def profile_model_linked_out(ws: Workspace) -> list[str]:
    (ws.inputs / "linked.onnx").symlink_to(save(tiny_model(), ws.tmp.parent / "elsewhere" / "m.onnx"))
    return _edited_profile(_set("model.file", "linked.onnx"))(ws)


def profile_model_deleted(ws: Workspace) -> list[str]:
    profile = tuned_profile(ws)
    (ws.inputs / "tuned.onnx").unlink()
    return [str(profile)]


def _set(path: str, value) -> Callable[[dict], None]:
    """``doc[a][b]... = value`` for a dotted path (list indices as digits)."""

    def change(doc: dict) -> None:
        keys = path.split(".")
        target = doc
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[keys[-1]] = value

    return change


def _journal(*lines: str | dict, link: bool = False) -> Callable[[Workspace], list[str]]:
    """A tune --resume on the tiny model whose OUTDIR journal holds ``lines`` (dicts are dumped as JSON)."""

    def build(ws: Workspace) -> list[str]:
        model = tiny_file(ws)
        text = "".join((json.dumps(line) if isinstance(line, dict) else line) + "\n" for line in lines)
        if link:
            (ws.inputs / "elsewhere.jsonl").write_text(text)
            (ws.out / "journal.jsonl").symlink_to(ws.inputs / "elsewhere.jsonl")
        else:
            (ws.out / "journal.jsonl").write_text(text)
        return [str(model), "-o", str(ws.out), "--resume", "--budget", "30"]

    return build


START = {
    "kind": "start",
    "model_sha256": "0" * 64,
    "shapes": {"x": [1, 4]},
    "objective": "p50",
    "max_error": None,
    "metric": None,
    "quantize": True,
    "providers": [],
    "ort": "1",
    "budget_s": 30,
    "model": "m.onnx",
}
PREPARED = {"kind": "prepared", "id": "abc", "status": "failed", "error": "x"}


def wide_model() -> onnx.ModelProto:
    """x[batch, 1024] -> ReduceSum: a batch of 10^9 declares 4 TB of input."""
    return one_node(helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0), TensorProto.FLOAT, ["batch", 1024])


def alloc_model() -> onnx.ModelProto:
    """ConstantOfShape(x): x = [10^6, 10^6] asks ORT for a 4 TB output while running."""
    return one_node(helper.make_node("ConstantOfShape", ["x"], ["y"]), TensorProto.INT64, [2])


def _alloc(*extra: str) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        model = save(alloc_model(), ws.inputs / "alloc.onnx")
        return [str(model), "--input", f"x={array_file(ws, 'x', np.array([10**6, 10**6], np.int64))}", *extra]

    return build


def _external(
    location: str, *, length: int | None = None, where: str = "initializer", link_to: str | None = None
) -> Callable[[Workspace], Path]:
    """The tiny model with its bias ``b`` (3 floats, 12 bytes) in external data at ``location``.

    ``where``: ``initializer`` (the graph's), ``constant`` (a Constant node's tensor attribute), or
    ``subgraph`` (an initializer inside an If branch). ``link_to`` plants a link at ``location``.
    """

    def build(ws: Workspace) -> Path:
        model = tiny_model()
        (ws.inputs / "models").mkdir(parents=True, exist_ok=True)
        (ws.inputs / "outside.bin").write_bytes(b"\0" * 64)
        if link_to is not None:
            (ws.inputs / "models" / location).symlink_to(link_to)
        elif not location.startswith(("/", "..")):
            (ws.inputs / "models" / location).write_bytes(b"\0" * 64)
        tensor = TensorProto(name="b", data_type=TensorProto.FLOAT, dims=[3])
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", location), ("offset", "0"), ("length", str(12 if length is None else length))):
            tensor.external_data.add(key=key, value=value)
        if where == "initializer":
            model.graph.initializer[1].CopyFrom(tensor)
        elif where == "constant":
            del model.graph.initializer[1]
            model.graph.node.insert(0, helper.make_node("Constant", [], ["b"], value=tensor, name="BiasConst"))
        else:  # an If whose branch reads the external tensor: the bias comes out of a subgraph
            del model.graph.initializer[1]
            branch = helper.make_graph(
                [helper.make_node("Identity", ["b_inner"], ["b_out"])],
                "branch",
                [],
                [helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [3])],
            )
            tensor.name = "b_inner"
            branch.initializer.append(tensor)
            cond = numpy_helper.from_array(np.array(True), "cond")
            model.graph.initializer.append(cond)
            model.graph.node.insert(
                0, helper.make_node("If", ["cond"], ["b"], then_branch=branch, else_branch=branch, name="PickBias")
            )
        return save(model, ws.inputs / "models" / "ext.onnx")

    return build


def _calibration_file(
    value: Callable[[], dict[str, np.ndarray]] | bytes, name: str = "calib.npz"
) -> Callable[[Workspace], str]:
    def make(ws: Workspace) -> str:
        path = ws.inputs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(value, bytes):
            path.write_bytes(value)
        else:
            np.savez(path, **value())
        return str(path)

    return make


WRONG_DTYPE = _calibration_file(lambda: {"x": np.ones((4, 1, 4), np.float64)})
UNKNOWN_NAME = _calibration_file(lambda: {"nope": np.ones((4, 1, 4), np.float32)})
CORRUPT_NPZ = _calibration_file(b"PK\x03\x04 not really a zip", "corrupt.npz")
CALIB_DTYPE_WORDS = ("calibration data", "sample 0", "'x' must be float32, got float64")


def _calibrated(command: str, make: Callable[[Workspace], str]) -> Callable[[Workspace], list[str]]:
    """The same calibration file for quantize, tune and compare: one loader, one message."""

    def build(ws: Workspace) -> list[str]:
        model = str(tiny_file(ws))
        calib = make(ws)
        if command == "quantize":
            return [model, "--mode", "static", "--calibration", calib, "-o", str(ws.out / "q.onnx")]
        if command == "tune":
            return [model, "--calibration", calib, "-o", str(ws.out / "tune"), "--budget", "30"]
        return [model, "--calibration", calib]

    return build


def markup_names() -> onnx.ModelProto:
    """Names that are rich markup: printed literally, never styled away."""
    return tiny_model(input_name="[bold]x[/bold]", node_prefix="[red]n[/red]")


def _npy_bytes(data: bytes, name: str) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        path = write_bytes(ws, name, data)
        return [str(tiny_file(ws)), "--input", f"x={path}" if name.endswith(".npy") else str(path)]

    return build


def _pickled_npy(ws: Workspace) -> list[str]:
    path = ws.inputs / "obj.npy"
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return [str(tiny_file(ws)), "--input", f"x={path}"]


def _npz_for_one_input(ws: Workspace) -> list[str]:
    path = ws.inputs / "x.npz"
    np.savez(path, x=np.ones((1, 4), np.float32))
    return [str(tiny_file(ws)), "--input", f"x={path}"]


def _blocker_cache(ws: Workspace) -> list[str]:
    (ws.inputs / "blocker").write_text("a file where the cache folder belongs")
    return [str(tiny_file(ws)), "-o", str(ws.out / "o.onnx")]


def _broken_link_parent(ws: Workspace) -> list[str]:
    (ws.inputs / "gone").symlink_to(ws.inputs / "nowhere")
    return [str(tiny_file(ws)), "-o", str(ws.inputs / "gone" / "o.onnx")]


OUTSIDE = ("outside its own folder",)
TOO_BIG = ("2147483647",)
NO_MEMORY = ("memory available", "'x'", "1000000000, 1024")
WIDE = _proto(wide_model, "wide.onnx")
JOURNAL_OUT = ("journal.jsonl",)


def _escape(*extra: str, out: str = "") -> Callable[[Workspace], list[str]]:
    """The model with external data at '../outside.bin', then ``extra`` arguments."""
    return _model(_external("../outside.bin"), *extra, out=out)


CASES += [
    # load_profile: a profile is an input; only what tune writes, by type and range
    Case(
        "load-profile-optimized-model-filepath",
        "load_profile",
        _edited_profile(_set("session_settings.optimized_model_filepath", "/tmp/overwrite-me.onnx")),
        2,
        ("session_settings.optimized_model_filepath", "accept_fields"),
    ),
    Case(
        "load-profile-config-entry-that-writes",
        "load_profile",
        _edited_profile(_set("session_settings.config_entries", {"ep.context_file_path": "/tmp/x.onnx"})),
        2,
        ("session_settings.config_entries.ep.context_file_path",),
    ),
    Case(
        "load-profile-ep-library-option",
        "load_profile",
        _edited_profile(_set("providers.0.options", {"ep_library": "/tmp/libevil.so"})),
        2,
        ("providers[0].options.ep_library",),
    ),
    Case(
        "load-profile-model-absolute-elsewhere",
        "load_profile",
        _edited_profile(_model_elsewhere("absolute")),
        2,
        ("outside the profile's folder", "accept_model_outside"),
    ),
    Case(
        "load-profile-model-dotdot",
        "load_profile",
        _edited_profile(_model_elsewhere("dotdot")),
        2,
        ("outside the profile's folder",),
    ),
    Case("load-profile-model-link-out", "load_profile", profile_model_linked_out, 2, ("outside the profile's folder",)),
    Case("load-profile-model-deleted", "load_profile", profile_model_deleted, 1, ("is missing",)),
    Case(
        "load-profile-huge-file",
        "load_profile",
        _profile_text(lambda ws: b" " * (17 * 2**20)),
        2,
        ("bytes, more than an ortpilot profile",),
    ),
    Case(
        "load-profile-deep-nesting",
        "load_profile",
        _profile_text(lambda ws: "[" * 100_000),
        2,
        ("not valid json", "recursion"),
    ),
    Case("load-profile-not-utf8", "load_profile", _profile_text(lambda ws: b"\xff\xfe{}"), 2, ("not valid json",)),
    Case(
        "load-profile-nul-in-string",
        "load_profile",
        _edited_profile(_set("model.file", "tuned.onnx\0.txt")),
        2,
        ("'model.file'", "nul"),
    ),
    Case(
        "load-profile-bool-threads",
        "load_profile",
        _edited_profile(_set("session_settings.intra_op_threads", True)),
        2,
        ("session_settings.intra_op_threads", "integer"),
    ),
    Case(
        "load-profile-negative-threads",
        "load_profile",
        _edited_profile(_set("session_settings.intra_op_threads", -4)),
        2,
        ("intra_op_threads", "outside 0.."),
    ),
    Case(
        "load-profile-billion-threads",
        "load_profile",
        _edited_profile(_set("session_settings.inter_op_threads", 10**9)),
        2,
        ("inter_op_threads", "outside 0.."),
    ),
    Case(
        "load-profile-nan-threads",
        "load_profile",
        _profile_text(lambda ws: _valid_profile_json(ws).replace('"intra_op_threads": 1', '"intra_op_threads": NaN')),
        2,
        ("intra_op_threads",),
    ),
    Case(
        "load-profile-unknown-top-field",
        "load_profile",
        _edited_profile(_set("run_this", "rm -rf /")),
        2,
        ("'run_this'", "no such field"),
    ),
    Case(
        "load-profile-bad-sha256",
        "load_profile",
        _edited_profile(_set("model.sha256", "abc")),
        2,
        ("'model.sha256'", "sha256"),
    ),
    Case(
        "load-profile-empty-providers",
        "load_profile",
        _edited_profile(_set("providers", [])),
        2,
        ("'providers'", "empty"),
    ),
    Case(
        "load-profile-providers-not-a-list",
        "load_profile",
        _edited_profile(_set("providers", "cpu")),
        2,
        ("'providers'", "array"),
    ),
    Case(
        "load-profile-provider-without-name",
        "load_profile",
        _edited_profile(_set("providers", [{"options": {}}])),
        2,
        ("providers[0].name", "missing"),
    ),
    Case(
        "load-profile-option-value-object",
        "load_profile",
        _edited_profile(_set("providers.0.options", {"device_id": {"x": 1}})),
        2,
        ("providers[0].options.device_id",),
    ),
    Case(
        "load-profile-negative-shape",
        "load_profile",
        _edited_profile(_set("shapes", {"x": [-1, 4]})),
        2,
        ("shapes.x[0]",),
    ),
    Case(
        "load-profile-log-severity-9",
        "load_profile",
        _edited_profile(_set("session_settings.log_severity", 9)),
        2,
        ("log_severity", "0..4"),
    ),
    Case("load-profile-version-string", "load_profile", _edited_profile(_set("version", "two")), 2, ("'version'",)),
    Case("load-profile-newer-version", "load_profile", _edited_profile(_set("version", 99)), 2, ("upgrade ortpilot",)),
    Case(
        "load-profile-machine-not-object",
        "load_profile",
        _edited_profile(_set("machine", "fast")),
        2,
        ("'machine'", "object"),
    ),
    Case(
        "load-profile-settings-a-list",
        "load_profile",
        _edited_profile(_set("session_settings", [1, 2])),
        2,
        ("'session_settings'", "object"),
    ),
    Case(
        "load-profile-empty-model-file",
        "load_profile",
        _edited_profile(_set("model.file", "")),
        2,
        ("'model.file'", "empty"),
    ),
    Case(
        "load-profile-free-dim-string",
        "load_profile",
        _edited_profile(_set("session_settings.free_dimension_overrides", {"batch": "many"})),
        2,
        ("free_dimension_overrides.batch", "integer"),
    ),
    # tune --resume: the journal is parsed strictly, never through a link
    Case(
        "tune-resume-journal-line-not-json",
        "tune",
        _journal(START, "{not json"),
        2,
        ("line 2", "not json"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-unknown-kind",
        "tune",
        _journal(START, {"kind": "exec", "cmd": "rm -rf /"}),
        2,
        ("line 2", "unknown kind 'exec'"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-wrong-type",
        "tune",
        _journal({**START, "budget_s": "thirty"}),
        2,
        ("line 1", "'budget_s'"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-unknown-field",
        "tune",
        _journal(START, {**PREPARED, "shell": "x"}),
        2,
        ("line 2", "'shell'"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-kept-points-elsewhere",
        "tune",
        _journal(
            START,
            {
                "kind": "kept",
                "reference": {"file": "/etc/passwd", "sha256": "0"},
                "heldout": {"file": ".ortpilot-tune/heldout.npz", "sha256": "0"},
            },
        ),
        2,
        ("line 2", "/etc/passwd"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-negative-timing",
        "tune",
        _journal(START, {"kind": "bench", "id": "a", "stage": "screen", "status": "ok", "samples_s": [-1.0]}),
        2,
        ("line 2", "timings"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-without-kept",
        "tune",
        _journal(START, PREPARED),
        2,
        ("lacks its kept record",),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-not-an-object",
        "tune",
        _journal("[1, 2, 3]"),
        2,
        ("line 1", "not a json object"),
        outputs=JOURNAL_OUT,
    ),
    Case(
        "tune-resume-journal-is-a-link", "tune", _journal(START, link=True), 2, ("symbolic link",), outputs=JOURNAL_OUT
    ),
    # resource limits
    Case("run-shape-above-the-bound", "run", _model(tiny_file, "--shape", "batch=99999999999"), 2, TOO_BIG),
    Case("run-shape-of-a-billion-needs-4tb", "run", _model(WIDE, "--shape", "batch=1000000000"), 2, NO_MEMORY),
    Case("run-shape-float-dims", "run", _model(tiny_file, "--shape", "x=1.5x4"), 2, ("malformed --shape",)),
    Case("run-ort-out-of-memory", "run", _alloc(), 1, ("out of memory", "failed to allocate", "x[2]")),
    Case("bench-shape-of-a-billion", "bench", _model(WIDE, "--shape", "batch=1000000000", "--runs", "3"), 2, NO_MEMORY),
    Case(
        "bench-ort-out-of-memory",
        "bench",
        _alloc("--runs", "3", "--warmup", "1", "--no-roofline"),
        1,
        ("failed at the first run", "failed to allocate"),
    ),
    Case(
        "tune-shape-of-a-billion",
        "tune",
        _model(WIDE, "--shape", "batch=1000000000", "--budget", "30", out="tune"),
        2,
        NO_MEMORY,
    ),
    Case(
        "tune-shape-above-the-bound",
        "tune",
        _model(tiny_file, "--shape", "batch=3000000000", "--budget", "30", out="tune"),
        2,
        TOO_BIG,
    ),
    Case("tune-batch-empty-item", "tune", _model(tiny_file, "--batch", "1,,32", out="tune"), 2, ("'1,,32'",)),
    Case("tune-batch-twice", "tune", _model(tiny_file, "--batch", "8,8", out="tune"), 2, ("names 8 more than once",)),
    Case("compare-shape-above-the-bound", "compare", _model(tiny_file, "--shape", "batch=3000000000"), 2, TOO_BIG),
    Case("inspect-shape-above-the-bound", "inspect", _model(tiny_file, "--shape", "batch=3000000000"), 2, TOO_BIG),
    Case(
        "quantize-shape-of-a-billion",
        "quantize",
        _model(WIDE, "--mode", "dynamic", "--shape", "batch=1000000000", out="q.onnx"),
        2,
        NO_MEMORY,
    ),
    Case(
        "generate-prompt-id-beyond-int64",
        "generate",
        lambda ws: ["demo:decoder", "--prompt-ids", "9" * 30],
        2,
        ("int64",),
    ),
    # operating-system errors
    Case(
        "optimize-cache-path-is-a-file",
        "optimize",
        _blocker_cache,
        2,
        ("is a file", "ortpilot_cache_dir"),
        env={"ORTPILOT_CACHE_DIR": "../inputs/blocker"},
    ),
    Case("optimize-output-under-a-broken-link", "optimize", _broken_link_parent, 2, ("broken symbolic link",)),
    Case("tune-budget-zero", "tune", _model(tiny_file, "--budget", "0", out="tune"), 2, ("--budget",)),
    # external data that resolves outside the model's folder: refused without touching the target
    Case(
        "inspect-external-data-dotdot", "inspect", _model(_external("../outside.bin")), 2, (*OUTSIDE, "../outside.bin")
    ),
    Case(
        "inspect-external-data-absolute", "inspect", _model(_external("/etc/hostname")), 2, (*OUTSIDE, "/etc/hostname")
    ),
    Case("inspect-external-data-link-out", "inspect", _model(_external("w.bin", link_to="../outside.bin")), 2, OUTSIDE),
    Case(
        "inspect-external-data-in-constant",
        "inspect",
        _model(_external("../outside.bin", where="constant")),
        2,
        OUTSIDE,
    ),
    Case(
        "inspect-external-data-in-subgraph",
        "inspect",
        _model(_external("../outside.bin", where="subgraph")),
        2,
        OUTSIDE,
    ),
    Case(
        "inspect-external-shorter-than-dims",
        "inspect",
        _model(_external("w.bin", length=4)),
        2,
        ("declares dims [3] (12 bytes)", "length is 4"),
    ),
    Case("run-external-data-absolute", "run", _model(_external("/etc/hostname")), 2, OUTSIDE),
    Case("run-external-shorter-than-dims", "run", _model(_external("w.bin", length=4)), 2, ("declares dims",)),
    Case("optimize-external-data-dotdot", "optimize", _escape(out="o.onnx"), 2, OUTSIDE),
    Case("quantize-external-data-dotdot", "quantize", _escape("--mode", "dynamic", out="q.onnx"), 2, OUTSIDE),
    Case("bench-external-data-dotdot", "bench", _escape("--runs", "3"), 2, OUTSIDE),
    Case("tune-external-data-dotdot", "tune", _escape("--budget", "30", out="tune"), 2, OUTSIDE),
    Case("compare-external-data-dotdot", "compare", _escape("-p", "cpu", "-p", "cpu"), 2, OUTSIDE),
    Case("generate-external-data-dotdot", "generate", _escape("--prompt-ids", "1,2"), 2, OUTSIDE),
    Case("load-external-data-dotdot-isolated", "load", lambda ws: [str(_external("../outside.bin")(ws))], 2, OUTSIDE),
    # one calibration loader: the same file gets the same answer from quantize, tune and compare
    *[
        Case(f"{command}-calibration-wrong-dtype", command, _calibrated(command, WRONG_DTYPE), 2, CALIB_DTYPE_WORDS)
        for command in ("quantize", "tune", "compare")
    ],
    *[
        Case(
            f"{command}-calibration-unknown-name",
            command,
            _calibrated(command, UNKNOWN_NAME),
            2,
            ("'nope'", "not model inputs"),
        )
        for command in ("quantize", "tune", "compare")
    ],
    *[
        Case(
            f"{command}-calibration-corrupt-npz",
            command,
            _calibrated(command, CORRUPT_NPZ),
            2,
            ("not a readable .npz", "badzipfile"),
        )
        for command in ("quantize", "tune", "compare")
    ],
    # input files
    Case("run-input-npy-empty", "run", _npy_bytes(b"", "x.npy"), 2, ("x.npy", "not a readable")),
    Case("run-input-npz-corrupt", "run", _npy_bytes(b"PK\x03\x04 no zip", "all.npz"), 2, ("not a readable .npz",)),
    Case("run-input-npy-pickled-object", "run", _pickled_npy, 2, ("obj.npy", "allow_pickle")),
    Case("run-input-npz-for-one-input", "run", _npz_for_one_input, 2, ("named arrays",)),
    # messages keep their text: rich markup in names is printed literally
    Case(
        "run-markup-in-input-name",
        "run",
        lambda ws: [
            str(save(markup_names(), ws.inputs / "markup.onnx")),
            "--input",
            f"[bold]x[/bold]={array_file(ws, 'x', np.ones(4, np.float32))}",
        ],
        2,
        ("'[bold]x[/bold]'", "[batch, 4]"),
    ),
    Case(
        "inspect-markup-in-dangling-edge",
        "inspect",
        _model(_proto(lambda: _dangling_named("[red]boom[/red]"), "markup-dangling.onnx")),
        2,
        ("[red]boom[/red]",),
    ),
]


def _dangling_named(name: str) -> onnx.ModelProto:
    model = tiny_model()
    model.graph.node[1].input[0] = name
    return model


def _compressed_npz_corrupt(ws: Workspace) -> list[str]:
    """A real compressed .npz whose member's deflate stream is damaged (zlib.error while reading it)."""
    path = ws.inputs / "all.npz"
    np.savez_compressed(path, x=np.random.default_rng(0).standard_normal((64, 4)).astype(np.float32))
    data = bytearray(path.read_bytes())
    start = data.index(b"x.npy") + 200  # inside the member's compressed bytes, past its local header
    data[start : start + 64] = bytes(64)
    path.write_bytes(bytes(data))
    return [str(tiny_file(ws)), "--input", str(path)]


def _calibration_folder_npy(data: bytes) -> Callable[[Workspace], list[str]]:
    def build(ws: Workspace) -> list[str]:
        folder = ws.inputs / "calib"
        folder.mkdir()
        (folder / "x.npy").write_bytes(data)
        return [str(tiny_file(ws)), "--calibration", str(folder), "-o", str(ws.out / "tune"), "--budget", "30"]

    return build


def _workload_out_of_vocabulary(ws: Workspace) -> list[str]:
    """Requests whose token ids lie outside the demo encoder's vocabulary: its embedding Gather refuses them."""
    ids = np.full((3, 1, 16), 10**6, np.int64)
    path = ws.inputs / "oov.npz"
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    return ["demo:encoder", "--workload", str(path), "-o", str(ws.out / "tune"), "--budget", "30"]


def _workload_histogram(doc: dict) -> Callable[[Workspace], list[str]]:
    """A ``--workload`` histogram of the tiny model's batch dim, written as given."""

    def build(ws: Workspace) -> list[str]:
        path = ws.inputs / "workload.json"
        path.write_text(json.dumps(doc))
        return [str(tiny_file(ws)), "--workload", str(path), "-o", str(ws.out / "tune"), "--budget", "30"]

    return build


def _raising_reader(ws: Workspace) -> list[str]:
    """A calibration reader file whose factory raises: the user's code, said as such."""
    reader = ws.inputs / "reader.py"
    reader.write_text('def make():\n    raise RuntimeError("boom")\n')
    args = ["--mode", "static", "--calibration", f"{reader}:make", "-o", str(ws.out / "q.onnx")]
    return [str(tiny_file(ws)), *args]


def _profile_with_reference(data: bytes | None) -> Callable[[Workspace], list[str]]:
    """A profile that names its reference sample: the file damaged (``data``), or missing (None)."""

    def build(ws: Workspace) -> list[str]:
        profile = tuned_profile(ws)
        doc = json.loads(profile.read_text())
        doc["reference_outputs"] = {"file": "reference.npz", "sha256": {}}
        profile.write_text(json.dumps(doc))
        if data is not None:
            (ws.inputs / "reference.npz").write_bytes(data)
        return [str(profile)]

    return build


CASES += [
    # damaged arrays: every reader names the file (a zip where an .npy goes, a corrupt deflate stream, empty)
    Case(
        "run-input-npy-is-a-zip", "run", _npy_bytes(b"PK\x03\x04 not an npy", "x.npy"), 2, ("x.npy", "not a readable")
    ),
    Case("run-input-npz-compressed-corrupt", "run", _compressed_npz_corrupt, 2, ("all.npz", "not a readable .npz")),
    Case(
        "tune-calibration-folder-empty-npy",
        "tune",
        _calibration_folder_npy(b""),
        2,
        ("x.npy", "not a readable .npy"),
    ),
    Case(
        "tune-calibration-folder-zip-as-npy",
        "tune",
        _calibration_folder_npy(b"PK\x03\x04 junk"),
        2,
        ("x.npy", "not a readable .npy"),
    ),
    Case("verify-reference-damaged", "verify", _profile_with_reference(b"PK\x03\x04 junk"), 2, ("cannot be read",)),
    Case("verify-reference-missing", "verify", _profile_with_reference(None), 1, ("reference sample", "is missing")),
    Case(
        "verify-class-on-a-plain-profile",
        "verify",
        lambda ws: [str(tuned_profile(ws)), "--class", "x86-vnni-2cpu"],
        2,
        ("--class x86-vnni-2cpu", "is a bundle"),
    ),
    Case(
        "tune-workload-out-of-vocabulary",
        "tune",
        _workload_out_of_vocabulary,
        2,
        ("could not be measured", "out of data bounds", "--workload's requests"),
    ),
    Case(
        "tune-workload-npz-is-text",
        "tune",
        lambda ws: [
            str(tiny_file(ws)),
            "--workload",
            str(write_bytes(ws, "traffic.npz", b"input_ids,attention_mask\n1,2\n")),
            "-o",
            str(ws.out / "tune"),
            "--budget",
            "30",
        ],
        2,
        ("traffic.npz", "neither a zip archive's nor an .npy file's header"),
    ),
    Case(
        "run-input-npy-is-text", "run", _npy_bytes(b"0.5 0.5 0.5 0.5", "x.npy"), 2, ("x.npy", "an .npy file's header")
    ),
    Case(
        "tune-workload-count-a-string",
        "tune",
        _workload_histogram({"dims": {"batch": {"1": "3"}}}),
        2,
        ("--workload", 'the count of batch=1 is "3"', "a number of requests (or their share)"),
    ),
    # numbers and paths that would never end, or land elsewhere
    Case("tune-budget-infinite", "tune", _model(tiny_file, "--budget", "inf", out="tune"), 2, ("--budget", "a week")),
    Case("bench-duration-infinite", "bench", _model(tiny_file, "--duration", "inf"), 2, ("duration", "a day")),
    Case("tune-out-empty", "tune", lambda ws: [str(tiny_file(ws)), "-o", "", "--budget", "30"], 2, ("needs a folder",)),
    Case(
        "tune-out-under-proc",
        "tune",
        lambda ws: [str(tiny_file(ws)), "-o", "/proc/ortpilot-corpus/out", "--budget", "30"],
        2,
        ("/proc/ortpilot-corpus/out", "virtual filesystem"),
    ),
    Case("compare-atol-nan", "compare", _model(tiny_file, "-p", "cpu", "-p", "cpu", "--atol", "nan"), 2, ("finite",)),
    Case(
        "compare-atol-unknown-output",
        "compare",
        _model(tiny_file, "-p", "cpu", "-p", "cpu", "--atol", "1e-4", "--rtol", "nosuch:0.1"),
        2,
        ("--rtol names output(s) 'nosuch'", "Its outputs: "),
    ),
    Case(
        "compare-metric-unknown-output",
        "compare",
        _model(tiny_file, "-p", "cpu", "-p", "cpu", "--metric", "nosuch=cosine"),
        2,
        ("--metric names output(s) 'nosuch'", "Use OUTPUT=METRIC with one of those"),
    ),
    Case("bench-threads-huge", "bench", _model(tiny_file, "--threads", "100000", "--runs", "3"), 2, ("4096",)),
    Case("demo-models-empty-folder", "demo-models", lambda ws: [""], 2, ("needs a folder path",)),
    Case(
        "export-triton-empty-output",
        "export",
        lambda ws: ["triton", str(tuned_profile(ws)), "-o", ""],
        2,
        ("-o/--output", "empty path"),
    ),
    Case(
        "optimize-output-under-proc",
        "optimize",
        lambda ws: [str(tiny_file(ws)), "-o", "/proc/ortpilot-corpus.onnx"],
        2,
        ("virtual filesystem",),
    ),
    Case(
        "optimize-cache-under-proc",
        "optimize",
        _model(tiny_file, out="o.onnx"),
        2,
        ("/proc/ortpilot-corpus-cache", "ortpilot_cache_dir"),
        env={"ORTPILOT_CACHE_DIR": "/proc/ortpilot-corpus-cache"},
    ),
    Case("optimize-free-dim-zero", "optimize", _model(tiny_file, "--free-dim", "batch=0", out="o.onnx"), 2, ("1 to",)),
    Case(
        "optimize-free-dim-unknown",
        "optimize",
        _model(tiny_file, "--free-dim", "bacth=2", out="o.onnx"),
        2,
        ("--free-dim bacth", "symbolic dims: batch"),
    ),
    Case("quantize-calibration-reader-raises", "quantize", _raising_reader, 2, ("raised RuntimeError: boom",)),
    Case(
        "export-triton-max-batch-over-int32",
        "export",
        lambda ws: ["triton", str(tuned_profile(ws)), "-o", str(ws.out / "repo"), "--max-batch", "2147483648"],
        2,
        ("--max-batch", "2147483647"),
    ),
    # shapes that leave nothing to run, or name nothing in the model
    Case(
        "tune-shape-zero", "tune", _model(tiny_file, "--shape", "batch=0", "--budget", "30", out="tune"), 2, ("empty",)
    ),
    Case(
        "run-shape-unknown-dim",
        "run",
        _model(tiny_file, "--shape", "bacth=2"),
        2,
        ("--shape bacth", "symbolic dims: batch"),
    ),
    Case(
        "quantize-shape-zero",
        "quantize",
        _model(tiny_file, "--mode", "dynamic", "--shape", "batch=0", out="q.onnx"),
        2,
        ("every input empty", "the gate would time and compare nothing"),
    ),
    Case(
        "compare-a-billion-samples",
        "compare",
        lambda ws: [str(tiny_file(ws)), str(tiny_file(ws, "b.onnx", node_prefix="b_")), "--samples", "1000000000"],
        2,
        ("1,000,000,000 generated input sets", "memory available", "--samples N"),
    ),
    Case(
        "compare-shape-zero",
        "compare",
        lambda ws: [str(tiny_file(ws)), str(tiny_file(ws, "b.onnx", node_prefix="b_")), "--shape", "batch=0"],
        2,
        ("every input empty", "the comparison would time and compare nothing"),
    ),
    Case(
        "tune-calibration-every-input-empty",
        "tune",
        _calibrated("tune", _calibration_file(lambda: {"x": np.ones((3, 0, 4), np.float32)}, "empty.npz")),
        2,
        ("every input empty",),
    ),
]
