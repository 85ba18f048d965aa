"""Every shipped example plans; every invalid example fails with the message it promises."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from hybridserving.cli import main

ROOT = Path(__file__).resolve().parents[2]
VALID = sorted((ROOT / "examples").glob("*.yaml"))
INVALID = sorted((ROOT / "examples" / "invalid").glob("*.yaml"))


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def expectations(path: Path) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in path.read_text().splitlines() if line.startswith("# expect:")]


def test_examples_exist() -> None:
    assert len(VALID) >= 4 and len(INVALID) >= 8


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_example_validates_and_plans(path: Path) -> None:
    code, out = run("validate", "-f", str(path))
    assert code == 0, out
    code, out = run("plan", "-f", str(path), "-o", "json")
    assert code == 0, out
    (plan,) = json.loads(out)
    assert plan["valid"]
    for role in ("prefill", "decode"):
        r = plan["roles"][role]
        assert r["gpus"] == r["pods"] * r["gpusPerPod"]
        assert len(r["argvByNodeRank"]) == r["nodesPerInstance"]
        assert r["capacity"]["tokensPerInstance"] > 0
        for rank, argv in enumerate(r["argvByNodeRank"]):
            assert argv[argv.index("--disaggregation-mode") + 1] == role
            if r["nodesPerInstance"] > 1:
                assert argv[argv.index("--node-rank") + 1] == str(rank)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
def test_invalid_example_names_field_and_fix(path: Path) -> None:
    expected = expectations(path)
    assert expected, f"{path.name} has no '# expect:' lines"
    code, out = run("validate", "-f", str(path))
    assert code == 1
    for text in expected:
        assert text in out, f"{path.name}: expected {text!r} in:\n{out}"
    assert "fix:" in out
    code, out = run("validate", "-f", str(path), "-o", "json")
    assert code == 1
    issues = [i for doc in json.loads(out) for i in doc["issues"]]
    assert any(i["severity"] == "error" and i["fix"] for i in issues)


def test_plan_human_output_is_a_table_with_argv() -> None:
    code, out = run("plan", "-f", str(ROOT / "examples" / "kimi-k3.yaml"))
    assert code == 0
    assert "ROLE" in out and "KV TOKENS/INST" in out
    assert "python3 -m sglang.launch_server --model-path moonshotai/Kimi-K3" in out
    assert "not in place because" in out


def test_role_switch_example_switches_in_place() -> None:
    code, out = run("plan", "-f", str(ROOT / "examples" / "role-switch.yaml"), "-o", "json")
    assert code == 0
    (plan,) = json.loads(out)
    assert plan["roleSwitch"]["inPlace"] is True
    for role in ("prefill", "decode"):
        assert "--enable-pd-role-switch" in plan["roles"][role]["argvByNodeRank"][0]


def test_capacity_command_reproduces_the_published_gain() -> None:
    code, out = run("capacity", "--model", "glm-5.3", "--dcp", "8", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert round(data["gainOverDcp1"], 2) == 5.69
    assert data["bytesPerRank"]["perToken"] == pytest.approx(44_928 / 8 + 2_772)
    code, out = run("capacity", "--model", "glm-5.3", "--dcp", "8", "--index", "split")
    assert code == 0 and "5,962.5" in out


def test_transfer_plan_command_reproduces_the_published_figures() -> None:
    code, out = run("transfer-plan", "--model", "glm-5.2", "--prefill-cp", "8", "--decode-dcp", "4",
                    "--tokens", "32768", "-o", "json")
    assert code == 0
    data = json.loads(out)
    assert data["totalBytes"] == 78 * 576 * 32768
    assert data["naiveBytes"] == 4 * 78 * 576 * 32768
    code, out = run(
        "transfer-plan", "--model", "glm-5.2", "--prefill-cp", "8", "--decode-dcp", "4", "--tokens", "32768"
    )
    assert code == 0 and "0-9" in out and "75% of it discarded" in out


def test_missing_file_is_a_clear_error() -> None:
    code, out = run("validate", "-f", "/nonexistent/fleet.yaml")
    assert code == 1 and "check the path" in out


def test_a_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    latin1 = tmp_path / "fleet.yaml"
    latin1.write_bytes("# café\n".encode("latin-1") + (ROOT / "examples" / "role-switch.yaml").read_bytes())
    code, out = run("validate", "-f", str(latin1))
    assert code == 1
    assert "error: (file): not UTF-8 text: byte 0xe9 at offset 5" in out and "fix: save the file as UTF-8" in out


def test_yaml_nested_too_deeply_to_read_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / "fleet.yaml"
    deep.write_text("a: " + "[" * 20_000 + "]" * 20_000 + "\n")
    code, out = run("plan", "-f", str(deep))
    assert code == 1 and "the YAML nests too deeply to read" in out and "fix: remove the extra nesting" in out


@pytest.mark.parametrize("flag, value", [
    ("--dcp", "0"), ("--dcp", "2000"), ("--context", "0"), ("--tp", "0"), ("--gpu-memory-gib", "0"),
    ("--gpu-memory-gib", "nan"),
])
def test_capacity_flags_out_of_range_are_usage_errors_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        run("capacity", "--model", "glm-5.3", "--gpu-memory-gib", "141", "--context", "1000", flag, value)
    assert exited.value.code == 2
    error = capsys.readouterr().err.splitlines()[-1]
    assert error.startswith(f"hybridserving capacity: error: argument {flag}: {value} is out of range: use ")


def test_capacity_of_a_tp_wider_than_a_node_is_reported() -> None:
    code, out = run("capacity", "--model", "glm-5.3", "--tp", "64", "--gpu-memory-gib", "141")
    assert code == 0 and "tokens per instance (tp=64" in out
    # Wider than the model's 64 attention heads split over: no such instance (attention-heads-divisible).
    code, out = run("capacity", "--model", "glm-5.3", "--tp", "128", "--gpu-memory-gib", "141")
    assert code == 1 and out.startswith("error: --tp (decode.layout.tp): 64 attention heads do not split over 128")


@pytest.mark.parametrize("name", ["role-switch.yaml", "kimi-k3.yaml", "glm-5.3.yaml"])
def test_render_prints_every_object_the_operator_creates(name: str) -> None:
    code, out = run("render", "-f", str(ROOT / "examples" / name))
    assert code == 0, out
    objects = list(yaml.safe_load_all(out))
    kinds = {o["kind"] for o in objects}
    assert {"ConfigMap", "PodDisruptionBudget", "HybridServingInstance", "Service", "Pod"} <= kinds
    spec = yaml.safe_load((ROOT / "examples" / name).read_text())["spec"]
    instances = spec["prefill"].get("replicas", 1) + spec["decode"].get("replicas", 1)
    assert sum(o["kind"] == "HybridServingInstance" for o in objects) == instances
    pods = [o for o in objects if o["kind"] == "Pod"]
    leaders = [p for p in pods if p["metadata"]["labels"]["hybridserving.io/leader"] == "true"]
    assert len(leaders) == instances
    assert all(p["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/ready" for p in leaders)
    assert all(o["metadata"].get("uid") in (None, "") for o in objects)


def test_render_refuses_an_invalid_fleet() -> None:
    code, out = run(
        "render",
        "-f",
        str(ROOT / "examples" / "invalid" / sorted(p.name for p in (ROOT / "examples" / "invalid").glob("*.yaml"))[0]),
    )
    assert code != 0
