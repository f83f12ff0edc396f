"""Who may talk to a server, without a running one: the access flags, the per-request guard (Host,
Origin, API keys, key files that rotate), the graph's input limits and ORT's messages cleaned."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

import ortpilot
from ortpilot.errors import InputError, UsageError
from ortpilot.serve import guard as guardmod
from ortpilot.serve.access import access_options, digest
from ortpilot.serve.guard import Guard, bearer, host_name
from ortpilot.serve.oip.limits import input_limits
from ortpilot.serve.ortmessage import clean_ort_message


def _guard(**kwargs) -> Guard:
    host = kwargs.pop("host", "127.0.0.1")
    return Guard(access_options(**kwargs).policy(host))


def _auth(key: str | None, **extra) -> dict[str, str]:
    return {"host": "127.0.0.1:8000", **({"authorization": f"Bearer {key}"} if key else {}), **extra}


def test_keys_never_travel_only_their_digests(tmp_path) -> None:
    keyfile = tmp_path / "keys"
    keyfile.write_text("# one per line\nfrom-the-file\n\n")
    options = access_options(["s3cret-literal"], str(keyfile))
    policy = options.policy("127.0.0.1")
    assert "s3cret-literal" not in repr(options) and "s3cret-literal" not in repr(policy)
    assert "from-the-file" not in repr(policy)
    assert policy.digests == (digest("s3cret-literal"),) and policy.key_file == str(keyfile.resolve())
    assert options.client_headers() == {"Authorization": "Bearer s3cret-literal"}


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"api_keys": ["has space"]}, "visible ASCII"),
        ({"api_keys": [""]}, "visible ASCII"),
        ({"api_key_file": "/no/such/keys"}, "Cannot read the API key file"),
        ({"cors_origins": ["app.example.com"]}, "is not an origin"),
        ({"cors_origins": ["https://app.example.com/path"]}, "is not an origin"),
        ({"allowed_hosts": ["a b"]}, "is not a host name"),
    ],
)
def test_bad_access_flags_are_usage_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        access_options(**kwargs)


def test_an_empty_key_file_is_refused_before_anything_starts(tmp_path) -> None:
    (tmp_path / "keys").write_text("# nothing yet\n")
    with pytest.raises(UsageError, match="holds no key"):
        access_options(api_key_file=str(tmp_path / "keys"))


def test_a_public_address_without_a_key_is_warned_about() -> None:
    assert access_options().warnings("0.0.0.0") and "--api-key" in access_options().warnings("0.0.0.0")[0]
    assert access_options().warnings("127.0.0.1") == []
    assert access_options(["k"]).warnings("0.0.0.0") == []


def test_the_key_is_checked_on_every_route_but_health() -> None:
    guard = _guard(api_keys=["right-key"])
    assert guard.http("GET", _auth("right-key")) is None
    for headers in (_auth(None), _auth("wrong-key"), {"host": "127.0.0.1", "authorization": "Basic right-key"}):
        verdict = guard.http("POST", headers)
        assert verdict.status == 401 and verdict.headers == {"WWW-Authenticate": "Bearer"}
        assert "right-key" not in verdict.message and "wrong-key" not in verdict.message
    assert guard.http("GET", _auth(None), health=True) is None
    assert _guard(api_keys=["right-key"], auth_health=True).http("GET", _auth(None), health=True).status == 401
    assert _guard().http("GET", _auth(None)) is None  # no keys: no authentication


def test_grpc_metadata_carries_the_key() -> None:
    class Context:
        def __init__(self, metadata):
            self.metadata = metadata

        def invocation_metadata(self):
            return self.metadata

    guard = _guard(api_keys=["right-key"])
    assert guard.grpc(Context([("authorization", "Bearer right-key")])) is None
    assert guard.grpc(Context([("application", "m")])).status == 401
    assert guard.grpc(Context([]), health=True) is None
    assert guard.grpc(None) is None  # a handle call from the server-wide application, which checked it


def test_a_key_file_rotates_without_a_restart(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(guardmod, "RECHECK_S", 0.0)
    keyfile = tmp_path / "keys"
    keyfile.write_text("old-key\n")
    guard = _guard(api_keys=["literal"], api_key_file=str(keyfile))
    assert guard.http("GET", _auth("old-key")) is None
    replacement = tmp_path / "keys.new"
    replacement.write_text("new-key\n")
    os.replace(replacement, keyfile)  # how a key file is rotated: a new file renamed over the old one
    assert guard.http("GET", _auth("new-key")) is None
    assert guard.http("GET", _auth("old-key")).status == 401
    keyfile.unlink()  # a file that cannot be read keeps the keys read last
    assert guard.http("GET", _auth("new-key")) is None
    keyfile.write_text("# emptied\n")
    time.sleep(0.01)
    assert guard.http("GET", _auth("new-key")).status == 401  # an emptied file revokes its keys
    assert guard.http("GET", _auth("literal")) is None


def test_host_names_against_dns_rebinding() -> None:
    guard = _guard()
    for host in ("127.0.0.1:8000", "localhost", "LOCALHOST:1", "[::1]:8000"):
        assert guard.http("GET", {"host": host}) is None, host
    for host in ("evil.example:8000", "127.0.0.1.evil.example", ""):
        assert guard.http("GET", {"host": host}).status == 403, host
    assert _guard(allowed_hosts=["models.internal"]).http("GET", {"host": "models.internal:8000"}) is None
    assert _guard(host="0.0.0.0").http("GET", {"host": "anything.example"}) is None
    assert _guard(host="0.0.0.0", allowed_hosts=["a.example"]).http("GET", {"host": "b.example"}).status == 403
    assert host_name("[::1]:80") == "::1" and host_name("Example.COM:80") == "example.com"


def test_browser_origins_need_the_allow_list() -> None:
    guard = _guard(api_keys=["k"], cors_origins=["https://app.example"])
    other = guard.http("POST", _auth("k", origin="https://evil.example"))
    assert other.status == 403 and other.code == "origin_not_allowed"
    preflight = guard.http(
        "OPTIONS", {"host": "127.0.0.1", "origin": "https://app.example", "access-control-request-method": "POST"}
    )
    assert preflight.status == 204  # answered without a key: a browser sends none on a preflight
    assert preflight.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "authorization" in preflight.headers["Access-Control-Allow-Headers"]
    assert guard.http("POST", _auth("k", origin="https://app.example")) is None
    assert guard.cors_headers({"origin": "https://app.example"})["Vary"] == "Origin"
    assert guard.cors_headers({"origin": "https://evil.example"}) == {}
    assert _guard().http("GET", {"host": "127.0.0.1", "origin": "https://app.example"}).status == 403


def test_bearer_parsing() -> None:
    assert bearer("Bearer abc") == "abc" and bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None and bearer("Bearer") is None and bearer(None) is None


def test_the_graph_tells_the_positions_and_table_rows(demo_paths) -> None:
    from ortpilot.modelio import load_model

    limits = input_limits(load_model(demo_paths["encoder"], load_external_data=False))
    assert limits.positions == 512 and limits.rows == {"input_ids": 1000, "token_type_ids": 2}
    sess = ortpilot.load(str(demo_paths["encoder"]), ["cpu"], "strict")
    ones = {i.name: np.ones((1, 8), np.int64) for i in sess.inputs}
    limits.check(ones)
    sess.run(None, ones)  # within the limits ORT runs it
    for feeds, words in (
        ({i.name: np.ones((1, 600), np.int64) for i in sess.inputs}, "'input_ids' has 600 positions"),
        ({**ones, "input_ids": np.full((1, 8), 1000, np.int64)}, "holds 1000, but the model looks its values up in"),
        ({**ones, "token_type_ids": np.full((1, 8), -3, np.int64)}, "'token_type_ids' holds -3"),
    ):
        with pytest.raises(InputError, match=words):
            limits.check(feeds)
        with pytest.raises(ortpilot.OrtpilotError) as info:  # ORT's own refusal, cleaned for a client
            sess.run(None, feeds)
        cleaned = clean_ort_message(str(info.value))
        assert "onnxruntime_src" not in cleaned and "Name:'" not in cleaned and ".cc:" not in cleaned, cleaned
        assert "\n" not in cleaned and " node: " in cleaned, cleaned


def test_the_fused_graph_tells_the_same_limits(demo_paths) -> None:
    """ORT's BERT fusion folds the embedding Gathers into EmbedLayerNormalization (what tune picks
    on some CPUs): the limits, and so the server's 400s, must not depend on which graph was tuned."""
    from ortpilot.modelio import load_model
    from ortpilot.passes.fusion import FusionPass

    fused = FusionPass("bert").run(demo_paths["encoder"]).model
    assert "EmbedLayerNormalization" in {n.op_type for n in fused.graph.node}
    assert "Gather" not in {n.op_type for n in fused.graph.node}
    assert input_limits(fused) == input_limits(load_model(demo_paths["encoder"], load_external_data=False))
    sess = ortpilot.load(fused.SerializeToString(), ["cpu"], "strict")
    ones = {i.name: np.ones((1, 8), np.int64) for i in sess.inputs}
    with pytest.raises(
        InputError, match="'input_ids' holds 1000, but the model looks its values up in a table of 1000"
    ):
        input_limits(fused).check({**ones, "input_ids": np.full((1, 8), 1000, np.int64)})
    with pytest.raises(ortpilot.OrtpilotError, match="EmbedLayerNormalization"):  # what ORT alone says
        sess.run(None, {**ones, "input_ids": np.full((1, 8), 1000, np.int64)})


def test_the_cli_warns_about_a_public_address_without_a_key_and_keeps_keys_out_of_manifests(tmp_path) -> None:
    import socket

    from click.testing import CliRunner

    from ortpilot.cli.main import cli

    with socket.socket() as sock:  # a taken port: the command stops (exit 2) right after its warnings
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = str(sock.getsockname()[1])
        warned = CliRunner().invoke(cli, ["serve", "demo:mlp", "--host", "0.0.0.0", "--port", port])
        keyed = CliRunner().invoke(cli, ["serve", "demo:mlp", "--host", "0.0.0.0", "--port", port, "--api-key", "k"])
    assert warned.exit_code == 2 and "accepts connections from other machines" in " ".join(warned.output.split())
    assert keyed.exit_code == 2 and "other machines" not in keyed.output
    manifest = CliRunner().invoke(
        cli, ["serve", "demo:mlp", "--api-key", "k", "--emit-rayservice", str(tmp_path / "m.yaml")]
    )
    assert manifest.exit_code == 2 and "does not carry" in manifest.output and not (tmp_path / "m.yaml").exists()
    bad = CliRunner().invoke(cli, ["serve", "demo:mlp", "--api-key-file", str(tmp_path / "none")])
    assert bad.exit_code == 2 and "Cannot read the API key file" in bad.output
