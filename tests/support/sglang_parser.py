"""Check rendered SGLang command lines against SGLang's own argument parser.

A flag that SGLang does not know, a prefix that has become ambiguous, or a value
outside a flag's choices is only noticed when the engine pod exits with status 2.
A copied flag list goes stale the day SGLang renames something; the parser in the
pinned wheel does not. So these helpers run ``ServerArgs.add_cli_args`` and
``parse_args`` from the real sglang wheel, exactly as ``sglang serve`` /
``python -m sglang.launch_server`` build them in ``prepare_server_args``.

The wheel and its import-time dependencies live in a cache venv made by
``tools/sglang-parser.sh``, not in the project venv: sglang declares GPU-only
requirements (torch with CUDA, triton, flashinfer, ...) that a CPU test machine
cannot and should not install. The helpers therefore start that venv's Python in a
subprocess; :func:`parse_many` pays the ~0.5 s start-up once for a whole batch.

Inside the subprocess two things differ from a GPU install, and neither reaches
the parser (see ``docs/sglang-parser.md``):

* ``sglang/__init__.py`` is not executed. It only re-exports the frontend
  language API and patches transformers; the package object is created from its
  real import spec so every submodule still loads from the wheel.
* ``torch`` and ``triton`` are placeholders that answer like a CPU-only torch
  (no CUDA/HIP/NPU, nothing available) while the import graph of
  ``sglang.srt.server_args`` runs. Before the parser is built they are armed:
  any use afterwards raises :class:`_StubTouched`, which derives from
  ``BaseException`` so that argparse cannot turn it into an "invalid value"
  message. A placeholder found in a parser default, choice list, type or parsed
  value aborts the run as well. A result is therefore either what the real
  parser produced without torch's help, or a loud failure of the harness.

This file is imported in two places: by tests in the project venv (the public
functions) and as ``python -m support.sglang_parser`` in the cache
venv (:func:`main`). It must keep to the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
INSTALLER = "tools/sglang-parser.sh"

__all__ = [
    "SGLANG_VERSION",
    "SGLangArgs",
    "SGLangArgvError",
    "SGLangParserUnavailable",
    "cache_dir",
    "parse_many",
    "parse_with_sglang",
    "sglang_python",
]


# ---------------------------------------------------------------------------
# Caller side (project venv)
# ---------------------------------------------------------------------------


class SGLangParserUnavailable(RuntimeError):
    """The cached sglang install is missing, so no verdict can be given.

    A separate type so that a test can fail with the fix in its message instead
    of silently skipping, which would let a bad flag through CI.
    """


class SGLangArgvError(ValueError):
    """SGLang's parser rejected an argv, as ``sglang serve`` would at start-up.

    ``message`` is argparse's own text (e.g. ``ambiguous option: ...``) so a test
    failure reads like the crash log of the pod it prevents.
    """

    def __init__(self, argv: Sequence[str], message: str, stderr: str = "") -> None:
        super().__init__(f"sglang {SGLANG_VERSION} rejects {list(argv)!r}: {message}")
        self.argv = list(argv)
        self.message = message
        self.stderr = stderr


class SGLangArgs(dict[str, Any]):
    """The parsed namespace as a plain dict, plus what the parser logged.

    Deprecated flags still parse but log a warning (``--enable-dp-attention``);
    keeping those lines lets a test insist that rendered argv are warning-free.
    ``ib_devices`` is what SGLang's transfer engines make of ``--disaggregation-ib-device``
    (its own ``parse_ib_device_config``): one device string for every GPU, a map from
    GPU id (as a string) to device string, or None. The parser keeps the flag as an
    opaque string, so a malformed per-GPU map would otherwise pass unnoticed.
    """

    def __init__(self, values: Mapping[str, Any], warnings: Sequence[str] = (),
                 ib_devices: str | dict[str, str] | None = None) -> None:
        super().__init__(values)
        self.warnings = list(warnings)
        self.ib_devices = ib_devices


def cache_dir() -> Path:
    """Where tools/sglang-parser.sh installs; shared with the other cached tools."""
    root = os.environ.get("HYBRIDSERVING_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "hybridserving"
    )
    return Path(root) / f"sglang-{SGLANG_VERSION}"


def sglang_python() -> Path:
    """The cache venv's interpreter, only once the installer finished its self-check.

    The marker file, not the interpreter, is the test: an interrupted install can
    leave a venv without sglang in it.
    """
    base = cache_dir()
    python = base / "venv" / "bin" / "python"
    if not (base / ".installed").is_file() or not python.exists():
        raise SGLangParserUnavailable(
            f"sglang {SGLANG_VERSION}'s argument parser is not installed under {base}; "
            f"run {INSTALLER} (downloads the sglang wheel and a few small packages "
            "from PyPI, about 1 minute)"
        )
    return python


def dump_flags() -> dict[str, Any]:
    """Every option of the wheel's parser with its argparse nargs (what the simulator accepts)."""
    proc = subprocess.run(
        [str(sglang_python()), "-m", "support.sglang_parser", "--dump-flags"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(_tests_root()), "PYTHONNOUSERSITE": "1"},
    )
    flags: dict[str, Any] = json.loads(proc.stdout)
    return flags


def _tests_root() -> Path:
    return Path(__file__).resolve().parents[1]


def parse_many(
    argvs: Iterable[Sequence[str]],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 300.0,
) -> list[SGLangArgs | SGLangArgvError]:
    """Parse every argv in one subprocess; errors are returned, not raised.

    One process per argv would cost the whole import of server_args each time,
    so table-driven tests should collect their cases and call this once.
    ``env`` is the engine container's environment: a few choice lists depend on
    ``SGLANG_*`` variables, and nothing is inherited from the test process so
    that results do not depend on who runs the tests.
    """
    batch = [list(argv) for argv in argvs]
    for argv in batch:
        if not all(isinstance(arg, str) for arg in argv):
            raise TypeError(f"argv items must be str, got {argv!r}")
    if not batch:
        return []
    python = sglang_python()
    child_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(_tests_root()),
        "PYTHONNOUSERSITE": "1",
    }
    child_env.update(env or {})
    with tempfile.TemporaryDirectory(prefix="sglang-argv-") as tmp:
        request = Path(tmp) / "argv.json"
        response = Path(tmp) / "result.json"
        request.write_text(json.dumps(batch))
        proc = subprocess.run(
            [
                str(python),
                "-m",
                "support.sglang_parser",
                "--argv-json",
                str(request),
                "--out",
                str(response),
            ],
            env=child_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0 or not response.is_file():
            raise RuntimeError(
                f"the sglang parser harness failed (exit {proc.returncode}); this is a "
                f"harness problem, not a verdict on the argv:\n{proc.stderr[-4000:]}"
            )
        payload = json.loads(response.read_text())
    results: list[SGLangArgs | SGLangArgvError] = []
    for argv, item in zip(batch, payload["results"], strict=True):
        if item["ok"]:
            results.append(SGLangArgs(item["args"], item["warnings"], item.get("ib_devices")))
        else:
            results.append(SGLangArgvError(argv, item["error"], item["stderr"]))
    return results


def option_strings() -> list[str]:
    """Every option string SGLang's parser knows (what argparse resolves abbreviations against):
    the dumped flags plus argparse's own `-h`/`--help`."""
    return sorted(set(dump_flags()["flags"]) | {"-h", "--help"})


def parse_with_sglang(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None
) -> SGLangArgs:
    """Parse one argv (the part after ``python -m sglang.launch_server``).

    Raises :class:`SGLangArgvError` where ``sglang serve`` would exit with status 2.
    """
    (result,) = parse_many([argv], env=env)
    if isinstance(result, SGLangArgvError):
        raise result
    return result


# ---------------------------------------------------------------------------
# Subprocess side (cache venv)
# ---------------------------------------------------------------------------

# Accelerator runtimes that the import graph of server_args pulls in at module
# level (sglang/srt/utils/common.py, distributed/, kernels/) but the parser never
# calls. Everything else it imports is installed for real by the installer.
_STUBBED: tuple[str, ...] = ("torch", "triton")
# Versions reported to import-time version checks: what sglang 0.5.23 pins.
_STUB_VERSIONS = {"torch": "2.14.1"}
# Device namespaces a CPU build of torch does not have; hasattr() must say no,
# as sglang's is_npu()/is_hpu()/is_musa() probe with hasattr first.
_ABSENT_TORCH_ATTRS = frozenset({"npu", "hpu", "musa", "sail"})

_STATE: dict[str, Any] = {"armed": False, "touched": []}
# Fixed answers for named attributes of the stubs (a declared GPU's device queries, see
# support.sglang_resolver); the parser itself runs with none.
_ANSWERS: dict[str, Any] = {}


def _leads_to_answer(name: str) -> bool:
    """A namespace on the way to a declared answer (torch.cuda for torch.cuda.is_available)."""
    return any(key.startswith(name + ".") for key in _ANSWERS)


class _StubTouched(BaseException):
    """A stubbed accelerator module was used after import: the verdict is void.

    BaseException, so argparse's ``except (TypeError, ValueError)`` around type
    conversion cannot turn it into an ordinary "invalid value" rejection.
    """


def _use(name: str) -> None:
    if _STATE["armed"]:
        raise _StubTouched(
            f"{name} was used while parsing; the sglang parser harness stubs torch "
            "and triton, so this result would not be SGLang's"
        )
    _STATE["touched"].append(name)


_PLACEHOLDER_BASES: dict[str, type] = {}


class _Placeholder:
    """Any attribute of a stubbed module, answering like a CPU-only build.

    Falsy, so ``torch.cuda.is_available()`` and friends read as "no device";
    ``torch.version.*`` is None, as on CPU torch.
    """

    __slots__ = ("_name",)

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        name = f"{self._name}.{attr}"
        if name in _ANSWERS:
            return _ANSWERS[name]
        if _leads_to_answer(name):
            return _Placeholder(name)
        _use(name)
        if self._name == "torch.version":
            return None
        return _Placeholder(name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _use(f"{self._name}()")
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a bare decorator: keep the function
        return _Placeholder(f"{self._name}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # A class deriving from torch.nn.Module etc.: give it a distinct empty
        # base so that multiple inheritance with ABC still linearises.
        _use(f"class base {self._name}")
        base = _PLACEHOLDER_BASES.get(self._name)
        if base is None:
            module, _, qualname = self._name.rpartition(".")
            base = type(qualname, (), {"__module__": module})
            _PLACEHOLDER_BASES[self._name] = base
        return (base,)

    def __bool__(self) -> bool:
        _use(f"bool({self._name})")
        return False

    def __iter__(self) -> Iterator[Any]:
        _use(f"iter({self._name})")
        return iter(())

    def __getitem__(self, key: Any) -> Any:
        _use(f"{self._name}[]")
        return _Placeholder(f"{self._name}[]")

    def __enter__(self) -> Any:
        _use(f"with {self._name}")
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


def _placeholder_operator(op: str, result: Any = None) -> Callable[..., Any]:
    def method(self: _Placeholder, *args: Any) -> Any:
        _use(f"{op}({self._name})")
        return _Placeholder(f"{op}({self._name})") if result is None else result

    method.__name__ = op
    return method


_ARITHMETIC = [
    "__neg__", "__pos__", "__invert__", "__add__", "__radd__", "__sub__", "__rsub__",
    "__mul__", "__rmul__", "__truediv__", "__rtruediv__", "__floordiv__", "__mod__",
    "__pow__", "__or__", "__ror__", "__and__", "__rand__", "__xor__",
    "__lt__", "__le__", "__gt__", "__ge__",
]  # fmt: skip
for _op in _ARITHMETIC:
    setattr(_Placeholder, _op, _placeholder_operator(_op))
for _op, _value in (("__int__", 0), ("__index__", 0), ("__float__", 0.0), ("__len__", 0), ("__contains__", False)):
    setattr(_Placeholder, _op, _placeholder_operator(_op, _value))


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr == "__version__" and self.__name__ in _STUB_VERSIONS:
            return _STUB_VERSIONS[self.__name__]
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        if self.__name__ == "torch" and attr in _ABSENT_TORCH_ATTRS:
            raise AttributeError(attr)
        name = f"{self.__name__}.{attr}"
        if name in _ANSWERS:
            return _ANSWERS[name]
        if _leads_to_answer(name):
            return _Placeholder(name)
        _use(name)
        return _Placeholder(name)


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in _STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        _use(f"import {module.__name__}")


def _is_stub(value: Any) -> bool:
    return isinstance(value, (_Placeholder, _StubModule)) or (
        isinstance(value, type) and value in _PLACEHOLDER_BASES.values()
    )


def _load_server_args() -> Any:
    """Import sglang.srt.server_args from the wheel, minus sglang/__init__.py."""
    for name in _STUBBED:
        if importlib.util.find_spec(name) is not None:
            raise RuntimeError(f"{name} is installed in {sys.prefix}; the harness expects the cache venv")
    sys.meta_path.insert(0, _StubFinder())
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"sglang is not installed in {sys.prefix}; run {INSTALLER}")
    # The package object comes from its real spec (real __path__, __file__), but
    # __init__.py is not run: it imports the frontend API, torch and transformers.
    package = importlib.util.module_from_spec(spec)
    sys.modules["sglang"] = package
    from sglang.version import __version__

    if __version__ != SGLANG_VERSION:
        raise RuntimeError(f"cache venv has sglang {__version__}, expected {SGLANG_VERSION}")
    server_args = importlib.import_module("sglang.srt.server_args")
    _STATE["armed"] = True
    return server_args


def _check_parser(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        for field in ("default", "const", "type"):
            if _is_stub(getattr(action, field, None)):
                raise _StubTouched(f"{action.option_strings} has a stubbed {field}")
        for choice in action.choices or ():
            if _is_stub(choice):
                raise _StubTouched(f"{action.option_strings} has a stubbed choice")


def _jsonable(value: Any) -> Any:
    if _is_stub(value):
        raise _StubTouched(f"parsed value {value!r} comes from a stub")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_jsonable(item) for item in value), key=repr)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    enum_value = getattr(value, "value", None)
    if enum_value is not None and type(value).__module__ != "builtins":
        return _jsonable(enum_value)
    return repr(value)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(_ANSI.sub("", record.getMessage()))


def _parse_one(server_args: Any, argv: list[str]) -> dict[str, Any]:
    if "--config" in argv or any(arg.startswith("--config=") for arg in argv):
        # prepare_server_args merges a YAML file before parsing; not reproduced.
        return {"ok": False, "error": "--config is not supported by this harness", "stderr": ""}
    # Same construction as sglang.srt.server_args.prepare_server_args.
    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    _check_parser(parser)
    out, err = io.StringIO(), io.StringIO()
    collect = _Collect()
    root = logging.getLogger()
    root.addHandler(collect)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            namespace = parser.parse_args(argv)
            # The launcher builds the record right after parsing; a value the
            # record refuses would stop the pod just the same.
            server_args.ServerArgs.from_cli_args(namespace)
    except SystemExit as exit_:
        text = err.getvalue() + out.getvalue()
        prefix = f"{parser.prog}: error: "
        lines = [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]
        message = lines[-1] if lines else f"parser exited with status {exit_.code} (help or version output)"
        return {"ok": False, "error": message, "stderr": text}
    except Exception as exc:  # noqa: BLE001 - reported per argv, like the launcher's crash
        return {
            "ok": False,
            "error": f"ServerArgs.from_cli_args: {type(exc).__name__}: {exc}",
            "stderr": err.getvalue(),
        }
    finally:
        root.removeHandler(collect)
    try:
        ib_devices = _read_ib_devices(getattr(namespace, "disaggregation_ib_device", None))
    except (ValueError, RuntimeError) as exc:
        return {"ok": False, "error": f"parse_ib_device_config: {exc}", "stderr": ""}
    return {
        "ok": True,
        "args": _jsonable(vars(namespace)),
        "warnings": collect.lines,
        "ib_devices": _jsonable(ib_devices),
    }


def _flag_table(server_args: Any) -> dict[str, Any]:
    """Every option string of `sglang serve` and how many values it takes (argparse nargs: 0 for
    switches, null for exactly one), so a simulator can accept exactly SGLang's flags; and, for
    the options taking one value, what the parser accepts of it where it checks (`values`: the
    choices of a string option, or int / float), so admission can refuse what the parser would.
    Choice lists a plugin can extend (`arg_groups/choices.py`'s `add_*_choices`, e.g. attention
    backends and quantization methods) are left out: a custom build may accept more."""
    from sglang.srt.arg_groups import choices as choice_lists

    parser = argparse.ArgumentParser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    _check_parser(parser)
    extendable = {id(getattr(choice_lists, name).__self__) for name in dir(choice_lists)
                  if name.startswith("add_") and name.endswith("_choices")
                  and isinstance(getattr(getattr(choice_lists, name), "__self__", None), list)}
    flags: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        accepts: dict[str, Any] | None = None
        if action.nargs is None and action.option_strings:
            if action.choices is not None and id(action.choices) in extendable:
                pass
            elif action.choices is not None and action.type in (None, str) and all(
                    isinstance(c, str) for c in action.choices):
                accepts = {"choices": sorted(action.choices)}  # some lists are built from sets
            elif action.choices is None and action.type in (int, float):
                accepts = {"type": action.type.__name__}
        for option in action.option_strings:
            flags[option] = action.nargs
            if accepts is not None:
                values[option] = accepts
    return {"sglang_version": SGLANG_VERSION, "flags": flags, "values": values}


def _read_ib_devices(value: str | None) -> Any:
    """The device assignment SGLang's Mooncake and NIXL connectors derive from the flag.

    Loaded by server_args' own import graph; a per-GPU map it cannot read raises here as
    it would when the first transfer engine starts.
    """
    if value is None:
        return None
    from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import parse_ib_device_config

    return parse_ib_device_config(value)


_SELF_CHECK: list[tuple[list[str], str | None]] = [
    (["--model-path", "x", "--tp-size", "8", "--dcp-size", "4", "--disaggregation-mode", "decode"], None),
    (["--model-path", "x", "--cuda-graph-max-bs", "8"], "ambiguous option: --cuda-graph-max-bs"),
    (["--model-path", "x", "--prefill-round-robin-balance"], "unrecognized arguments: --prefill-round-robin-balance"),
    (["--model-path", "x", "--cp-strategy", "foo"], "argument --cp-strategy: invalid choice: 'foo'"),
]


def main(args: Sequence[str] | None = None) -> int:
    """Entry point of the subprocess; see :func:`parse_many` for the protocol."""
    cli = argparse.ArgumentParser(
        prog="python -m support.sglang_parser",
        description=f"Parse argv lists with sglang {SGLANG_VERSION}'s ServerArgs parser.",
    )
    cli.add_argument("--argv-json", type=Path, help="JSON file: a list of argv lists")
    cli.add_argument("--out", type=Path, help="write the JSON result here (default: stdout)")
    cli.add_argument("--self-check", action="store_true", help="run built-in cases; exit 1 on mismatch")
    cli.add_argument("--show-stub-uses", action="store_true", help="list stub uses made while importing")
    cli.add_argument("--dump-flags", action="store_true",
                     help="print every option of the parser with its arity, as JSON")
    opts = cli.parse_args(args)
    if not opts.self_check and not opts.dump_flags and opts.argv_json is None:
        cli.error("give --argv-json FILE, --dump-flags or --self-check")

    started = time.monotonic()
    server_args = _load_server_args()
    imported = time.monotonic()

    if opts.dump_flags:
        sys.stdout.write(json.dumps(_flag_table(server_args), indent=1, sort_keys=True) + "\n")
        return 0

    if opts.self_check:
        failures = 0
        for argv, expected in _SELF_CHECK:
            result = _parse_one(server_args, argv)
            got = None if result["ok"] else result["error"]
            good = got is None if expected is None else (got is not None and got.startswith(expected))
            failures += not good
            print(f"{'ok  ' if good else 'FAIL'} {' '.join(argv)} -> {got or 'parsed'}")
        print(f"import {imported - started:.2f}s, total {time.monotonic() - started:.2f}s")
        return 1 if failures else 0

    batch = json.loads(opts.argv_json.read_text())
    results = [_parse_one(server_args, [str(arg) for arg in argv]) for argv in batch]
    payload = {
        "sglang_version": SGLANG_VERSION,
        "import_seconds": round(imported - started, 3),
        "total_seconds": round(time.monotonic() - started, 3),
        "results": results,
    }
    if opts.show_stub_uses:
        payload["stub_uses"] = sorted(set(_STATE["touched"]))
    text = json.dumps(payload)
    if opts.out:
        opts.out.write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
