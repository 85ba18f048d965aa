"""Resolve rendered SGLang command lines with SGLang 0.5.23's own start-up resolution, on CPU.

The operator sizes pools, picks page sizes and refuses layouts from `core/resolution.py`, a
hand-written mirror of what the engine does to its flags before serving. A mirror drifts; the
wheel does not. These helpers run, from the pinned wheel, what ``sglang serve`` runs at
start-up: ``prepare_server_args(argv)``, ``ServerArgs.resolve_once()`` (the whole hook
pipeline of ``arg_groups/pipeline.py``, model overrides included) and
``check_server_args()``, against a real ``config.json`` of the model
(``tests/support/data/sglang-models/<profile>/``, no weights).

What is declared instead of probed, and nothing else (``docs/sglang-parser.md``):

* The GPU: ``torch.cuda`` answers for one declared model (name, compute capability, memory,
  count) and ``torch.version.cuda``; ``nvidia-smi`` is a shim on ``PATH`` that prints the
  declared memory, so ``utils/common.py``'s own memory query and its parsing run; Triton's
  target is CUDA.
* The node's RDMA devices: the one sysfs directory ``--disaggregation-ib-device`` is checked
  against lists ``mlx5_0..7``.
* torch's dtypes are interned objects (so ``config_dtype == torch.float32`` compares as on
  torch) and ``torch.dtype`` is their class.
* FlashInfer is installed on every GPU install (sglang pins ``flashinfer_python==0.7.2``): once
  ``server_args`` is imported it is importable, and the one FlashInfer signature resolution
  inspects (Kimi K3's DCP check) is answered with 0.7.2's.
* torch, triton, torchvision, sgl_kernel, tvm_ffi, compressed_tensors and IPython are the parser
  harness's placeholders (``support.sglang_parser``) while the wheel is imported. Before the
  first argv is resolved they are armed: outside a module body (hooks import lazily), any use
  that is not one of the declared answers above aborts the run (a harness failure, never a
  verdict), so every resolved value comes from the wheel's logic on the declared device.

Each batch runs in the cache venv (``tools/sglang-parser.sh`` installs transformers and the
rest of ``RESOLUTION_DEPS`` there) for one GPU, since the wheel caches device probes per
process. Like ``support.sglang_parser`` this file keeps to the standard library.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import importlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from support import sglang_parser as parser_harness
from support.sglang_parser import INSTALLER, SGLANG_VERSION, SGLangParserUnavailable, sglang_python

MODELS = Path(__file__).resolve().parent / "data" / "sglang-models"

# What resolution settles that the operator mirrors or relies on.
RESOLVED_FIELDS = (
    "max_running_requests", "page_size", "chunked_prefill_size", "max_prefill_tokens",
    "mem_fraction_static", "attention_backend", "prefill_attention_backend", "decode_attention_backend",
    "kv_cache_dtype", "disable_radix_cache", "speculative_algorithm", "speculative_num_draft_tokens",
    "speculative_num_steps", "speculative_eagle_topk",
    "dcp_replicate_q_proj", "enable_symm_mem", "moe_a2a_backend", "disable_cuda_graph",
    "dsa_prefill_backend", "dsa_decode_backend",
)


@dataclasses.dataclass(frozen=True)
class DeclaredGpu:
    """One GPU model as torch.cuda and nvidia-smi would describe it."""

    name: str
    capability: tuple[int, int]
    memory_gib: float
    count: int = 8
    nics: tuple[str, ...] = tuple(f"mlx5_{i}" for i in range(8))
    """RDMA devices of the node (what `spec.transfer.ibDevices` names in the test fleets)."""

    @property
    def memory_mib(self) -> int:
        return int(self.memory_gib * 1024)


# Memory as the operator's GPU_TYPES lists it, so that both sides start from the same figure.
GPUS = {
    "H200": DeclaredGpu("NVIDIA H200", (9, 0), 141.0),
    "B200": DeclaredGpu("NVIDIA B200", (10, 0), 180.0),
    "B300": DeclaredGpu("NVIDIA B300 SXM6 AC", (10, 3), 288.0),
}


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The values one argv serves with after the wheel's resolution and checks."""

    values: dict[str, Any]
    warnings: list[str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]


@dataclasses.dataclass(frozen=True)
class Refused:
    """The wheel stops this argv during resolution or its checks, as the pod would at start-up."""

    type: str
    message: str


def model_dir(profile: str) -> Path:
    path = MODELS / profile
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json for {profile!r} under {MODELS}; add one (see its README)")
    return path


def with_model(argv: Sequence[str], profile: str) -> list[str]:
    """`argv` with --model-path, and a separate draft model's path, pointing at the profile's
    stored config (the test fleets name hub ids that are not downloaded)."""
    out = list(argv)
    for flag in ("--model-path", "--speculative-draft-model-path"):
        if flag in out:
            out[out.index(flag) + 1] = str(model_dir(profile))
    return out


def resolve_many(
    argvs: Iterable[Sequence[str]], gpu: DeclaredGpu, *, env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> list[Resolved | Refused]:
    """Resolve every argv on `gpu` in one subprocess; refusals are returned, not raised.

    `env` is the engine container's environment (resolution reads ``SGLANG_*`` variables);
    nothing else is inherited from the test process.
    """
    batch = [[str(arg) for arg in argv] for argv in argvs]
    if not batch:
        return []
    python = resolution_python()
    with tempfile.TemporaryDirectory(prefix="sglang-resolve-") as tmp:
        shim = Path(tmp) / "bin"
        shim.mkdir()
        _write_nvidia_smi(shim / "nvidia-smi", gpu)
        request, response = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request.write_text(json.dumps({"gpu": dataclasses.asdict(gpu), "argvs": batch}))
        child_env = {
            "PATH": f"{shim}:/usr/bin:/bin",
            "HOME": tmp,
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
            "PYTHONNOUSERSITE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **(env or {}),
        }
        proc = subprocess.run(
            [str(python), "-m", "support.sglang_resolver", "--request", str(request), "--out", str(response)],
            env=child_env, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if proc.returncode != 0 or not response.is_file():
            raise RuntimeError(
                f"the sglang resolution harness failed (exit {proc.returncode}); this is a harness "
                f"problem, not a verdict on the argv:\n{proc.stderr[-6000:]}"
            )
        payload = json.loads(response.read_text())
    return [
        Resolved(item["values"], item["warnings"]) if item["ok"] else Refused(item["type"], item["message"])
        for item in payload["results"]
    ]


def resolution_python() -> Path:
    """The cache venv's interpreter, once it holds this checkout's pins: an install made for the
    parser alone lacks transformers, and its marker says so (the installer's `--check`)."""
    python = sglang_python()
    repo = Path(__file__).resolve().parents[2]
    check = subprocess.run(["bash", str(repo / INSTALLER), "--check"], capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise SGLangParserUnavailable(
            f"the sglang {SGLANG_VERSION} venv under {python.parents[2]} lacks the packages resolution "
            f"needs (installed from other pins); run {INSTALLER}"
        )
    return python


def _write_nvidia_smi(path: Path, gpu: DeclaredGpu) -> None:
    """The one nvidia-smi query `utils/common.py:get_nvgpu_memory_capacity` makes, for `gpu`."""
    lines = "\\n".join([str(gpu.memory_mib)] * gpu.count)
    path.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--query-gpu=memory.total" ]; then printf "' + lines + '\\n"; exit 0; fi\n'
        'echo "nvidia-smi shim: only --query-gpu=memory.total is declared" >&2; exit 2\n'
    )
    path.chmod(0o755)


# ---------------------------------------------------------------------------
# Subprocess side (cache venv)
# ---------------------------------------------------------------------------

# Import-time placeholders beyond the parser's: runtimes of GPU kernels and notebooks that
# the import graph of the resolution pipeline reaches but resolution never calls.
_STUBBED = ("torch", "triton", "torchvision", "sgl_kernel", "tvm_ffi", "compressed_tensors", "IPython")
# torchvision is unpinned by sglang; transformers parses its version at import.
_STUB_VERSIONS = {"torchvision": "0.29.1", "flashinfer": "0.7.2"}
_DTYPES = {
    "float16": 2, "half": 2, "bfloat16": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
    "int8": 1, "uint8": 1, "int16": 2, "int32": 4, "int": 4, "int64": 8, "long": 8, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "float4_e2m1fn_x2": 1, "complex64": 8,
}
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "int": "int32", "long": "int64"}


class _Dtype:
    """A torch dtype: one object per name, so equality and dict lookups behave as on torch."""

    __slots__ = ("name", "itemsize")

    def __init__(self, name: str, itemsize: int) -> None:
        self.name, self.itemsize = name, itemsize

    @property
    def is_floating_point(self) -> bool:
        return self.name.startswith(("float", "bfloat"))

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _Device:
    """torch.device("cuda", 0), as handed to NVML probes (which find no NVML and answer no)."""

    def __init__(self, type: str, index: int | None = None) -> None:  # noqa: A002 - torch's name
        self.type, self.index = type, index


class _Props:
    """What torch.cuda.get_device_properties reports for the declared GPU."""

    def __init__(self, gpu: dict[str, Any]) -> None:
        self.name = gpu["name"]
        self.major, self.minor = gpu["capability"]
        self.total_memory = int(gpu["memory_gib"] * (1 << 30))
        self.multi_processor_count = 148 if self.major >= 10 else 132


def _trtllm_batch_decode_with_kv_cache_mla(query: Any, kv_cache: Any, workspace_buffer: Any,  # noqa: ARG001
                                           *, enable_dcp: bool = False, **kwargs: Any) -> None:
    """FlashInfer 0.7.2's signature, which Kimi K3's DCP check inspects
    (`arg_groups/model_overrides/kimi_k3.py:20-36`); never called."""
    raise AssertionError("declared FlashInfer kernel called during resolution")


def _declare(gpu: dict[str, Any]) -> None:
    dtypes = {name: _Dtype(_ALIASES.get(name, name), size) for name, size in _DTYPES.items()}
    for alias, target in _ALIASES.items():
        dtypes[alias] = dtypes[target]
    answers: dict[str, Any] = {f"torch.{name}": dtype for name, dtype in dtypes.items()}
    memory = int(gpu["memory_gib"] * (1 << 30))
    capability = tuple(gpu["capability"])
    answers.update({
        "torch.dtype": _Dtype,
        "torch.device": _Device,
        "torch.version.cuda": "13.0",
        "torch.version.hip": None,
        "torch.version.musa": None,
        "torch.cuda.is_available": lambda: True,
        "torch.cuda.is_initialized": lambda: False,
        "torch.cuda.device_count": lambda: gpu["count"],
        "torch.cuda.current_device": lambda: 0,
        "torch.cuda.get_device_capability": lambda device=None: capability,
        "torch.cuda.get_device_name": lambda device=None: gpu["name"],
        "torch.cuda.mem_get_info": lambda device=None: (memory, memory),
        "torch.cuda.get_device_properties": lambda device=None: _Props(gpu),
        "torch.mps.is_available": lambda: False,
        "torch.xpu.is_available": lambda: False,
        "torch.backends.mps.is_available": lambda: False,
        # Triton's view of the device, read when a kernel module is first imported.
        "triton.runtime.driver.active.get_current_target": lambda: types.SimpleNamespace(
            backend="cuda", arch=capability[0] * 10 + capability[1], warp_size=32),
        "triton.runtime.driver.active.utils.get_device_properties": lambda device=0: {
            "multiprocessor_count": _Props(gpu).multi_processor_count},
        "flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla": _trtllm_batch_decode_with_kv_cache_mla,
    })
    parser_harness._ANSWERS.update(answers)


IB_SYSFS = "/sys/class/infiniband"


def _declare_nics(nics: Sequence[str]) -> None:
    """The node's RDMA devices as sysfs lists them: `--disaggregation-ib-device` is checked against
    `/sys/class/infiniband` (`arg_groups/validation_hook.py:535-545`). Only that path is answered."""
    isdir, listdir = os.path.isdir, os.listdir

    def declared_isdir(path: Any) -> bool:
        return True if os.fspath(path) == IB_SYSFS else isdir(path)

    def declared_listdir(path: Any = ".") -> list[str]:
        return list(nics) if os.fspath(path) == IB_SYSFS else listdir(path)

    os.path.isdir = declared_isdir  # type: ignore[assignment]
    os.listdir = declared_listdir  # type: ignore[assignment]


def _load(gpu: dict[str, Any]) -> Any:
    """Import the wheel's server_args and resolution pipeline on the declared GPU, then arm."""
    parser_harness._STUBBED = _STUBBED
    parser_harness._STUB_VERSIONS.update(_STUB_VERSIONS)
    _declare(gpu)
    _declare_nics(gpu["nics"])
    server_args = parser_harness._load_server_args()
    parser_harness._STATE["armed"] = False
    import sglang.srt.arg_groups.pipeline  # noqa: F401  (the hooks' import graph, before arming)

    # FlashInfer is part of every GPU install; it is not stubbed earlier because modules that
    # register its kernels as torch custom ops at import would then need a real torch.
    parser_harness._STUBBED = (*_STUBBED, "flashinfer")
    _unarmed_while_importing()
    parser_harness._STATE["armed"] = True
    return server_args


def _unarmed_while_importing() -> None:
    """Hooks import modules lazily; what a module body does with the placeholders (annotations,
    decorators, module constants) is import-time, as while server_args was imported. Outside a
    module body only the declared answers may be used."""
    depth = [0]

    def unarmed(function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            parser_harness._STATE["armed"] = False
            try:
                return function(*args, **kwargs)
            finally:
                depth[0] -= 1
                parser_harness._STATE["armed"] = depth[0] == 0

        return wrapper

    builtins.__import__ = unarmed(builtins.__import__)
    importlib.import_module = unarmed(importlib.import_module)


def _jsonable(value: Any) -> Any:
    if isinstance(value, _Dtype):
        return repr(value)
    return parser_harness._jsonable(value)


@contextlib.contextmanager
def _environment() -> Iterator[None]:
    """Resolution exports variables for the scheduler; one argv's must not reach the next."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _graph_values(cfg: Any) -> dict[str, Any]:
    graphs = getattr(cfg, "cuda_graph_config", None)
    out: dict[str, Any] = {}
    for phase in ("decode", "prefill"):
        config = getattr(graphs, phase, None)
        out[f"cuda_graph_{phase}_backend"] = getattr(config, "backend", None)
        out[f"cuda_graph_{phase}_max_bs"] = getattr(config, "max_bs", None)
    return out


def _resolve_one(server_args_module: Any, argv: list[str]) -> dict[str, Any]:
    from sglang.srt.arg_groups.overrides import resolving_view

    collect = parser_harness._Collect()
    root = logging.getLogger()
    out, err = io.StringIO(), io.StringIO()
    with _environment(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            args = server_args_module.prepare_server_args(argv)
            root.addHandler(collect)
            args.resolve_once()
            args.check_server_args()
        except parser_harness._StubTouched:
            raise
        except Exception as exc:
            if "_Placeholder" in str(exc) or "<stub " in str(exc):
                raise RuntimeError(f"a stub leaked into resolution of {argv}: {exc!r}") from exc
            return {"ok": False, "type": type(exc).__name__, "message": str(exc)}
        except SystemExit as exit_:
            return {"ok": False, "type": "SystemExit", "message": f"exit {exit_.code}: {err.getvalue()[-500:]}"}
        finally:
            root.removeHandler(collect)
        cfg = resolving_view(args)
        values = {name: _jsonable(getattr(cfg, name)) for name in RESOLVED_FIELDS}
        values.update(_graph_values(cfg))
    return {"ok": True, "values": values, "warnings": collect.lines}


def main(args: Sequence[str] | None = None) -> int:
    """Entry point of the subprocess; see :func:`resolve_many` for the protocol."""
    cli = argparse.ArgumentParser(prog="python -m support.sglang_resolver",
                                  description=f"Resolve argv lists with sglang {SGLANG_VERSION}'s ServerArgs.")
    cli.add_argument("--request", type=Path, help="JSON: {gpu: {...}, argvs: [[...], ...]}")
    cli.add_argument("--out", type=Path, help="write the JSON result here (default: stdout)")
    cli.add_argument("--self-check", action="store_true",
                     help="resolve DeepSeek V3 TP8 decode on an H200 and check three values; exit 1 on mismatch")
    opts = cli.parse_args(args)
    if opts.self_check:
        return _self_check()
    if opts.request is None:
        cli.error("give --request FILE or --self-check")
    request = json.loads(opts.request.read_text())
    started = time.monotonic()
    module = _load(request["gpu"])
    imported = time.monotonic()
    results = [_resolve_one(module, argv) for argv in request["argvs"]]
    payload = {
        "sglang_version": SGLANG_VERSION,
        "import_seconds": round(imported - started, 3),
        "total_seconds": round(time.monotonic() - started, 3),
        "results": results,
    }
    text = json.dumps(payload)
    if opts.out:
        opts.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


def _self_check() -> int:
    """What the installer runs: the pipeline resolves one known argv to known values."""
    gpu = GPUS["H200"]
    argv = ["--model-path", str(model_dir("deepseek-v3")), "--tp-size", "8", "--disaggregation-mode", "decode",
            "--kv-cache-dtype", "fp8_e4m3"]
    with tempfile.TemporaryDirectory(prefix="sglang-resolve-") as tmp:
        _write_nvidia_smi(Path(tmp) / "nvidia-smi", gpu)
        os.environ["PATH"] = f"{tmp}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        module = _load(dataclasses.asdict(gpu))
        result = _resolve_one(module, argv)
    expected = {"chunked_prefill_size": 8192, "cuda_graph_decode_max_bs": 512, "mem_fraction_static": 0.929}
    got = {key: result.get("values", {}).get(key) for key in expected} if result["ok"] else result
    print(f"{'ok  ' if got == expected else 'FAIL'} deepseek-v3 tp8 decode on H200 -> {got}")
    return 0 if got == expected else 1


if __name__ == "__main__":
    sys.exit(main())
