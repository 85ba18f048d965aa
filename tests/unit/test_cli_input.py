"""Bad input to the offline CLI: a clear error naming the flag or field and the fix, a nonzero exit,
never a traceback; and the CLI reads a manifest as the apiserver does."""

from __future__ import annotations

import http.server
import io
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes.config import incluster_config
import yaml

from hybridserving.cli import build_parser, main
from hybridserving.commands import chartvalues, cluster, status
from hybridserving.core.privileges import EnginePolicy
from hybridserving.manifests import load_text

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out), out.getvalue()


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        run(*argv)
    assert exited.value.code == 2
    return capsys.readouterr().err.splitlines()[-1]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("rows, expected, fix", [
    ("a,b\n1,2\n", "a record has no 'TIMESTAMP'", "fix: give a CSV whose header is " + AZURE.strip()),
    (AZURE + "yesterday,1,1\n", "not an Azure CSV trace: Invalid isoformat string", "fix: give a CSV whose header"),
    (AZURE, "0 request(s) over 0 s, no request rate", "fix: give a trace with at least two requests"),
    (AZURE + "2023-11-16 18:15:46.68,374,44\n", "1 request(s) over 0 s", "fix: give a trace with at least two"),
    (AZURE + "2023-11-16 18:15:46.68,-5,44\n", "line 2: ContextTokens -5 is not a whole number of tokens",
     "fix: give a CSV whose header"),
])
def test_a_csv_trace_that_does_not_replay_is_an_error_naming_the_flag(
    tmp_path: Path, rows: str, expected: str, fix: str
) -> None:
    code, out = run("simulate", "--policy", "static", "--trace", write(tmp_path, "t.csv", rows))
    assert code == 1
    assert out.startswith("error: --trace: ") and expected in out and fix in out


@pytest.mark.parametrize("line", ['{"timestamp": "x", "input_length": 1, "output_length": 1}', "not json", "[1]",
                                  '{"input_length": 1}',
                                  '{"timestamp": 0, "input_length": -100, "output_length": 1}',
                                  '{"timestamp": 0, "input_length": true, "output_length": 1}',
                                  '{"timestamp": 0, "input_length": "100", "output_length": 1}',
                                  '{"timestamp": NaN, "input_length": 1, "output_length": 1}',
                                  '{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": "abc"}'])
def test_a_jsonl_trace_that_does_not_replay_is_an_error_naming_the_flag(tmp_path: Path, line: str) -> None:
    code, out = run("simulate", "--policy", "static", "--trace", write(tmp_path, "t.jsonl", line + "\n"))
    assert code == 1
    assert out.startswith("error: --trace: ") and "fix: give one JSON object per line with timestamp" in out


def test_a_missing_trace_file_or_unknown_name_is_an_error_with_the_fix(tmp_path: Path) -> None:
    code, out = run("simulate", "--policy", "static", "--trace", str(tmp_path / "none.csv"))
    assert code == 1 and "No such file or directory" in out and "fix: check the path" in out
    code, out = run("simulate", "--policy", "static", "--trace", "mix-shfit")
    assert code == 1 and "'mix-shfit' is neither a workload" in out
    assert "fix: use one of mix-shift, diurnal, agentic, mooncake" in out


def test_a_named_workload_without_its_trace_files_says_where_they_are_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HYBRIDSERVING_TRACES", str(tmp_path))
    code, out = run("simulate", "--policy", "static", "--trace", "mooncake")
    assert code == 1
    assert f"{tmp_path}/conversation_trace.jsonl, which is missing" in out
    assert f"fix: set HYBRIDSERVING_TRACES to the directory that holds the traces (now {tmp_path})" in out


@pytest.mark.parametrize("flag, value", [
    ("--instances", "0"), ("--instances", "1"), ("--instances", "-1"), ("--instances", "1025"),
    ("--rate-scale", "0"), ("--rate-scale", "-1"), ("--rate-scale", "nan"), ("--rate-scale", "inf"),
])
def test_simulate_flags_out_of_range_are_usage_errors_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    trace = write(tmp_path, "t.csv", AZURE + "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,109\n")
    error = usage_error(capsys, "simulate", "--policy", "static", "--trace", trace, flag, value)
    assert error.startswith(f"hybridserving simulate: error: argument {flag}: {value} is out of range: use ")


def test_a_two_request_trace_simulates(tmp_path: Path) -> None:
    trace = write(tmp_path, "t.csv", AZURE + "2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:50.99,396,109\n")
    code, out = run("simulate", "--policy", "static", "--trace", trace, "--instances", "2")
    assert code == 0 and "attainment: " in out


def test_simulate_runs_at_the_named_gpus_speed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 32K-token prompt prefills in 1.7 s on the calibration B300 and 3.4 s on an H200 (2.27×
    less FP8 compute): inside the 2 s TTFT on one, outside it on the other."""
    trace = write(tmp_path, "t.csv", AZURE + "2023-11-16 18:15:46.68,32000,40\n2023-11-16 18:16:46.68,32000,40\n")
    summaries = {}
    for gpu in (None, "h200"):
        code, out = run("simulate", "--policy", "static", "--trace", trace, "--instances", "2", "-o", "json",
                        *(("--gpu", gpu) if gpu else ()))
        assert code == 0, out
        summaries[gpu] = json.loads(out)
    assert (summaries[None]["gpuType"], summaries["h200"]["gpuType"]) == ("B300", "H200")
    assert (summaries[None]["attainment"], summaries["h200"]["attainment"]) == (1.0, 0.0)
    error = usage_error(capsys, "simulate", "--policy", "static", "--trace", trace, "--gpu", "a100")
    assert error.startswith("hybridserving simulate: error: argument --gpu: invalid choice: 'A100'")


FLEET = """apiVersion: hybridserving.io/v1alpha1
kind: HybridServing
metadata: {name: t}
spec:
  model: {path: deepseek-ai/DeepSeek-V3, profile: deepseek-v3}
  prefill: {replicas: 1, layout: {tp: 8}}
  decode: {replicas: 1, layout: {tp: 8}}
"""


def test_aliases_that_expand_without_bound_are_refused_before_expanding(tmp_path: Path) -> None:
    bomb = 'a: &a ["x","x","x","x","x","x","x","x","x"]\n' + "".join(
        f"{b}: &{b} [{','.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
    )
    path = write(tmp_path, "f.yaml", bomb + FLEET + "  engine: {extraArgs: *i}\n")
    code, out = run("validate", "-f", path)
    assert code == 1
    assert "error: (document): more than 100,000 values, counting each alias (*name) as the values it repeats" in out
    assert "fix: remove the excess" in out


def test_a_document_nested_past_what_the_schema_reader_takes_is_refused_as_too_deep(tmp_path: Path) -> None:
    path = write(tmp_path, "f.yaml", FLEET + "  podTemplate: {metadata: {annotations: {a: " + "[" * 300
                 + "]" * 300 + "}}}\n")
    code, out = run("validate", "-f", path)
    assert code == 1 and "error: (document): the YAML nests too deeply to read" in out


def test_every_bad_document_of_a_file_is_named(tmp_path: Path) -> None:
    bad = FLEET.replace("tp: 8}}\n", "tp: x}}\n", 1)
    path = write(tmp_path, "f.yaml", bad + "---\n" + FLEET + "---\n" + bad)
    code, out = run("validate", "-f", path)
    assert code == 1
    assert out.startswith(f"{path} (document 1): invalid\n") and f"{path} (document 3): invalid\n" in out
    assert "(document 2)" not in out
    code, out = run("validate", "-f", path, "-o", "json")
    assert [doc["source"] for doc in json.loads(out)] == [f"{path} (document 1)", f"{path} (document 3)"]


TRANSFER = ("transfer-plan", "--model", "glm-5.2", "--prefill-cp", "8", "--decode-dcp", "4", "--tokens", "32768")


@pytest.mark.parametrize("flag, value", [
    ("--prefill-cp", "1025"), ("--decode-dcp", "1025"), ("--tokens", "10000001"), ("--page-size", "4097"),
    ("--page-size", "0"),
])
def test_transfer_plan_flags_past_the_api_bounds_are_usage_errors_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    error = usage_error(capsys, *TRANSFER, flag, value)
    assert error.startswith(f"hybridserving transfer-plan: error: argument {flag}: {value} is out of range: use ")


def test_transfer_plan_refuses_more_prefill_ranks_than_layers() -> None:
    code, out = run(*TRANSFER, "--prefill-cp", "79")
    assert code == 1
    assert out == ("error: --prefill-cp: 79 ranks split glm-5.2's 78 layers, leaving ranks with none\n"
                   "  fix: use at most 78\n")
    code, out = run(*TRANSFER, "--prefill-cp", "78")
    assert code == 0 and "77-77" in out


def test_transfer_plan_refuses_more_pages_than_it_lists() -> None:
    code, out = run(*TRANSFER, "--tokens", "10000000", "--page-size", "1", "--decode-dcp", "1024")
    assert code == 1
    assert "error: --tokens: 10,000,000 tokens are 10,000,000 pages of 1, more than the 200,000 one plan lists" in out
    assert "fix: raise --page-size to at least 50 or lower --tokens" in out


def test_transfer_plan_of_a_model_with_non_mla_layers_names_the_models_it_applies_to() -> None:
    code, out = run("transfer-plan", "--model", "kimi-k3", "--prefill-cp", "8", "--decode-dcp", "4", "--tokens", "9")
    assert code == 1 and out.startswith("error: --model: the 2D reshard splits layers")
    assert "fix: use a model whose every layer is MLA: " in out and "glm-5.2" in out


def namespaces(out: str) -> set[str]:
    return {o["metadata"]["namespace"] for o in yaml.safe_load_all(out)}


def test_render_puts_a_manifest_that_names_no_namespace_in_the_one_given_with_n(tmp_path: Path) -> None:
    path = write(tmp_path, "f.yaml", FLEET)
    code, out = run("render", "-f", path, "-n", "team-a")
    assert code == 0 and namespaces(out) == {"team-a"}
    code, out = run("render", "-f", path)
    assert code == 0 and namespaces(out) == {"default"}


def test_render_keeps_the_manifests_namespace_and_refuses_a_different_n(tmp_path: Path) -> None:
    path = write(tmp_path, "f.yaml", FLEET.replace("{name: t}", "{name: t, namespace: prod}"))
    code, out = run("render", "-f", path)
    assert code == 0 and namespaces(out) == {"prod"}
    code, out = run("render", "-f", path, "-n", "prod")
    assert code == 0 and namespaces(out) == {"prod"}
    code, out = run("render", "-f", path, "-n", "team-a")
    assert code == 1 and "metadata.namespace is 'prod' but -n is 'team-a'" in out and "fix: pass -n prod" in out


def test_render_refuses_a_namespace_the_apiserver_would(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    error = usage_error(capsys, "render", "-f", write(tmp_path, "f.yaml", FLEET), "-n", "Team_A")
    assert "argument -n/--namespace: 'Team_A' is not a namespace name" in error


class _Apiserver(http.server.BaseHTTPRequestHandler):
    """Answers as an apiserver without the fleet asked for: 404 for the named object, and for the
    collection when the path says the CRD is missing."""

    def do_GET(self) -> None:
        missing = 'hybridservings.hybridserving.io "nope" not found'
        message = "the server could not find the requested resource" if "nocrd" in self.path else missing
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                           "reason": "NotFound", "code": 404}).encode()
        self.send_response(404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def kubeconfig(tmp_path: Path, port: int) -> str:
    return write(tmp_path, "kubeconfig", f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: u, user: {{token: x}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[str]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Apiserver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield kubeconfig(tmp_path, server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("command", ["status", "rollback", "upgrade-check"])
def test_a_fleet_that_is_not_there_is_an_error_naming_it_and_the_namespace(apiserver: str, command: str) -> None:
    code, out = run(command, "nope", "-n", "team-a", "--kubeconfig", apiserver)
    assert code == 1
    assert out == ("error: HybridServing nope not found in namespace team-a\n"
                   "  fix: check the name and -n; `kubectl get hybridservings -n team-a` lists them\n")


def test_a_refused_write_names_the_refusal_and_a_fix_that_is_not_to_try_again() -> None:
    from kubernetes.client.exceptions import ApiException

    refused = ApiException(status=422, reason="Unprocessable Entity")
    said = ('admission webhook "update.hybridserving.io" denied the request: '
            "spec.network.hostNetwork: this operator is installed without host networking")
    refused.body = json.dumps({"message": said})
    explained = cluster.explain(refused, "t", "team-a")
    assert explained is not None
    assert str(explained.message).startswith("the cluster refused the spec written (422 Unprocessable Entity): "
                                             'admission webhook "update.hybridserving.io" denied the request')
    assert "pick another revision with --to-revision" in explained.fix and "run the command again" not in explained.fix


@pytest.mark.parametrize("command", ["status", "rollback", "upgrade-check"])
def test_without_n_the_namespace_is_the_kubeconfig_contexts_as_for_kubectl(apiserver: str, command: str) -> None:
    Path(apiserver).write_text(Path(apiserver).read_text().replace("{cluster: c, user: u}",
                                                                   "{cluster: c, user: u, namespace: team-b}"))
    code, out = run(command, "nope", "--kubeconfig", apiserver)
    assert (code, out.splitlines()[0]) == (1, "error: HybridServing nope not found in namespace team-b"), out


def test_the_default_namespace_is_the_contexts_the_pods_or_default(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = kubeconfig(tmp_path, 1)
    assert cluster.default_namespace(config) == "default", "a context without one"
    assert cluster.default_namespace(str(tmp_path / "none")) == "default", "the request says what is missing"
    assert cluster.default_namespace(write(tmp_path, "bad", "contexts: [unclosed")) == "default"
    Path(config).write_text(Path(config).read_text().replace("user: u}", "user: u, namespace: team-b}"))
    assert cluster.default_namespace(config) == "team-b"
    args = build_parser().parse_args(["status", "-n", "team-a", "--kubeconfig", config])
    assert cluster.with_namespace(args).namespace == "team-a", "-n wins"

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setattr(cluster, "SERVICE_ACCOUNT_NAMESPACE", write(tmp_path, "namespace", "serving\n"))
    assert cluster.default_namespace(None) == "serving", "in a pod, the pod's"
    monkeypatch.setattr(cluster, "SERVICE_ACCOUNT_NAMESPACE", str(tmp_path / "not-mounted"))
    assert cluster.default_namespace(None) == "default"


@pytest.mark.parametrize("command", ["status", "upgrade-check"])
def test_a_cluster_without_the_crd_is_an_error_saying_to_install_it(apiserver: str, command: str) -> None:
    code, out = run(command, "-n", "nocrd", "--kubeconfig", apiserver)
    assert code == 1
    assert "error: the cluster does not serve HybridServings: the server could not find the requested resource" in out
    assert "fix: install the operator's chart" in out


@pytest.mark.parametrize("command", [("status",), ("rollback", "t"), ("upgrade-check", "-A")])
def test_a_cluster_that_does_not_answer_is_an_error_with_the_fix(tmp_path: Path, command: tuple[str, ...]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    code, out = run(*command, "--kubeconfig", kubeconfig(tmp_path, port))
    assert code == 1
    assert out.startswith("error: cannot reach the cluster: ") and "Connection refused" in out
    assert "fix: check the cluster is up" in out


@pytest.mark.parametrize("command", [("status",), ("rollback", "t"), ("upgrade-check",)])
def test_a_missing_kubeconfig_is_an_error_naming_the_flag(tmp_path: Path, command: tuple[str, ...]) -> None:
    code, out = run(*command, "--kubeconfig", str(tmp_path / "none"))
    assert code == 1
    assert out.startswith(f"error: cannot load the kubeconfig from {tmp_path / 'none'}: ")
    assert "fix: pass --kubeconfig with the cluster's kubeconfig, or set KUBECONFIG" in out


@pytest.mark.parametrize(("text", "said"), [
    ("contexts: [unclosed", "not YAML: while parsing a flow sequence in "),
    ("just words", "not a kubeconfig: a YAML mapping of clusters, users, contexts and current-context"),
    ("contexts: 5\ncurrent-context: c\n", "not a kubeconfig: a YAML mapping of clusters, users, contexts and "),
])
def test_a_kubeconfig_that_is_not_one_is_an_error_naming_the_file(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, "kubeconfig", text)
    code, out = run("status", "--kubeconfig", path)
    assert code == 1 and out.startswith(f"error: cannot load the kubeconfig from {path}: {said}"), out
    assert len(out.splitlines()) == 2 and out.splitlines()[1] == (
        "  fix: pass --kubeconfig with the cluster's kubeconfig, or set KUBECONFIG"), out


def exec_kubeconfig(tmp_path: Path, command: str) -> str:
    """A kubeconfig whose user's credentials come from a plugin (`users[].user.exec`), as on EKS or GKE."""
    return write(tmp_path, "kubeconfig", f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:1"}}}}]
users: [{{name: u, user: {{exec: {{apiVersion: client.authentication.k8s.io/v1, command: {command}}}}}}}]
contexts: [{{name: c, context: {{cluster: c, user: u}}}}]
current-context: c
""")


@pytest.mark.parametrize("command", [("status",), ("rollback", "t"), ("upgrade-check",)])
def test_a_credential_plugin_not_installed_is_named_before_any_request(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    """The client only logs the plugin's failure and sends no credentials: the 401 that follows names nothing."""
    code, out = run(*command, "--kubeconfig", exec_kubeconfig(tmp_path, "no-such-auth-plugin"))
    assert code == 1
    assert out == (f"error: the kubeconfig from {tmp_path / 'kubeconfig'} gets its credentials from the plugin "
                   "no-such-auth-plugin, which failed: [Errno 2] No such file or directory: 'no-such-auth-plugin'\n"
                   "  fix: install no-such-auth-plugin where PATH finds it (kubectl needs it too), or pass another "
                   "--kubeconfig\n"), out


def test_a_credential_plugin_that_fails_is_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plugin = tmp_path / "auth-plugin"
    plugin.write_text("#!/bin/sh\necho 'the SSO session has expired' >&2\nexit 1\n")
    plugin.chmod(0o755)
    code, out = run("status", "--kubeconfig", exec_kubeconfig(tmp_path, str(plugin)))
    assert code == 1
    assert out.startswith(f"error: the kubeconfig from {tmp_path / 'kubeconfig'} gets its credentials from the plugin "
                          f"{plugin}, which failed: exec: process returned 1. the SSO session has expired\n"), out
    assert out.endswith(f"  fix: run {plugin} by hand (or log in again with its tool) to see why, then try again\n")
    assert "SSO" not in capsys.readouterr().err, "said once, in the command's error"


def test_in_a_pod_without_a_kubeconfig_the_service_account_is_used_and_its_absence_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(tmp_path / "no-token"))  # none mounted
    code, out = run("upgrade-check", "-A")
    assert code == 1 and out.startswith("error: cannot use the pod's service account: "), out
    assert "fix: mount its token (automountServiceAccountToken), or pass --kubeconfig" in out


@pytest.mark.parametrize(("text", "said"), [
    ("enginePolicy: {allowHostNetwork: [unclosed", "  error: line 1, column 43: malformed YAML: "),
    ("- a\n- b\n", "  error: (document): not a values file: one YAML mapping of chart values is expected\n"),
    ("enginePolicy: {allowHostNetwork: 'yes'}", "  error: enginePolicy.allowHostNetwork: Input should be a valid "
                                                 "boolean\n         fix: write true or false without quotes\n"),
    ("enginePolicy: {allowHostNetwrk: true}", "  error: enginePolicy.allowHostNetwrk: Extra inputs are not permitted"
                                               "\n         fix: remove the field or check its spelling"),
    ("engineImage: {digest: latest}", "  error: engineImage.digest: String should match pattern "),
    ("enginePolicy: {allowedImages: ['']}", "  error: enginePolicy.allowedImages[0]: String should have at least 1"),
    ("engineImage: {tag: null}", "  error: engineImage.tag: set to null, which removes the chart's default, and the "
                                 "chart needs a value\n         fix: give a value, or leave the key out to keep the "
                                 "chart's default\n"),
    (FLEET, "  error: (document): a Kubernetes object (kind: HybridServing), not a values file\n"
            "         fix: give the chart's values"),
])
def test_upgrade_check_values_that_do_not_do_are_errors_naming_the_field_before_any_request(
        tmp_path: Path, text: str, said: str) -> None:
    """Read before the cluster is asked anything: no kubeconfig is needed to be told."""
    path = write(tmp_path, "values.yaml", text)
    code, out = run("upgrade-check", "--values", path, "--kubeconfig", str(tmp_path / "none"))
    assert code == 1 and out.startswith(f"{path}: invalid\n{said}"), out


def test_validate_with_the_operators_values_checks_what_they_grant(tmp_path: Path) -> None:
    """A GitOps pipeline's check before merge: the default image a fleet would run is judged
    against `allowedImages`, and host networking against what the values grant."""
    fleet = write(tmp_path, "f.yaml", FLEET + "  network: {hostNetwork: true}\n")
    assert run("validate", "-f", fleet)[0] == 0, "without values the grants are the cluster's to judge"
    values = write(tmp_path, "values.yaml", "engineImage: {repository: registry.example/engine, tag: v1}\n"
                                            "enginePolicy: {allowHostNetwork: false, allowIpcLock: true, "
                                            "allowedImages: [registry.example/, lightseekorg/]}\n")
    code, out = run("validate", "-f", fleet, "--values", values)
    assert code == 1 and "error: spec.network.hostNetwork: this operator is installed without host networking" in out
    assert "image 'registry.example/engine:v1'" not in out, "the values' default image is allowed"
    narrower = write(tmp_path, "narrower.yaml", "enginePolicy: {allowedImages: [registry.example/]}\n")
    code, out = run("validate", "-f", fleet, "--values", values, "--values", narrower)
    assert code == 1 and "error: spec.router.image: image 'lightseekorg/smg:" in out, out
    bad = write(tmp_path, "bad.yaml", "enginePolicy: []\n")
    code, out = run("validate", "-f", fleet, "--values", bad)
    assert code == 1 and out.startswith(f"{bad}: invalid\n  error: enginePolicy: "), out
    code, out = run("validate", "-f", fleet, "--values", bad, "-o", "json")
    [document] = json.loads(out)
    assert (code, document["source"], document["valid"], document["issues"][0]["path"]) == (
        1, bad, False, "enginePolicy"), out


def test_upgrade_check_values_merge_as_helm_merges_them(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "engineImage: {repository: registry.example/engine, tag: a}\n"
                                      "enginePolicy: {allowIpcLock: true, allowedImages: [registry.example/]}\n"
                                      "replicaCount: 2\n")
    second = write(tmp_path, "b.yaml", "engineImage: {tag: b}\nenginePolicy: {allowedImages: [mirror.example/]}\n")
    assert chartvalues.read([first, second]).policy() == EnginePolicy(
        allow_ipc_lock=True, allowed_images=("mirror.example/",), default_image="registry.example/engine:b")
    assert chartvalues.read([write(tmp_path, "c.yaml", "")]).policy() == EnginePolicy(), "the chart's defaults"


@pytest.mark.parametrize("command", ["upgrade-check", "status"])
def test_one_fleet_in_every_namespace_is_an_error_with_the_fix(command: str) -> None:
    code, out = run(command, "t", "-A")
    assert (code, out) == (1, "error: a fleet name needs its namespace\n  fix: give -n NAMESPACE instead of -A\n")


def test_status_switches_0_shows_none_and_a_negative_count_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    switch = {"instance": "t-0", "fromRole": "decode", "toRole": "prefill", "mode": "in-place",
              "outcome": "done", "started": "2026-01-01T00:00:00Z", "reason": "prefill queue"}
    hs = {"metadata": {"name": "t", "uid": "u"}, "status": {"switches": [switch] * 3}}
    shown = io.StringIO()
    status.render(hs, [], shown, switches=0)
    assert "t-0" not in shown.getvalue() and "no role switches yet" not in shown.getvalue()
    status.render(hs, [], shown, switches=2)
    assert shown.getvalue().count("t-0") == 2
    error = usage_error(capsys, "status", "--switches", "-1")
    assert "argument --switches: -1 is out of range: use a whole number of at least 0" in error


def validate(tmp_path: Path, text: str) -> tuple[int, str]:
    return run("validate", "-f", write(tmp_path, "f.yaml", text))


@pytest.mark.parametrize("switch", ["", "  roleSwitch: {enabled: true, minPrefill: 3, minDecode: 3}\n"])
def test_scaling_bounds_that_cannot_hold_are_refused_whatever_else_is_set(tmp_path: Path, switch: str) -> None:
    code, out = validate(tmp_path, FLEET + switch + "  scaling: {minReplicas: 5, maxReplicas: 4}\n")
    assert code == 1
    assert "error: spec.scaling.minReplicas: scaling.minReplicas 5 is above scaling.maxReplicas 4" in out


def test_role_floors_are_checked_against_spec_replicas_when_it_is_set(tmp_path: Path) -> None:
    switch = "  roleSwitch: {enabled: true, minPrefill: 2, minDecode: 2}\n"
    code, out = validate(tmp_path, FLEET + switch + "  replicas: 4\n")
    assert code == 0, out
    code, out = validate(tmp_path, FLEET + switch + "  replicas: 3\n")
    assert code == 1 and "minPrefill 2 + minDecode 2 exceed the fleet's 3 instances" in out


def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    code, out = validate(tmp_path, FLEET + "  decode: {replicas: 1, layout: {tp: 8, dcp: 3}}\n")
    assert code == 1
    assert "error: line 8, column 3: malformed YAML: key 'decode' already set in this mapping at line 7" in out
    assert "fix: remove one of the two" in out
    code, out = validate(tmp_path, FLEET.replace("{tp: 8}", "{tp: 8, tp: 4}", 1))
    assert code == 1 and "key 'tp' already set in this mapping at line 6" in out


def test_a_merge_key_may_be_overridden(tmp_path: Path) -> None:
    text = FLEET.replace("  prefill: {replicas: 1, layout: {tp: 8}}\n",
                         "  prefill: &role {replicas: 1, layout: {tp: 8}}\n")
    text = text.replace("  decode: {replicas: 1, layout: {tp: 8}}\n", "  decode:\n    <<: *role\n    replicas: 2\n")
    code, out = validate(tmp_path, text)
    assert code == 0, out


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_a_number_json_cannot_carry_is_refused_naming_the_field(tmp_path: Path, value: str) -> None:
    code, out = validate(tmp_path, FLEET + f"  hardware: {{gpuMemoryGib: {value}}}\n")
    assert code == 1
    assert "error: spec.hardware.gpuMemoryGib: " in out and "is not a number JSON can carry" in out
    assert "fix: write a finite number" in out


def test_null_is_what_leaving_the_field_out_is(tmp_path: Path) -> None:
    nulls = FLEET.replace("metadata: {name: t}", "metadata: {name: t, labels: null}") + (
        "  hardware:\n  engine: {extraArgs: null}\n")
    code, out = validate(tmp_path, nulls)
    assert code == 0, out
    code, out = validate(tmp_path, FLEET.replace("  decode: {replicas: 1, layout: {tp: 8}}\n", "  decode: null\n"))
    assert code == 1 and "error: spec.decode: Field required" in out


def test_a_pod_templates_nulls_are_kept_where_the_apiserver_keeps_them(tmp_path: Path) -> None:
    """The CRD marks a pod spec's typed keys nullable and keeps its unknown keys, so the apiserver stores
    those nulls for the webhook to judge; it prunes the null of a key that is not nullable, such as an
    owned field's or a label's."""
    template = ("  podTemplate:\n    metadata: {labels: {team: null}}\n"
                "    spec: {hostAliases: null, hostNetwork: null, containers: [{name: s, image: x, ports: null}]}\n")
    code, out = validate(tmp_path, FLEET + template)
    assert code == 1 and out.count("error: ") == 1, out
    assert "error: spec.podTemplate.spec.containers[0].ports: remove the key: null would replace any" in out
    (hs,) = load_text(FLEET + template.replace(", ports: null", ""))
    assert hs.spec.pod_template is not None and hs.spec.pod_template.metadata.labels == {}
    assert hs.spec.pod_template.spec == {"hostAliases": None, "containers": [{"name": "s", "image": "x"}]}


def test_a_capability_given_twice_is_refused_as_by_the_apiserver(tmp_path: Path) -> None:
    code, out = validate(tmp_path, FLEET + "  engine: {capabilities: [dsa-dcp-pd, dsa-dcp-pd]}\n")
    assert code == 1
    assert 'error: spec.engine.capabilities[1]: Duplicate value: "dsa-dcp-pd"' in out and "fix: give each value" in out


def test_file_dash_reads_standard_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(FLEET.replace("tp: 8}}\n", "tp: x}}\n", 1).encode())))
    code, out = run("validate", "-f", "-")
    assert code == 1 and out.startswith("<stdin>: invalid\n") and "spec.prefill.layout.tp" in out
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(FLEET.encode())))
    assert run("validate", "-f", "-") == (0, "t: valid\n")


@pytest.mark.parametrize("command", ["validate", "plan"])
def test_json_output_is_a_list_of_fleets_whether_or_not_the_file_loads(tmp_path: Path, command: str) -> None:
    code, out = run(command, "-f", write(tmp_path, "good.yaml", FLEET), "-o", "json")
    assert code == 0 and isinstance(json.loads(out), list)
    code, out = run(command, "-f", write(tmp_path, "bad.yaml", FLEET.replace("tp: 8}}", "tp: x}}", 1)), "-o", "json")
    (doc,) = json.loads(out)
    assert code == 1 and doc["valid"] is False and doc["issues"][0]["path"] == "spec.prefill.layout.tp"


def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback() -> None:
    fleet = str(Path(__file__).resolve().parents[2] / "examples" / "kimi-k3.yaml")
    rendered = subprocess.Popen([sys.executable, "-m", "hybridserving.cli", "render", "-f", fleet],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert rendered.stdout is not None and rendered.stderr is not None
    rendered.stdout.close()  # as `| head` does once it has its lines
    assert rendered.stderr.read() == b""
    assert rendered.wait() == 141  # as a writer that SIGPIPE ended


@pytest.mark.parametrize("namespace", ["Bad_NS!", "a" * 64, "-a"])
def test_a_namespace_the_apiserver_refuses_is_refused(tmp_path: Path, namespace: str) -> None:
    code, out = validate(tmp_path, FLEET.replace("{name: t}", f"{{name: t, namespace: '{namespace}'}}"))
    assert code == 1 and "error: metadata.namespace: must have at most 63 lowercase letters" in out
    code, out = validate(tmp_path, FLEET.replace("{name: t}", f"{{name: t, namespace: {'a' * 63}}}"))
    assert code == 0, out


def test_capacity_on_a_gpu_too_small_names_the_flag_and_the_least_memory() -> None:
    code, out = run("capacity", "--model", "glm-5.3", "--gpu-memory-gib", "5", "--tp", "8")
    assert code == 1
    assert out.startswith("error: --gpu-memory-gib (hardware.gpuMemoryGib): 5.0 GiB per GPU is too little for decode")
    least = out.split("at least ")[1].split()[0]
    assert run("capacity", "--model", "glm-5.3", "--gpu-memory-gib", least, "--tp", "8")[0] == 0


def test_timestamps_and_binary_read_as_the_text_kubectl_sends(tmp_path: Path) -> None:
    """go-yaml, kubectl's reader, hands an untyped timestamp on as the text it was written as: a
    date as an annotation key or value is that text (PyYAML's date broke the JSON step with a
    traceback), and `!!binary` is its decoded text."""
    fleet = FLEET + ("  podTemplate: {metadata: {annotations: {2024-01-01: 2024-01-02 03:04:05}}}\n"
                     "  engine: {extraArgs: [--log-level, !!binary ZGVidWc=]}\n")
    [hs] = load_text(fleet)
    assert hs.spec.pod_template is not None
    assert hs.spec.pod_template.metadata.annotations == {"2024-01-01": "2024-01-02 03:04:05"}
    assert hs.spec.engine.extra_args[-1] == "debug"
    code, out = run("validate", "-f", write(tmp_path, "f.yaml", fleet))
    assert code == 0, out


def test_control_characters_in_what_the_cli_prints_are_escaped(tmp_path: Path) -> None:
    """A hostile key reaches the output in a field path: the terminal must show it, not act on it."""
    path = write(tmp_path, "f.yaml", FLEET + '  "\\e]0;owned\\a\\e[2J": 1\n')
    code, out = run("validate", "-f", path)
    assert code == 1 and "\x1b" not in out and "\x07" not in out
    assert "error: spec.\\x1b]0;owned\\x07\\x1b[2J: Extra inputs are not permitted" in out
    code, out = run("validate", "-f", path, "-o", "json")
    assert json.loads(out)[0]["issues"][0]["path"] == "spec.\x1b]0;owned\x07\x1b[2J"


def test_an_object_kubectl_would_refuse_is_an_error_not_a_fleet_left_out(tmp_path: Path) -> None:
    code, out = run("validate", "-f", write(tmp_path, "a.yaml", FLEET.replace("apiVersion: hybridserving.io/v1alpha1\n",
                                                                               "")))
    assert code == 1 and "error: apiVersion: not set: kubectl refuses an object without it" in out
    assert "fix: set apiVersion: hybridserving.io/v1alpha1" in out
    near = FLEET.replace("kind: HybridServing", "kind: Hybridserving")
    code, out = run("validate", "-f", write(tmp_path, "b.yaml", FLEET + "---\n" + near + "---\nfoo: bar\n"))
    assert code == 1, out
    assert "(document 2): invalid\n  error: kind: 'Hybridserving' is not a kind hybridserving.io serves" in out
    assert "(document 3): invalid\n  error: kind: not set: kubectl refuses an object without it" in out
    other = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
    code, out = run("validate", "-f", write(tmp_path, "c.yaml", other + "---\n" + FLEET))
    assert code == 0 and "t: valid" in out, "another kind beside a fleet is kubectl's to judge"


def test_the_same_fleet_twice_in_one_file_is_an_error_naming_both_places(tmp_path: Path) -> None:
    """kubectl apply would apply both, the last one winning: one of them is a mistake."""
    copy = FLEET.replace("replicas: 1, layout: {tp: 8}}\n  decode", "replicas: 2, layout: {tp: 8}}\n  decode")
    path = write(tmp_path, "twice.yaml", FLEET + "---\n" + copy)
    for command in ("validate", "render"):
        code, out = run(command, "-f", path)
        assert code == 1, out
        assert ("(document 2): invalid\n  error: metadata.name: fleet 't' in namespace 'default' is already defined in "
                f"{path} (document 1): kubectl apply would keep only the last one") in out, out
    elsewhere = FLEET.replace("metadata: {name: t}", "metadata: {name: t, namespace: other}")
    code, out = run("validate", "-f", write(tmp_path, "two.yaml", FLEET + "---\n" + elsewhere))
    assert code == 0, "one name in two namespaces is two fleets"


@pytest.mark.parametrize("kind", ["List", "HybridServingList"])
def test_a_list_of_fleets_is_read_item_by_item(tmp_path: Path, kind: str) -> None:
    """What `kubectl get hs -o yaml` writes: every item is a fleet, and an error names its item."""
    fleet = yaml.safe_load(FLEET)
    broken = yaml.safe_load(FLEET.replace("name: t", "name: u").replace("tp: 8}}\n  decode", "tp: 0}}\n  decode"))
    listed = {"apiVersion": "v1", "kind": kind, "items": [fleet, broken]}
    code, out = run("validate", "-f", write(tmp_path, "l.yaml", yaml.safe_dump(listed)))
    assert code == 1 and "l.yaml (item 1): invalid\n  error: spec.prefill.layout.tp" in out, out
    listed["items"] = [fleet]
    code, out = run("validate", "-f", write(tmp_path, "l.yaml", yaml.safe_dump(listed)))
    assert code == 0 and "t: valid" in out


@pytest.mark.parametrize("argv", [["validate", "-f", "-", "--values", "-"],
                                  ["upgrade-check", "--values", "-", "--values", "-"]])
def test_standard_input_named_twice_is_an_error_not_an_empty_file(argv: list[str]) -> None:
    code, out = run(*argv)
    assert code == 1 and out == ("<stdin>: invalid\n  error: (file): standard input (-) is named twice, and it can "
                                 "be read only once\n         fix: give all but one of them as files\n"), out


def test_a_replay_beyond_what_one_run_holds_is_refused_before_it_starts(tmp_path: Path) -> None:
    """Such runs took minutes and gigabytes, or never ended, instead of an answer."""
    def record(t: float, prompt: int = 100, output: int = 10) -> str:
        return json.dumps({"timestamp": t, "input_length": prompt, "output_length": output}) + "\n"

    trace = write(tmp_path, "t.jsonl", record(0) + record(1000))
    code, out = run("simulate", "--policy", "static", "--trace", trace, "--rate-scale", "1e300")
    assert code == 1 and out.startswith("error: --rate-scale: 1e+300x the trace's 2 requests is up to ")
    assert "fix: lower --rate-scale to at most 1000000, or give a shorter trace" in out
    span = write(tmp_path, "span.jsonl", record(0) + record(1e18))
    code, out = run("simulate", "--policy", "static", "--trace", span)
    assert code == 1 and "one run replays at most 7" in out and "fix: give a shorter part of the trace" in out
    code, out = run("simulate", "--policy", "static", "--trace",
                    write(tmp_path, "huge.jsonl", record(0, prompt=10**15) + record(1000)))
    assert code == 1 and "a request of 1,000,000,000,000,000 tokens, beyond any model's context" in out


def test_a_plot_is_a_png_of_one_run_or_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    for target in ("x.txt", str(tmp_path)):
        error = usage_error(capsys, "simulate", "--policy", "static", "--trace", "mooncake", "--plot", target)
        assert f"argument --plot: '{target}' does not end in .png" in error
    trace = write(tmp_path, "t.jsonl", "".join(json.dumps({"timestamp": t, "input_length": 100, "output_length": 10})
                                               + "\n" for t in (0, 1000)))
    code, out = run("simulate", "--policy", "per-window", "--trace", trace, "--plot", str(tmp_path / "p.png"))
    assert code == 1 and out.startswith("error: --plot: per-window scores each window as its own split")
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("argv", [
    ["capacity", "--model", "deepseek-v3", "--dcp", "3"],
    ["transfer-plan", "--model", "kimi-k3", "--prefill-cp", "2", "--decode-dcp", "2", "--tokens", "10"],
    ["simulate", "--trace", "nope", "--policy", "static"],
])
def test_a_flag_that_does_not_do_is_a_json_error_with_o_json(argv: list[str]) -> None:
    code, text = run(*argv)
    assert code == 1 and text.startswith("error: --"), text
    code, out = run(*argv, "-o", "json")
    error = json.loads(out)["error"]
    assert code == 1 and text == f"error: {error['path']}: {error['message']}\n  fix: {error['fix']}\n"


def test_capacity_refuses_a_dcp_whose_tp_the_models_heads_do_not_split_over() -> None:
    """Without the hardware the TP is the DCP's; 3 or 1024 ranks cannot hold 128 heads, so no capacity exists."""
    for dcp in ("3", "1024"):
        code, out = run("capacity", "--model", "deepseek-v3", "--dcp", dcp)
        assert code == 1 and out.startswith(f"error: --dcp (decode.layout.tp): 128 attention heads do not split over "
                                            f"{dcp} attention TP ranks"), out
    assert run("capacity", "--model", "deepseek-v3", "--dcp", "8")[0] == 0


def _keys(value: object) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    if isinstance(value, list):
        return {k for v in value for k in _keys(v)}
    return set()


def test_every_offline_commands_json_has_camel_case_keys(tmp_path: Path) -> None:
    """The CLI's promise for `-o json` (cli.py): camelCase keys, only ever added to."""
    fleet = write(tmp_path, "f.yaml", FLEET)
    trace = write(tmp_path, "t.jsonl", "".join(json.dumps({"timestamp": t * 500, "input_length": 200,
                                                           "output_length": 20}) + "\n" for t in range(40)))
    commands = [["validate", "-f", fleet], ["plan", "-f", fleet],
                ["capacity", "--model", "glm-5.3", "--dcp", "8", "--gpu-memory-gib", "141", "--context", "100000"],
                ["transfer-plan", "--model", "glm-5.2", "--prefill-cp", "8", "--decode-dcp", "4", "--tokens", "4096"],
                ["simulate", "--trace", trace, "--policy", "ours"]]
    for argv in commands:
        code, out = run(*argv, "-o", "json")
        assert code == 0, (argv, out)
        keys = _keys(json.loads(out))
        assert keys and not {k for k in keys if "_" in k or k[:1].isupper()}, (argv, keys)


@pytest.mark.parametrize("metadata, expected", [
    ("{name: t, labels: {team: 'ml infra'}}", "error: metadata.labels: the value of label 'team': 'ml infra' must be"),
    ("{name: t, labels: {'a/b/c': x}}", "error: metadata.labels: label key 'a/b/c' must be"),
    ("{name: t, labels: {team: " + "x" * 64 + "}}", "error: metadata.labels: the value of label 'team'"),
    ("{name: t, annotations: {'note to self': x}}", "error: metadata.annotations: annotation key 'note to self'"),
    ("{name: t, annotations: {big: " + "x" * (256 * 1024) + "}}",
     "error: metadata.annotations: take 262147 bytes, keys and values together; the apiserver takes at most 262144"),
])
def test_a_fleets_own_labels_and_annotations_are_checked_as_the_apiserver_checks_them(
    tmp_path: Path, metadata: str, expected: str
) -> None:
    code, out = validate(tmp_path, FLEET.replace("metadata: {name: t}", f"metadata: {metadata}"))
    assert code == 1 and expected in out, out


def test_labels_and_annotations_the_apiserver_takes_pass(tmp_path: Path) -> None:
    metadata = ("{name: t, labels: {team: ml-infra, example.com/tier: '', app.kubernetes.io/part-of: serving}, "
                "annotations: {Example.COM/owner: 'anyone, any text', argocd.argoproj.io/sync-wave: '2'}}")
    code, out = validate(tmp_path, FLEET.replace("metadata: {name: t}", f"metadata: {metadata}"))
    assert code == 0, out


TIMED_OUT = ("error: cannot reach the cluster: no answer within 1 s (--request-timeout)\n"
             "  fix: check the cluster is up and the kubeconfig's server and context (kubectl cluster-info); "
             "on a slow cluster, give it longer with --request-timeout\n")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [("status",), ("status", "t", "-n", "a"), ("upgrade-check", "-A"),
                                     ("rollback", "t", "-n", "a")])
def test_a_cluster_that_takes_the_connection_and_never_answers_is_an_error_within_the_timeout(
        tmp_path: Path, command: tuple[str, ...]) -> None:
    """A wedged apiserver, or a load balancer with no backend left: the connection opens, no answer
    comes. Each request is one attempt, so the wait is the flag's, not the client's retries times it."""
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never accepts: the kernel connects
        config = kubeconfig(tmp_path, silent.getsockname()[1])
        started = time.monotonic()
        code, out = run(*command, "--request-timeout", "1", "--kubeconfig", config)
        waited = time.monotonic() - started
    assert (code, out) == (1, TIMED_OUT)
    assert waited < 3.5, f"{waited:.1f} s"


@pytest.mark.parametrize(("given", "seconds"), [("45", 45.0), ("2.5", 2.5), ("30s", 30.0), ("2m", 120.0),
                                                ("1h", 3600.0)])
def test_the_request_timeout_is_seconds_or_a_kubectl_duration(given: str, seconds: float) -> None:
    assert build_parser().parse_args(["status"]).request_timeout == cluster.DEFAULT_REQUEST_TIMEOUT == 30
    for command in (["status"], ["upgrade-check"], ["rollback", "t"]):
        assert build_parser().parse_args([*command, "--request-timeout", given]).request_timeout == seconds


@pytest.mark.parametrize(("given", "said"), [
    ("0", "0 is out of range: use more than 0 seconds and at most a day"),
    ("-1s", "-1s is out of range"),
    ("2d", "'2d' is not a duration: use seconds, or 30s, 2m, 1h"),
    ("inf", "inf is out of range"),
    ("nan", "nan is out of range"),
])
def test_a_request_timeout_that_does_not_do_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], given: str, said: str) -> None:
    error = usage_error(capsys, "upgrade-check", f"--request-timeout={given}")
    assert f"argument --request-timeout: {said}" in error, error


class _Recording(_Apiserver):
    """`_Apiserver`, keeping the paths it was asked for, to tell which cluster a command reached."""

    def do_GET(self) -> None:
        self.server.asked.append(self.path)  # type: ignore[attr-defined]
        super().do_GET()


@pytest.fixture
def two_clusters(tmp_path: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """A kubeconfig whose current context `a` (namespace team-a) and context `b` (team-b) point at two
    fake apiservers, with what each was asked."""
    servers = [http.server.HTTPServer(("127.0.0.1", 0), _Recording) for _ in "ab"]
    for server in servers:
        server.asked = []  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
    a, b = (server.server_address[1] for server in servers)
    yield write(tmp_path, "kubeconfig", f"""apiVersion: v1
kind: Config
clusters:
- {{name: a, cluster: {{server: "http://127.0.0.1:{a}"}}}}
- {{name: b, cluster: {{server: "http://127.0.0.1:{b}"}}}}
users: [{{name: u, user: {{token: x}}}}]
contexts:
- {{name: a, context: {{cluster: a, user: u, namespace: team-a}}}}
- {{name: b, context: {{cluster: b, user: u, namespace: team-b}}}}
current-context: a
"""), servers[0].asked, servers[1].asked  # type: ignore[attr-defined]
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("command", ["status", "upgrade-check"])
def test_context_picks_the_cluster_and_its_namespace_as_kubectls_does(
        two_clusters: tuple[str, list[str], list[str]], command: str) -> None:
    """`kubectl hybridserving status --context b`: kubectl refuses its own flags before a plugin's name."""
    config, asked_a, asked_b = two_clusters
    code, out = run(command, "nope", "--context", "b", "--kubeconfig", config)
    assert (code, out.splitlines()[0]) == (1, "error: HybridServing nope not found in namespace team-b"), out
    assert asked_a == [] and asked_b and all("/namespaces/team-b/" in p for p in asked_b), (asked_a, asked_b)
    asked_b.clear()
    code, out = run(command, "nope", "--context", "b", "-n", "team-c", "--kubeconfig", config)
    assert out.splitlines()[0] == "error: HybridServing nope not found in namespace team-c", "-n wins"
    asked_b.clear()
    code, out = run(command, "nope", "--kubeconfig", config)
    assert out.splitlines()[0] == "error: HybridServing nope not found in namespace team-a", "the current context"
    assert asked_a and not asked_b


@pytest.mark.parametrize("command", ["status", "upgrade-check"])
def test_a_context_the_kubeconfig_does_not_have_is_an_error_naming_the_ones_it_has(
        two_clusters: tuple[str, list[str], list[str]], command: str) -> None:
    config, asked_a, asked_b = two_clusters
    code, out = run(command, "--context", "c", "--kubeconfig", config)
    assert (code, out) == (1, f"error: the kubeconfig from {config} has no context c\n"
                              "  fix: pass --context with one of: a, b (kubectl config get-contexts)\n")
    assert asked_a == asked_b == []


def test_a_context_outside_a_pod_s_service_account_asks_for_the_kubeconfig(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    code, out = run("status", "--context", "b")
    assert code == 1 and out.startswith("error: cannot load the kubeconfig from $KUBECONFIG or ~/.kube/config: "), out


def upgrade_check_json(*argv: str) -> dict[str, str]:
    code, out = run("upgrade-check", "-o", "json", *argv)
    assert code == 1
    return json.loads(out)["error"]


def test_upgrade_check_o_json_writes_every_error_as_a_json_object(apiserver: str, tmp_path: Path) -> None:
    """A script runs `json.load` on the output whatever happened: an error is an object with the
    `error` key, a check that ran a list."""
    error = upgrade_check_json("nope", "-n", "team-a", "--kubeconfig", apiserver)
    assert error == {"path": None, "message": "HybridServing nope not found in namespace team-a",
                     "fix": "check the name and -n; `kubectl get hybridservings -n team-a` lists them"}
    error = upgrade_check_json("-n", "nocrd", "--kubeconfig", apiserver)
    assert error["message"].startswith("the cluster does not serve HybridServings: ")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    error = upgrade_check_json("-A", "--kubeconfig", kubeconfig(tmp_path, port))
    assert "Connection refused" in error["message"] and error["fix"].startswith("check the cluster is up")
    error = upgrade_check_json("--kubeconfig", str(tmp_path / "none"))
    assert error["message"].startswith(f"cannot load the kubeconfig from {tmp_path / 'none'}: ")
    assert upgrade_check_json("t", "-A") == {"path": None, "message": "a fleet name needs its namespace",
                                             "fix": "give -n NAMESPACE instead of -A"}
    values = write(tmp_path, "values.yaml", "enginePolicy: {allowHostNetwrk: true, allowIpcLock: 'yes'}\n")
    error = upgrade_check_json("-f", values, "--kubeconfig", str(tmp_path / "none"))
    first = error["issues"][0]
    assert (error["path"], error["message"], error["fix"]) == (
        f"--values {values}: {first['path']}", first["message"], first["fix"]), error
    assert sorted(i["path"] for i in error["issues"]) == ["enginePolicy.allowHostNetwrk", "enginePolicy.allowIpcLock"]
    assert {i["source"] for i in error["issues"]} == {values}
