"""Checks shared by the examples' Kubernetes tests (swe, llm_in_sandbox): the agents' egress
NetworkPolicy and the agent image's Dockerfile."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.examples.stack import EXAMPLES, EXAMPLES_PYTHON


def check_egress_only_to_gateway_and_dns(policy: dict[str, Any], role: str) -> None:
    """The policy selects the pods of `role`, admits no connection to them, and lets them reach the
    Gateway's pods on 8181 and the cluster's DNS, nothing else."""
    assert policy["kind"] == "NetworkPolicy" and policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == {"agentlightning.io/role": role}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["ingress"] == []  # nothing connects to an agent
    gateway, dns = spec["egress"]
    (to_gateway,) = gateway["to"]
    assert to_gateway["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "agl-server"}
    assert gateway["ports"] == [{"protocol": "TCP", "port": 8181}]
    (to_dns,) = dns["to"]
    assert to_dns["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    assert {p["port"] for p in dns["ports"]} == {53}
    # No rule without `to` or with an ipBlock: either would open egress to other addresses.
    assert all(
        rule.get("to") and all("ipBlock" not in peer for peer in rule["to"]) for rule in spec["egress"]
    )


def check_dockerfile(folder: Path) -> None:
    """hadolint clean, and every COPY source (relative to the repository root) exists."""
    hadolint = EXAMPLES_PYTHON.parent / "hadolint"
    assert hadolint.exists(), f"{hadolint} is missing: `make examples-venv` installs it (extra examples_lint)"
    result = subprocess.run([str(hadolint), "Dockerfile"], cwd=folder, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for line in (folder / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            *sources, _ = line.split()[1:]
            for source in sources:
                assert list(EXAMPLES.parent.glob(source)), f"Dockerfile: {source} matches nothing"
