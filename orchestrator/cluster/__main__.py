"""``python -m orchestrator.cluster --nats URL``: a bare fleet worker (no HTTP API).

It pulls runs like any daemon of the fleet and prints ``ready <name>`` once it has joined;
the tests kill it with SIGKILL to show that its runs survive it. ``--scenario FILE`` adds
scenarios to the embedded simulator (repeatable).
"""

from __future__ import annotations

import argparse

import anyio

from orchestrator.cluster.node import ClusterNode
from orchestrator.cluster.settings import ClusterSettings
from orchestrator.config import Config
from orchestrator.sim import find_scenario


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.cluster")
    parser.add_argument("--nats", required=True, help="the NATS URL, nats://host:port")
    parser.add_argument("--name", help="this worker's name in the fleet")
    parser.add_argument("--scenario", action="append", default=[], help="a scenario file")
    parser.add_argument("--ack-wait", type=float, default=30.0, help="seconds")
    parser.add_argument("--node-ttl", type=float, default=15.0, help="seconds")
    parser.add_argument("--prefix", help="a separate fleet on the same NATS (names derive from it)")
    args = parser.parse_args(argv)
    settings = ClusterSettings(
        nats_url=args.nats,
        ack_wait_seconds=args.ack_wait,
        node_ttl_seconds=args.node_ttl,
    )
    if args.prefix:
        settings = settings.named(args.prefix)
    scenarios = [find_scenario(path) for path in args.scenario]
    node = ClusterNode(Config(), settings, name=args.name, scenarios=scenarios)

    async def serve() -> None:
        async with node.running():
            print(f"ready {node.name}", flush=True)
            await anyio.sleep_forever()

    anyio.run(serve)


if __name__ == "__main__":
    main()
