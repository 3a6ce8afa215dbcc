"""The agents' egress NetworkPolicy for a Gateway outside the cluster (run_minikube.sh).

`network-policy.yaml` admits egress to the Gateway's pods only; when the Gateway runs on the host
(minikube reaches it as host.minikube.internal), no pod selector can name it: this prints the same
policy with the Gateway rule as an ipBlock of that one address and port, as JSON for
`kubectl apply -f -`.

    python -m examples.swe.policy --gateway-ip 192.168.49.1 --port 8181
"""

from __future__ import annotations

import argparse
import ipaddress
import json
from pathlib import Path
from typing import Any

import yaml

POLICY = Path(__file__).resolve().parent / "network-policy.yaml"


def host_gateway_policy(gateway_ip: str, port: int) -> dict[str, Any]:
    """network-policy.yaml with egress to `gateway_ip:port` (one address) instead of the Gateway's pods."""
    address = ipaddress.ip_address(gateway_ip)  # ValueError on anything else: never a wider block
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a TCP port")
    policy = yaml.safe_load(POLICY.read_text())
    gateway = policy["spec"]["egress"][0]
    gateway["to"] = [{"ipBlock": {"cidr": f"{address}/{address.max_prefixlen}"}}]
    gateway["ports"] = [{"protocol": "TCP", "port": port}]
    policy["metadata"]["name"] += "-host-gateway"
    return policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m examples.swe.policy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--gateway-ip", required=True, help="the Gateway's address as the pods reach it")
    parser.add_argument("--port", type=int, default=8181, help="the Gateway's port (8181)")
    args = parser.parse_args(argv)
    try:
        policy = host_gateway_policy(args.gateway_ip, args.port)
    except ValueError as exc:
        parser.error(str(exc))
    print(json.dumps(policy, indent=2))


if __name__ == "__main__":
    main()
