"""Deployment: a real loopback federation with TLS and SuperNode authentication; compose files.

The end-to-end test starts ``flower-superlink`` (TLS, ``--enable-supernode-auth``, Control API
on loopback) and the Fleet-only gateway (``fedowen_deploy.gateway``) that the devices reach,
registers
three SuperNode keys with ``flwr supernode register``, starts the three ``flower-supernode``s,
runs FedOwen for two rounds with ``flwr run`` and reads the status back from ``flwr list``.
A fourth SuperNode whose key was never registered must be refused, and an outsider holding
``ca.crt`` must be refused listing nodes and runs, registering its key, unregistering site-0
and submitting a run through the devices' address. Every process is stopped by
its pid when the ``SecureSuperLink`` context exits, also when an assertion fails.

The compose files are checked without a Docker engine: structure, images pinned to the
installed flwr, and every ``--flag`` in a command exists in the installed binary's ``--help``.
``docker compose config`` (or Debian's ``docker-compose config``) runs in addition where a
compose client exists. The compose deployment itself runs in containers in
``tests/test_docker_deployment.py`` (marker ``docker``, opt-in).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import time
from functools import cache
from pathlib import Path
from typing import Any

import flwr
import pytest
import tomli_w
import yaml

from fedowen_deploy.gateway import allowed
from fedowen_deploy.launcher import APP_DIR, BIN, flower_env, flwr_run
from fedowen_deploy.rehearsal import SecureSuperLink, make_certs, node_config, rehearsal_config
from server_app.store.records import read_rounds
from tests.compose_federation import compose_command

DOCKER = APP_DIR / "docker"
COMPOSE_FILES = sorted(DOCKER.glob("compose*.yml"))
OVERRIDES = {"compose.edge.yml": "compose.yml"}  # override file -> the file it extends
NUM_NODES = 3
# What flwr 1.41-1.42 do with a key they do not know: the SuperLink answers activate-node with
# HTTP 412 / ApiError 2004 and logs the line below; the SuperNode does not retry, it logs
# "Exit Code: 305 ... [code: 2004] Failed to activate SuperNode." and exits with status 1.
REFUSED_NODE_LOG = ("Exit Code: 305", "[code: 2004] Failed to activate SuperNode")
REFUSED_LINK_LOG = "No SuperNode found with the given public key"


@pytest.mark.e2e
def test_tls_authenticated_deployment_runs_fedowen(shared_data_dir: Path, tmp_path: Path
                                                   ) -> None:
    # Prepare: certificates and 4 key pairs, of which only 3 get registered
    certs = make_certs(tmp_path / "certs", NUM_NODES + 1)
    keys = [certs / "supernodes" / f"site-{i}" for i in range(NUM_NODES + 1)]
    out = tmp_path / "out"
    run_config = {"dataset": "mnist", "data-dir": str(shared_data_dir), "output-dir": str(out),
                  "num-server-rounds": 2, "clients-per-round": NUM_NODES,
                  "client-max-samples": 100, "test-max-samples": 500, "valuation": "owen"}
    with SecureSuperLink(tmp_path / "flwr-home", certs) as link:
        registered = link.register(*(k.with_suffix(".pub") for k in keys[:NUM_NODES]))
        nodes = [link.start_supernode(k.name, k, node_config(i, NUM_NODES, k.name))
                 for i, k in enumerate(keys[:NUM_NODES])]
        intruder = link.start_supernode("unregistered", keys[NUM_NODES],
                                        node_config(0, NUM_NODES, "intruder"))

        # Execute
        intruder_status = intruder.wait_for_exit(timeout=60)
        online = link.wait_online(NUM_NODES)
        # an outsider with ca.crt and the devices' address tries to take the federation over
        outsider = _outsider_steps(tmp_path / "outsider", link.fleet_address, certs / "ca.crt",
                                   keys[NUM_NODES].with_suffix(".pub"), registered["site-0"])
        outcome = flwr_run(link, run_config, timeout=600)

        # Assert (inside the context: the logs and the SuperLink are still there)
        assert intruder_status == 1, f"status {intruder_status}:\n{intruder.log_text()}"
        assert all(line in intruder.log_text() for line in REFUSED_NODE_LOG), intruder.log_text()
        assert REFUSED_LINK_LOG in link.processes[0].log_text()
        assert outsider == dict.fromkeys(outsider, ""), f"outsider steps not refused: {outsider}"
        gateway_log = next(p for p in link.processes if p.name == "gateway").log_text()
        assert gateway_log.count("refused POST /v1/control/") >= len(outsider), gateway_log
        listed = json.loads(link.flwr("supernode", "list", link.name, "--format",
                                      "json").stdout)["nodes"]
        assert sorted(int(n["node-id"]) for n in listed) == sorted(registered.values())
        assert sorted(int(n["node-id"]) for n in online) == sorted(registered.values())
        assert outcome.ok, f"run {outcome.run_id} ended {outcome.status}:\n{outcome.output[-4000:]}"
        assert all(n.process.poll() is None for n in nodes), "a registered SuperNode died"
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [0, 1, 2]
    sites = {f"site-{i}" for i in range(NUM_NODES)}
    assert all(set(r["returned"]) == sites for r in rounds[1:])
    with (out / "ledger.csv").open() as fh:
        ledger = list(csv.DictReader(fh))
    assert {row["client_id"] for row in ledger} == sites
    assert sorted({int(row["round"]) for row in ledger}) == [1, 2]
    assert (out / "final_model.pt").is_file() and (out / "summary.json").is_file()
    # Every process the context started is gone (also those Flower detached)
    assert all(p.process.poll() is not None for p in link.processes)


def _outsider_steps(home: Path, address: str, ca: Path, own_key: Path, victim: int
                    ) -> dict[str, str]:
    """The outsider's steps with only ``ca.crt`` and the devices' address, run concurrently:
    step -> the CLI's output, or "" when the step was refused."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(tomli_w.dumps({"superlink": {
        "default": "target", "target": {"address": address, "root-certificates": str(ca)}}}))
    steps = {"list nodes": ["supernode", "list"], "list runs": ["list"],
             "register a key": ["supernode", "register", str(own_key)],
             "unregister site-0": ["supernode", "unregister", str(victim)],
             "submit a run": ["run", str(APP_DIR)]}
    procs = {step: subprocess.Popen([str(BIN / "flwr"), *args, "target", "--format", "json"],
                                    env=flower_env(home), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for step, args in steps.items()}
    results = {}
    for step, proc in procs.items():
        out, _ = proc.communicate(timeout=120)
        # flwr exits 0 with --format json; the reply says whether it worked. A refusal must
        # come from the gateway (403), not from some other failure.
        refused = (proc.returncode != 0 or '"success": false' in out) and "Forbidden" in out
        results[step] = "" if refused and '"success": true' not in out else out
    return results


@pytest.mark.parametrize(("method", "path", "ok"), [
    ("POST", "/v1/fleet/pull-messages", True),
    ("POST", "/v1/fleet/activate-node", True),
    ("POST", "/v1/control/list-nodes", False),
    ("POST", "/v1/runtime/pull-messages", False),
    ("GET", "/v1/fleet/pull-messages", False),
    ("POST", "/v1/fleet/../control/list-nodes", False),
    ("POST", "/v1/fleet/%2e%2e/control/start-run", False),
    ("POST", "/v1/fleet//control", False),
    ("GET", "/docs", False),
])
def test_gateway_allows_fleet_routes_only(method: str, path: str, ok: bool) -> None:
    assert allowed(method, path) is ok


def test_make_certs_writes_a_verifiable_chain_and_ssh_keys(tmp_path: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    # Execute
    certs = make_certs(tmp_path / "certs", 2, prefix="edge-")
    # Assert: the SuperLink cert is signed by the CA and names the loopback and compose hosts
    ca = x509.load_pem_x509_certificate((certs / "ca.crt").read_bytes())
    link = x509.load_pem_x509_certificate((certs / "superlink.crt").read_bytes())
    link.verify_directly_issued_by(ca)
    san = link.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"localhost", "superlink", "fleet-gateway"} <= set(
        san.get_values_for_type(x509.DNSName))
    assert "127.0.0.1" in {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    # SuperNode keys: OpenSSH EC keys on a NIST curve, private key matching public key
    for name in ("edge-0", "edge-1"):
        private = load_ssh_private_key((certs / "supernodes" / name).read_bytes(), None)
        public = load_ssh_public_key((certs / "supernodes" / f"{name}.pub").read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert isinstance(public, ec.EllipticCurvePublicKey)
        assert private.public_key().public_numbers() == public.public_numbers()
        assert public.curve.name == "secp384r1"
    # A second call keeps what exists (a CA must not change under registered SuperNodes)
    before = (certs / "ca.crt").read_bytes()
    make_certs(certs, 2, prefix="edge-")
    assert (certs / "ca.crt").read_bytes() == before


# --- compose files -------------------------------------------------------------------------


@cache
def _help_flags(binary: str) -> frozenset[str]:
    """The ``--long-flags`` the installed ``binary --help`` documents."""
    out = subprocess.run([str(BIN / binary), "--help"], capture_output=True, text=True,
                         timeout=60, check=False).stdout
    return frozenset(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", out))


def _compose(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict), path
    return data


def _entrypoint(image: str) -> str | None:
    """The binary a Flower image runs: flwr/superlink -> flower-superlink, etc."""
    match = re.fullmatch(r"flwr/(superlink|supernode|superexec):(.+)", image)
    return f"flower-{match.group(1)}" if match else None


def test_compose_files_exist() -> None:
    names = {p.name for p in COMPOSE_FILES}
    assert {"compose.yml", "compose.superlink.yml", "compose.supernode.yml"} <= names, names
    assert (DOCKER / "Dockerfile").is_file()


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_flags_exist_in_installed_flower(path: Path) -> None:
    # Prepare
    data = _compose(path)
    checked = 0
    for name, service in data["services"].items():
        assert isinstance(service, dict), f"{path.name}: service {name} is not a mapping"
        image = _built_image(service, path) or service.get("image")
        assert image, f"{path.name}: service {name} has neither image nor build"
        binary = _entrypoint(image)
        if binary is None or "entrypoint" in service:
            continue
        # Images are pinned to the flwr version this project runs and tests (an arch's tag:
        # VERSION-ARCH, scripts/docker-images.sh)
        assert re.search(rf":{re.escape(flwr.__version__)}(-amd64|-arm64)?$", image), \
            f"{name}: {image} != {flwr.__version__}"
        command = service.get("command", [])
        assert isinstance(command, list), f"{name}: write command as a YAML list"
        flags = {arg.split("=")[0] for arg in command if str(arg).startswith("--")}
        # Execute / Assert: every flag is one the installed binary documents
        unknown = flags - _help_flags(binary)
        assert not unknown, f"{path.name}: {name} passes {sorted(unknown)} unknown to {binary}"
        # every file a command names under /certs is mounted into the container
        targets = _mount_targets(service)
        missing = [a for a in command if str(a).startswith("/certs/") and a not in targets]
        assert not missing, f"{path.name}: {name} names {missing} but mounts only {targets}"
        checked += 1
    assert checked >= {"compose.yml": 8, "compose.superlink.yml": 2}.get(path.name, 2)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_uses_tls_and_supernode_auth(path: Path) -> None:
    for name, svc in _compose(path)["services"].items():
        cmd = [str(a) for a in svc.get("command", [])]
        if name == "superlink":
            assert "--insecure" not in cmd and "--enable-supernode-auth" in cmd
            assert {"--ssl-ca-certfile", "--ssl-certfile", "--ssl-keyfile"} <= set(cmd)
            assert cmd[cmd.index("--isolation") + 1] == "process"
            assert "--disable-runtime-dependency-installation" in cmd
        elif name.startswith("supernode"):
            assert "--insecure" not in cmd
            assert {"--root-certificates", "--auth-supernode-private-key"} <= set(cmd)
            assert cmd[cmd.index("--isolation") + 1] == "process"
        elif name == "superexec-serverapp":
            assert "--root-certificates" in cmd and "--insecure" not in cmd
            assert cmd[cmd.index("--runtime-api-address") + 1].startswith("superlink:")


@pytest.mark.parametrize("name", ["compose.yml", "compose.superlink.yml"])
def test_compose_keeps_the_control_api_off_the_devices_network(name: str) -> None:
    services = _compose(DOCKER / name)["services"]
    # the SuperLink's port (Control API included) is published on the host's loopback only;
    # the one port open to the devices is the Fleet-only gateway's
    assert all(str(p).startswith("127.0.0.1:") for p in services["superlink"]["ports"])
    public = {k for k, v in services.items() for p in v.get("ports", [])
              if not str(p).startswith("127.0.0.1:")}
    assert public == {"fleet-gateway"}
    gateway = services["fleet-gateway"]
    assert gateway["entrypoint"] == ["python", "-m", "fedowen_deploy.gateway"]
    flags = {a for a in gateway["command"] if str(a).startswith("--")}
    gateway_help = subprocess.run([str(BIN / "python"), "-m", "fedowen_deploy.gateway", "--help"],
                                  capture_output=True, text=True, cwd=APP_DIR, timeout=60,
                                  check=False).stdout
    assert all(flag in gateway_help for flag in flags), (flags, gateway_help)
    # SuperNodes dial the gateway and share no network with the SuperLink
    for key, svc in services.items():
        if key.startswith("supernode-"):
            cmd = svc["command"]
            assert cmd[cmd.index("--superlink") + 1] == "fleet-gateway:8000"
            assert "control" not in svc["networks"]
    assert services["superlink"]["networks"] == ["control"]


def test_compose_supernodes_have_own_partition_client_id_and_superexec() -> None:
    # Parsed with Flower's own --node-config parser, so the quoting is what flwr accepts
    from flwr.common.config import parse_config_args

    services = _compose(DOCKER / "compose.yml")["services"]
    supernodes = {k: v for k, v in services.items() if k.startswith("supernode-")}
    configs = []
    for name, svc in supernodes.items():
        cmd = svc["command"]
        configs.append(parse_config_args([cmd[cmd.index("--node-config") + 1]]))
        key = cmd[cmd.index("--auth-supernode-private-key") + 1]
        assert any(v.endswith(f"/{configs[-1]['client-id']}:{key}:ro") for v in svc["volumes"])
        exec_cmd = services[name.replace("supernode", "superexec-clientapp")]["command"]
        assert exec_cmd[exec_cmd.index("--runtime-api-address") + 1].startswith(f"{name}:")
    assert sorted(c["partition-id"] for c in configs) == list(range(NUM_NODES))
    assert {c["num-partitions"] for c in configs} == {NUM_NODES}
    assert sorted(c["client-id"] for c in configs) == [f"site-{i}" for i in range(NUM_NODES)]


def test_node_config_string_round_trips_through_flower_parser() -> None:
    from flwr.common.config import parse_config_args

    parsed = parse_config_args([node_config(2, 5, "hospital-b")])
    assert parsed == {"partition-id": 2, "num-partitions": 5, "client-id": "hospital-b"}


def _mount_targets(service: dict[str, Any]) -> set[str]:
    """Container paths of a service's volumes (``${VAR:-a:b}`` sources may hold colons)."""
    targets = set()
    for volume in service.get("volumes", []):
        parts = re.sub(r"\$\{[^}]*\}", "SRC", str(volume)).split(":")
        targets.add(parts[1] if len(parts) > 1 else parts[0])
    return targets


def _built_image(service: dict[str, Any], path: Path) -> str | None:
    """For a service built from our Dockerfile, the FROM image it is based on."""
    build = service.get("build")
    if build is None:
        return None
    context = build if isinstance(build, str) else build.get("context", ".")
    dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
    text = (path.parent / context / dockerfile).read_text()
    version = re.search(r"ARG FLWR_VERSION=(\S+)", text)
    base = re.search(r"^FROM (\S+)", text, re.MULTILINE)
    assert version and base, f"{dockerfile}: no FLWR_VERSION default or FROM line"
    # ARCH_SUFFIX defaults to "" (the host's architecture): the plain tag
    return base.group(1).replace("${FLWR_VERSION}", version.group(1)).replace("${ARCH_SUFFIX}", "")


@pytest.mark.skipif(not compose_command(),
                    reason="no `docker compose` or `docker-compose` here (the YAML checks above "
                           "still ran)")
@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_docker_compose_config_validates(path: Path) -> None:
    # Compose v1 (Debian's docker-compose 1.29) rejected a top-level `name:`; both must accept
    started = time.monotonic()
    # an override file (compose.edge.yml) is valid on top of the file it extends
    files = [*(["-f", str(DOCKER / OVERRIDES[path.name])] if path.name in OVERRIDES else []),
             "-f", str(path)]
    proc = subprocess.run([*compose_command(), *files, "config", "--quiet"],
                          cwd=DOCKER, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"{path.name} ({time.monotonic() - started:.0f}s): {proc.stderr}"


def test_a_rehearsal_asks_no_more_clients_a_round_than_it_starts() -> None:
    # the README's `--nodes 3 --set num-server-rounds=2` waited for 10 nodes and failed
    assert rehearsal_config(["num-server-rounds=2"], 3) == {"num-server-rounds": 2,
                                                            "clients-per-round": 3}
    assert rehearsal_config([], 30)["clients-per-round"] == 10
    assert rehearsal_config(["clients-per-round=2", "dataset=cifar10"], 3) == {
        "clients-per-round": 2, "dataset": "cifar10"}

